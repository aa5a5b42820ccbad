"""Golden cases of the formats layer: element codecs, block quantization, library presets,
packing, scale layouts and block-scaled matmul.

Each case calls the public emulators of :mod:`fp4sim.formats` on NumPy inputs made here from a
fixed seed; none re-implements them. Importing this module registers the cases in
:data:`fp4sim.golden.store.CASES`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fp4sim.golden.store import register


def _case_slug(fmt: Any) -> str:
    return str(fmt).lower()


def _tie_inputs(fmt: Any) -> np.ndarray:
    """Every midpoint between adjacent finite values of ``fmt`` and the next float32 on each side.

    Midpoints of two values of a <= 8-bit format are exact in float32 (one more mantissa bit).
    Signed formats get the mirrored negative inputs too.
    """
    from fp4sim.formats import value_table

    v = np.asarray(value_table(fmt), dtype=np.float64)
    # +0 only: np.unique keeps an unspecified one of +0 and -0 (NumPy 2.5 keeps -0), and the
    # stored vectors start from +0 (-0 comes back through the mirrored negative inputs)
    v = np.unique(v[np.isfinite(v) & (v >= 0) & ~np.signbit(v)])
    mids = ((v[:-1] + v[1:]) / 2).astype(np.float32)
    up = np.nextafter(mids, np.float32(np.inf))
    down = np.nextafter(mids, np.float32(0))
    x = np.concatenate([v.astype(np.float32), mids, up, down])
    if fmt.signed:
        x = np.concatenate([x, -x])
    return x


def _register_format_cases() -> None:
    from fp4sim.formats import spec

    roundings = [r for r in spec.Rounding if r is not spec.Rounding.STOCHASTIC]
    for fmt in spec.ALL_FORMATS:
        slug = _case_slug(fmt)

        def all_codes(fmt=fmt) -> dict[str, np.ndarray]:
            from fp4sim.formats import all_codes as _all_codes
            from fp4sim.formats import decode

            codes = np.asarray(_all_codes(fmt), dtype=np.uint8)
            return {"codes": codes, "values": np.asarray(decode(codes, fmt), dtype=np.float32)}

        register(
            f"formats.{slug}.all_codes",
            description=f"every valid {fmt} code and its float32 value (decode)",
            format=fmt.name,
        )(all_codes)

        def ties(fmt=fmt) -> dict[str, np.ndarray]:
            from fp4sim.formats import Policy, encode

            x = _tie_inputs(fmt)
            out = {"inputs": x}
            for r in roundings:
                out[f"codes_{r.value}"] = np.asarray(
                    encode(x, fmt, Policy(rounding=r)), dtype=np.uint8
                )
            return out

        register(
            f"formats.{slug}.ties",
            description=f"{fmt}: every value, tie midpoint and its float32 neighbours, encoded "
            "under each deterministic rounding (saturating)",
            format=fmt.name,
            roundings=[r.value for r in roundings],
        )(ties)

        def specials(fmt=fmt) -> dict[str, np.ndarray]:
            from fp4sim.formats import NanPolicy, Overflow, Policy, encode

            big = np.float32(
                min(4 * fmt.max, float.fromhex("0x1.8p127"))
            )  # beyond max, finite in float32
            tiny = np.float32(fmt.min_subnormal) / np.float32(4)
            pos = np.array(
                [0.0, tiny, np.float32(2.0**-130), fmt.max, big, np.float32(3e38), np.inf],
                dtype=np.float32,
            )
            x = np.concatenate([pos, -pos]) if fmt.signed else pos
            out = {"inputs": x}
            overflows = (
                [Overflow.SATURATE]
                + ([Overflow.NAN] if fmt.has_nan else [])
                + ([Overflow.INF] if fmt.has_inf else [])
            )
            for o in overflows:
                out[f"codes_overflow_{o.value}"] = np.asarray(
                    encode(x, fmt, Policy(overflow=o)), np.uint8
                )
            nan_in = np.array([np.nan], dtype=np.float32)
            nan_policies = ([NanPolicy.PROPAGATE] if fmt.has_nan else []) + [
                NanPolicy.ZERO,
                NanPolicy.MAX,
            ]
            for n in nan_policies:
                out[f"nan_code_{n.value}"] = np.asarray(
                    encode(nan_in, fmt, Policy(nan=n)), np.uint8
                )
            return out

        register(
            f"formats.{slug}.specials",
            description=f"{fmt}: zeros, tiny, float32-subnormal, max, beyond max and infinite "
            "inputs under each overflow policy; NaN under each NaN policy",
            format=fmt.name,
        )(specials)

    @register(
        "formats.e2m1.stochastic",
        description="E2M1 stochastic rounding of 64 inputs with fixed uint32 random bits",
        format="E2M1",
        seed=20261129,
    )
    def e2m1_stochastic() -> dict[str, np.ndarray]:
        from fp4sim.formats import E2M1, Policy, Rounding, encode

        rng = np.random.default_rng(20261129)
        x = rng.uniform(-7, 7, size=64).astype(np.float32)
        bits = rng.integers(0, 2**32, size=64, dtype=np.uint32)
        codes = encode(x, E2M1, Policy(rounding=Rounding.STOCHASTIC), random_bits=bits)
        return {"inputs": x, "random_bits": bits, "codes": np.asarray(codes, dtype=np.uint8)}


_register_format_cases()


def _block_inputs(seed: int) -> np.ndarray:
    """8 rows × 64 float32 (two 32-blocks per row) with the cases where scale rules disagree.

    Rows: Gaussian; Gaussian × 1e3; amax 500 (E4M3 floor clips); amax 7 (E2M1 floor clips); all zero;
    float32 subnormals (1e-40) with one 2^-130; amax exactly a power of two; amax 1.75·2^k and
    1.5·2^k, the floor rule's clipping edges.
    """
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((8, 64)).astype(np.float32)
    x[1] *= np.float32(1e3)
    x[2, :32] = x[2, :32] / np.abs(x[2, :32]).max() * np.float32(500.0)
    x[3, :32] = x[3, :32] / np.abs(x[3, :32]).max() * np.float32(7.0)
    x[4, :32] = 0.0
    x[4, 32:] = -0.0
    x[5, :32] = np.float32(1e-40) * np.sign(x[5, :32])
    x[5, 32] = np.float32(2.0**-130)
    x[6, :32] = x[6, :32] / np.abs(x[6, :32]).max() * np.float32(4.0)
    x[7, :32] = x[7, :32] / np.abs(x[7, :32]).max() * np.float32(1.75 * 64)
    x[7, 32:] = x[7, 32:] / np.abs(x[7, 32:]).max() * np.float32(1.5 * 64)
    return x


def _quantized_arrays(q: Any) -> dict[str, np.ndarray]:
    from fp4sim.formats.blocks import dequantize

    out = {
        "codes": np.asarray(q.codes, dtype=np.uint8),
        "dequantized": np.asarray(dequantize(q), dtype=np.float32),
    }
    if q.scales is not None:
        out["scales"] = np.asarray(q.scales, dtype=np.uint8)
    if q.global_scale is not None:
        out["global_scale"] = np.asarray(q.global_scale, dtype=np.float32)
    return out


_BLOCK_SEED = 31


def _register_block_cases() -> None:
    from fp4sim.formats import blocks

    pow2_rules = (
        blocks.ScaleRule.FLOOR,
        blocks.ScaleRule.RCEIL,
        blocks.ScaleRule.CEIL,
        blocks.ScaleRule.EVEN,
    )
    plan = [
        (blocks.MXFP8_E4M3, pow2_rules),
        (blocks.MXFP4, pow2_rules),
        (blocks.MXFP8_E5M2, (blocks.ScaleRule.RCEIL,)),
        (blocks.MXFP6_E2M3, (blocks.ScaleRule.RCEIL,)),
        (blocks.MXFP6_E3M2, (blocks.ScaleRule.RCEIL,)),
    ]
    for fmt_name, rules in [(f.name, r) for f, r in plan]:
        for rule in rules:

            def make(fmt_name=fmt_name, rule=rule) -> dict[str, np.ndarray]:
                from fp4sim.formats import blocks

                x = _block_inputs(_BLOCK_SEED)
                q = blocks.quantize(x, getattr(blocks, fmt_name), rule=rule)
                return {"x": x, **_quantized_arrays(q)}

            register(
                f"formats.{fmt_name.lower()}.{rule.name.lower()}",
                description=f"{fmt_name} quantize along the last axis (blocks of 32) with the "
                f"{rule.name} UE8M0 scale rule: codes, scale codes, dequantized values",
                block_format=fmt_name,
                rule=rule.name,
                seed=_BLOCK_SEED,
                shape=[8, 64],
            )(make)

    for fmt_name in ("NVFP4", "NVFP4_SINGLE"):

        def make_nv(fmt_name=fmt_name) -> dict[str, np.ndarray]:
            from fp4sim.formats import blocks

            x = _block_inputs(_BLOCK_SEED)
            x[6, :16] = 0.0
            x[6, 0] = np.float32(2.9)  # the E4M3 block scale rounds down and the max saturates
            return {"x": x, **_quantized_arrays(blocks.quantize(x, getattr(blocks, fmt_name)))}

        register(
            f"formats.{fmt_name.lower()}.default",
            description=f"{fmt_name} quantize along the last axis (blocks of 16, UE4M3 scales"
            f"{', FP32 per-tensor factor' if fmt_name == 'NVFP4' else ''}); row 6 holds "
            "the amax-2.9 block (E4M3 scale rounding clips the max)",
            block_format=fmt_name,
            seed=_BLOCK_SEED,
            shape=[8, 64],
        )(make_nv)

    @register(
        "formats.mxfp4.packed",
        description="MXFP4 (RCEIL) codes packed two per byte, the "
        "even-indexed element in the low nibble",
        block_format="MXFP4",
        seed=_BLOCK_SEED,
        shape=[8, 64],
    )
    def mxfp4_packed() -> dict[str, np.ndarray]:
        from fp4sim.formats import blocks

        x = _block_inputs(_BLOCK_SEED)
        q = blocks.quantize(x, blocks.MXFP4, pack=True)
        return {
            "x": x,
            "packed": np.asarray(q.codes, dtype=np.uint8),
            "scales": np.asarray(q.scales, dtype=np.uint8),
        }

    preset_names = (
        "OCP_MXFP4",
        "OCP_MXFP8_E4M3",
        "TORCHAO_MXFP4_FLOOR",
        "TORCHAO_MXFP8_E4M3_RCEIL",
        "TORCHAO_NVFP4",
        "TORCHAO_NVFP4_SINGLE",
        "TE_MXFP8",
        "TE_NVFP4",
        "JAX_MXFP8",
        "JAX_NVFP4",
    )
    for name in preset_names:

        def preset_case(name=name) -> dict[str, np.ndarray]:
            from fp4sim.formats import blocks, presets

            fmt = presets.preset(name)
            constant = fmt.global_scale is blocks.GlobalScale.CONSTANT
            kw = {"global_scale": np.float32(1.0)} if constant else {}
            x = _block_inputs(_BLOCK_SEED)
            out = {"x": x, **_quantized_arrays(blocks.quantize(x, fmt, **kw))}
            special = _nonfinite_inputs()
            qs = blocks.quantize(special, fmt, **kw)
            out["special_x"] = special
            out["special_codes"] = np.asarray(qs.codes, dtype=np.uint8)
            if qs.scales is not None:
                out["special_scales"] = np.asarray(qs.scales, dtype=np.uint8)
            return out

        register(
            f"formats.presets.{name.lower()}",
            description=f"the {name} preset (a library's quantizer reproduced bit for bit) on the "
            "8x64 disagreement inputs, and on blocks holding NaN, +Inf, -Inf, -0",
            preset=name,
            seed=_BLOCK_SEED,
            shape=[8, 64],
        )(preset_case)


def _nonfinite_inputs() -> np.ndarray:
    """4 rows × 64: a NaN in block 0, +Inf, −Inf, and a block of −0 next to a finite block."""
    x = _block_inputs(_BLOCK_SEED)[:4].copy()
    x[0, 5] = np.nan
    x[1, 40] = np.inf
    x[2, 7] = -np.inf
    x[3, :32] = -0.0
    return x


_register_block_cases()


def _register_storage_cases() -> None:
    from fp4sim.formats import spec

    for fmt in (spec.E2M1, spec.E2M3, spec.E3M2):

        def pack_case(fmt=fmt) -> dict[str, np.ndarray]:
            from fp4sim.formats import NibbleOrder, all_codes, pack

            codes = np.resize(all_codes(fmt), (4, 64)).astype(np.uint8)
            codes[1] = codes[1][::-1]
            out = {"codes": codes}
            orders = list(NibbleOrder) if fmt is spec.E2M1 else [NibbleOrder.INTERLEAVED]
            for order in orders:
                out[f"packed_{order.name.lower()}"] = np.asarray(
                    pack(codes, fmt, order=order), np.uint8
                )
            return out

        register(
            f"formats.{_case_slug(fmt)}.packing",
            description=f"{fmt} codes (4 x 64, every code) packed along the last axis: "
            + (
                "each NibbleOrder (INTERLEAVED = even element in the low nibble)"
                if fmt is spec.E2M1
                else "4 codes in 3 bytes, little-endian bit stream"
            ),
            format=fmt.name,
            shape=[4, 64],
        )(pack_case)

    @register(
        "formats.layouts.scales",
        description="a 200 x 7 uint8 scale matrix in each ScaleLayout "
        "(128x4 swizzle, Mosaic TMEM view, 8x4 swizzle), "
        "zero-padded",
        shape=[200, 7],
    )
    def layouts_case() -> dict[str, np.ndarray]:
        from fp4sim.formats import ScaleLayout, to_layout

        scales = (
            (np.arange(200 * 7, dtype=np.int64) * 37 % 251 + 1).astype(np.uint8).reshape(200, 7)
        )
        out = {"scales": scales}
        for layout in ScaleLayout:
            if layout is not ScaleLayout.PLAIN:
                out[layout.name.lower()] = np.asarray(to_layout(scales, layout), dtype=np.uint8)
        return out


_register_storage_cases()


def _register_matmul_cases() -> None:
    for fmt_name in ("MXFP8_E4M3", "MXFP4", "NVFP4_SINGLE"):

        def matmul_case(fmt_name=fmt_name) -> dict[str, np.ndarray]:
            from fp4sim.formats import blocks, matmul

            rng = np.random.default_rng(_MATMUL_SEED)
            a = rng.standard_normal((16, 128)).astype(np.float32)
            b = rng.standard_normal((8, 128)).astype(np.float32)
            fmt = getattr(blocks, fmt_name)
            qa, qb = blocks.quantize(a, fmt), blocks.quantize(b, fmt)
            out = {
                "a": a,
                "b": b,
                "a_codes": np.asarray(qa.codes, np.uint8),
                "a_scales": np.asarray(qa.scales, np.uint8),
                "b_codes": np.asarray(qb.codes, np.uint8),
                "b_scales": np.asarray(qb.scales, np.uint8),
            }
            A = matmul.Accumulation
            for acc in (A.EXACT, A.FLOAT32, A.HOPPER_FP8):  # TCGEN05: the cases below
                if acc is matmul.Accumulation.HOPPER_FP8 and fmt.elem.nbits != 8:
                    continue  # the wgmma FP8 accumulator model applies to 8-bit operands only
                out[f"out_{acc.name.lower()}"] = np.asarray(
                    matmul.scaled_matmul(qa, qb, accumulation=acc), dtype=np.float32
                )
            return out

        register(
            f"formats.matmul.{fmt_name.lower()}",
            description=f"scaled_matmul of {fmt_name}-quantized a (16x128) and b (8x128), both blocked "
            "along K, under each accumulation model (EXACT, FLOAT32, HOPPER_FP8 for 8-bit)",
            block_format=fmt_name,
            seed=_MATMUL_SEED,
            a_shape=[16, 128],
            b_shape=[8, 128],
        )(matmul_case)


_MATMUL_SEED = 17
_register_matmul_cases()


def _register_tcgen05_cases() -> None:
    for fmt_name in ("MXFP8_E4M3", "MXFP4", "NVFP4", "FP8_E4M3_PER_TENSOR"):

        def tcgen05_case(fmt_name=fmt_name) -> dict[str, np.ndarray]:
            from fp4sim.formats import blocks, matmul

            rng = np.random.default_rng(_MATMUL_SEED)
            a = (rng.standard_normal((16, 128)) * 4).astype(np.float32)
            b = rng.standard_normal((8, 128)).astype(np.float32)
            fmt = getattr(blocks, fmt_name)
            qa, qb = blocks.quantize(a, fmt), blocks.quantize(b, fmt)
            out = {
                "a": a,
                "b": b,
                "a_codes": np.asarray(qa.codes, np.uint8),
                "b_codes": np.asarray(qb.codes, np.uint8),
            }
            if qa.scales is not None:
                out["a_scales"] = np.asarray(qa.scales, np.uint8)
                out["b_scales"] = np.asarray(qb.scales, np.uint8)
            if qa.global_scale is not None:
                out["a_global"] = np.asarray(qa.global_scale, np.float32).reshape(-1)
                out["b_global"] = np.asarray(qb.global_scale, np.float32).reshape(-1)
            out["out_tcgen05"] = np.asarray(
                matmul.scaled_matmul(qa, qb, accumulation=matmul.Accumulation.TCGEN05),
                dtype=np.float32,
            )
            return out

        register(
            f"formats.matmul_tcgen05.{fmt_name.lower()}",
            description=f"scaled_matmul of {fmt_name}-quantized a (16x128) and b (8x128) "
            "under Accumulation.TCGEN05 (the tcgen05.mma kind the formats "
            "select, models checked against MMA-Sim)",
            block_format=fmt_name,
            seed=_MATMUL_SEED,
            a_shape=[16, 128],
            b_shape=[8, 128],
        )(tcgen05_case)


_register_tcgen05_cases()
