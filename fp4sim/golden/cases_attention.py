"""Golden cases of the attention layer: exp2 models, Direct-P payloads, every preset's P tile and
forward, and every training preset's causal forward + backward step.

Each case calls the public emulators of :mod:`fp4sim.attention` on NumPy inputs made here from a
fixed seed; none re-implements them. Importing this module registers the cases in
:data:`fp4sim.golden.store.CASES`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fp4sim.golden.store import register


def _exp2_inputs() -> np.ndarray:
    """x on [-130, 2): a dense grid, every 1/64 step, the flush boundary and the specials."""
    grid = np.linspace(-130.0, 2.0, 2048, endpoint=False).astype(np.float32)
    steps = np.arange(-64 * 3, 64, dtype=np.float32) / np.float32(64)
    edges = np.array(
        [
            -126.0,
            np.nextafter(np.float32(-126.0), np.float32(0)),
            -126.5,
            -127.0,
            -127.5,
            -0.0,
            0.0,
            1e-8,
            -1e-8,
            1.0,
            -np.inf,
            np.nan,
        ],
        dtype=np.float32,
    )
    return np.concatenate([grid, steps, edges])


def _register_attention_cases() -> None:
    points = int(_exp2_inputs().size)

    @register(
        "attention.exp2.rn",
        description="fp4sim's correctly rounded float32 exp2 with "
        "flush-to-zero below 2^-126 (exp2_rn)",
        points=points,
    )
    def exp2_rn_case() -> dict[str, np.ndarray]:
        from fp4sim.attention import exp2_rn

        x = _exp2_inputs()
        return {"x": x, "y": np.asarray(exp2_rn(x), dtype=np.float32)}

    @register(
        "attention.exp2.fa4",
        description="FA4's degree-3 polynomial ex2 emulation (exp2_fa4), bit-exact incl. the FMAs",
        points=points,
    )
    def exp2_fa4_case() -> dict[str, np.ndarray]:
        from fp4sim.attention import exp2_fa4

        x = _exp2_inputs()
        return {"x": x, "y": np.asarray(exp2_fa4(x), dtype=np.float32)}

    @register(
        "attention.direct_p.payload_grid",
        description="E2M1 payload codes of the Direct-P converters (exact, affine 1.5/1.2, Mitchell "
        "shifts 0 / 0.0576 / log2(1.25)-1/4) on 4096 x uniform on [-6, log2 6)",
        points=4096,
    )
    def direct_p_grid() -> dict[str, np.ndarray]:
        from fp4sim.attention import (
            MITCHELL_BOUNDARY_SHIFT,
            AffineP,
            ExactP,
            MitchellP,
            direct_p_payload,
        )

        x = np.linspace(-6.0, math.log2(6.0), 4096, endpoint=False).astype(np.float32)
        convs = {
            "exact": ExactP(),
            "affine": AffineP(),
            "mitchell_s0": MitchellP(shift=0.0),
            "mitchell_zero_mean": MitchellP(shift=0.0576),
            "mitchell_boundary": MitchellP(shift=MITCHELL_BOUNDARY_SHIFT),
        }
        return {
            "x": x,
            **{
                f"codes_{n}": np.asarray(direct_p_payload(c, x), dtype=np.uint8)
                for n, c in convs.items()
            },
        }

    for preset in _attention_preset_names():

        def tile_case(preset=preset) -> dict[str, np.ndarray]:
            from fp4sim.attention import convert_tile

            t = _tile_scores()
            p = convert_tile(_attention_recipes()[preset], t, need_mismatched=True)
            out = {
                "t": t,
                "codes": np.asarray(p.codes),
                "values": np.asarray(p.values, dtype=np.float32),
            }
            for key in ("scales", "exps", "mismatched", "k"):
                val = getattr(p, key)
                if val is not None:
                    val = np.asarray(val)
                    out[key] = val.astype(np.int32) if val.dtype.kind == "i" else val
            return out

        register(
            f"attention.{preset}.p_tile",
            description=f"P of one 8x128 key tile of log2-domain scores under the {preset} recipe "
            "(convert_tile): codes, block scales/exponents, MMA values, mismatched sums",
            preset=preset,
            seed=_TILE_SEED,
            shape=[8, 128],
        )(tile_case)

        def forward_case(preset=preset) -> dict[str, np.ndarray]:
            from fp4sim.attention import attention_forward

            q, k, v = _qkv(_FWD_SEED)
            res = attention_forward(
                q, k, v, _attention_recipes()[preset], return_intermediates=True
            )
            it = res.intermediates
            out = {
                "q": q,
                "k": k,
                "v": v,
                "o": np.asarray(res.out, dtype=np.float32),
                "lse": np.asarray(res.lse, dtype=np.float32),
                "anchors": np.asarray(it.anchors, dtype=np.float32),
                "p_codes": np.asarray(it.p_codes),
                "numerator": np.asarray(it.numerator, dtype=np.float32),
                "normalizer": np.asarray(it.normalizer, dtype=np.float32),
            }
            if it.p_scales is not None:
                out["p_scales"] = np.asarray(it.p_scales)
            if it.p_k is not None:
                out["p_k"] = np.asarray(it.p_k).astype(np.int32)
            return out

        register(
            f"attention.{preset}.forward",
            description=f"tiled forward of the {preset} recipe on Gaussian q (1,32,32), k/v "
            "(1,256,32) (two key tiles), "
            "non-causal, default softmax scale: O, LSE, tile anchors, P codes/scales, "
            "numerator and normalizer (bitwise; a kernel's O may differ by its "
            "accumulation order)",
            preset=preset,
            seed=_FWD_SEED,
            q_shape=[1, 32, 32],
            kv_shape=[1, 256, 32],
        )(forward_case)

    for preset in _training_preset_names():

        def training_case(preset=preset) -> dict[str, np.ndarray]:
            from fp4sim.attention import TRAINING_PRESETS, training_backward, training_forward

            rng = np.random.default_rng(_TRAIN_SEED)
            q, k, v, d_out = (rng.standard_normal((1, 64, 32)).astype(np.float32) for _ in range(4))
            recipe = TRAINING_PRESETS[preset]
            out, saved = training_forward(q, k, v, recipe, causal=True)
            trace = training_backward(saved, d_out, recipe)
            arrays = {
                "q": q,
                "k": k,
                "v": v,
                "d_out": d_out,
                "o": out,
                "lse": saved.lse,
                "dq": trace.grads.dq,
                "dk": trace.grads.dk,
                "dv": trace.grads.dv,
                "delta": trace.delta,
                "ds": trace.ds,
                "ds_q": trace.ds_q,
                "p": trace.rebuilt.p,
            }
            result = {key: np.asarray(a, dtype=np.float32) for key, a in arrays.items()}
            result["p_codes"] = np.asarray(
                trace.rebuilt.codes
            )  # the rebuilt P codes (= the forward's)
            if trace.rebuilt.scales is not None:
                result["p_scales"] = np.asarray(trace.rebuilt.scales)
            return result

        register(
            f"attention.training.{preset}",
            description=f"causal training step of the {preset} training recipe on Gaussian q, k, v, dO "
            "(1, 64, 32): O, LSE, rebuilt P (normalized, codes, scales), D = rowsum(dO∘O), dS "
            "and its quantized copy, dQ, dK, dV",
            preset=preset,
            seed=_TRAIN_SEED,
            shape=[1, 64, 32],
            causal=True,
        )(training_case)


_TILE_SEED = 7
_TRAIN_SEED = 13


def _training_preset_names() -> list[str]:
    from fp4sim.attention import TRAINING_PRESETS

    return sorted(TRAINING_PRESETS)


_FWD_SEED = 11


def _attention_recipes() -> dict[str, Any]:
    """The named attention recipes (the published routes) of :mod:`fp4sim.attention`."""
    from fp4sim.attention import PRESETS

    return PRESETS


def _attention_preset_names() -> list[str]:
    return sorted(_attention_recipes())


def _tile_scores() -> np.ndarray:
    """8 rows × 128 keys of log2-domain scores t = u − max u (row 7 partly masked with −inf)."""
    rng = np.random.default_rng(_TILE_SEED)
    u = (rng.standard_normal((8, 128)) * np.linspace(0.5, 6.0, 8)[:, None]).astype(np.float32)
    t = (u - u.max(axis=-1, keepdims=True)).astype(np.float32)
    t[7, 40:] = -np.inf
    return t


def _qkv(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((1, 32, 32)).astype(np.float32)
    k = rng.standard_normal((1, 256, 32)).astype(np.float32)
    v = rng.standard_normal((1, 256, 32)).astype(np.float32)
    return q, k, v


_register_attention_cases()
