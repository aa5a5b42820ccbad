"""The report's experiments: every number of ``python -m fp4sim reproduce``, computed by the library.

Each ``experiment_*`` function only *calls* the public emulators of :mod:`fp4sim.formats` and
:mod:`fp4sim.attention` (nothing here re-implements an algorithm) and returns plain Python and
NumPy values; results are cached per :class:`~fp4sim.report.sizes.Sizes`, so the sections
(:mod:`fp4sim.report.sections`) and the figures (:mod:`fp4sim.report.figures`) that show the
same data compute it once. The input makers (:func:`gaussian_qkv`, :func:`code_match_grid`,
:func:`attention_like_t`, :func:`library_inputs`, ...) are public so that the tests build the
same inputs and compare the report's numbers with their own calls.

>>> from fp4sim.report import experiments
>>> r = experiments.experiment_normalization_examples()  # the two-key example
>>> [round(float(x), 6) for x in r["represented"]], round(r["outputs"][(0.0, 6.0)]["MISMATCHED"], 6)
([1.0, 0.333333], 1.428571)
"""

from __future__ import annotations

import functools
import math
import sys
from typing import TYPE_CHECKING, Any

import numpy as np

from fp4sim.report.claims import EXPECTED
from fp4sim.report.sizes import Sizes
from fp4sim.report.tables import spread

if TYPE_CHECKING:
    from fp4sim.attention import AttentionRecipe, TrainingRecipe

__all__ = [
    "show_progress",
    "progress_enabled",
    "experiment_formats",
    "experiment_scale_rules",
    "experiment_exp2",
    "experiment_normalization_examples",
    "experiment_normalization_routes",
    "direct_p_converters",
    "CONVERTER_LABELS",
    "code_match_grid",
    "attention_like_t",
    "attention_like_x",
    "experiment_code_match",
    "gaussian_qkv",
    "ERROR_METRICS",
    "output_errors",
    "over_seeds",
    "experiment_route_errors",
    "leak_class_of",
    "experiment_leak",
    "experiment_consistency",
    "experiment_bit_identity",
    "library_inputs",
    "experiment_libraries",
]


_PROGRESS = [False]  # inner progress bars of the long experiments


def show_progress(enabled: bool) -> None:
    """Switch the inner progress bars of the long experiments on or off (``reproduce`` does)."""
    _PROGRESS[0] = bool(enabled)


def progress_enabled() -> bool:
    """Whether the inner progress bars are on (:func:`show_progress`)."""
    return _PROGRESS[0]


_DEVICES: list[Any] = []  # the devices the sweeps are mapped over (reproduce --devices)


def use_devices(devices: Any) -> None:
    """Map the report's sweeps over these jax devices (``fp4sim.parallel.map_cases``: one worker
    per device, the emulator jitted there); ``[]`` runs them one by one with NumPy. The numbers
    are the same bits either way (NumPy and jitted jax give identical results)."""
    _DEVICES[:] = list(devices)


@functools.cache
def experiment_formats() -> dict[str, Any]:
    """Spec numbers of every format and the full E2M1 code table (from spec + codec)."""
    from fp4sim.formats import ALL_FORMATS, E2M1, all_codes, decode, encode

    specs = []
    for f in ALL_FORMATS:
        specs.append(
            {
                "name": f.name,
                "bits": f.nbits,
                "ebits": f.ebits,
                "mbits": f.mbits,
                "bias": f.bias,
                "max": f.max,
                "min_normal": f.min_normal,
                "min_subnormal": f.min_subnormal,
                "eps": f.eps,
                "inf": f.has_inf,
                "nan": f.has_nan,
                "ml_dtypes": getattr(f.dtype, "__name__", "—") if f.dtype is not None else "—",
            }
        )
    codes = np.asarray(all_codes(E2M1), dtype=np.uint8)
    values = np.asarray(decode(codes, E2M1), dtype=np.float32)
    ex_in = np.array([a for a, _ in EXPECTED["e2m1_rne_examples"]], dtype=np.float32)
    ex_out = np.asarray(decode(encode(ex_in, E2M1), E2M1), dtype=np.float32)
    return {
        "specs": specs,
        "e2m1_codes": codes,
        "e2m1_values": values,
        "rne_inputs": ex_in,
        "rne_outputs": ex_out,
    }


# --- scale rules: floor (OCP) vs round-up (TE/cuDNN) ------------------------------------------------


def _floor_clip_threshold(elem: Any) -> float:
    """OCP MX floor rule: a block clips when amax's mantissa exceeds elem.max / 2^floor(log2 elem.max)."""
    return elem.max / 2.0 ** math.floor(math.log2(elem.max))


@functools.cache
def experiment_scale_rules(sizes: Sizes) -> dict[str, Any]:
    """Clipping rates and errors of each UE8M0 scale rule on Gaussian blocks, plus worked examples.

    A block *clips* when its largest magnitude exceeds ``elem.max · scale`` (measured from the
    scale codes ``quantize`` chose); the mantissa rule's prediction counts blocks whose amax mantissa is
    above ``elem.max / 2^e_M`` (1.75 for E4M3, 1.5 for E2M1).
    """
    from fp4sim.formats import UE4M3, UE8M0, decode
    from fp4sim.formats.blocks import (
        MXFP4,
        MXFP8,
        NVFP4,
        NVFP4_SINGLE,
        ScaleRule,
        dequantize,
        quantize,
    )

    rng = np.random.default_rng(sizes.seed)
    x = rng.standard_normal((sizes.scale_blocks, 32)).astype(np.float32)
    amax = np.abs(x.astype(np.float64)).max(axis=-1)
    mant = amax / 2.0 ** np.floor(np.log2(amax))
    rows = []
    for fmt in (MXFP8, MXFP4):
        predicted = float(np.mean(mant > _floor_clip_threshold(fmt.elem)))
        for rule in (ScaleRule.FLOOR, ScaleRule.RCEIL, ScaleRule.CEIL, ScaleRule.EVEN):
            q = quantize(x, fmt, rule=rule)
            scale = np.asarray(decode(q.scales, UE8M0), dtype=np.float64)[:, 0]
            deq = np.asarray(dequantize(q), dtype=np.float64)
            clipped = amax > fmt.elem.max * scale
            err = deq - x
            rows.append(
                {
                    "format": fmt.name,
                    "rule": rule.name,
                    "clip_rate": float(clipped.mean()),
                    "mantissa_rule_predicts": predicted if rule is ScaleRule.FLOOR else 0.0,
                    "rel_l2": float(np.linalg.norm(err) / np.linalg.norm(x)),
                    "max_elem_rel_err": float(np.mean(np.abs(err).max(-1) / amax)),
                }
            )
    # worked examples: one block whose max is the named amax (other elements small).
    examples = []
    for fmt, a in ((MXFP8, 500.0), (MXFP8, 1.0), (MXFP4, 7.0)):
        block = np.zeros((1, 32), dtype=np.float32)
        block[0, 0], block[0, 1] = a, a / 8
        for rule in (ScaleRule.FLOOR, ScaleRule.RCEIL):
            q = quantize(block, fmt, rule=rule)
            s = float(np.asarray(decode(q.scales, UE8M0)).ravel()[0])
            examples.append(
                {
                    "format": fmt.name,
                    "amax": a,
                    "rule": rule.name,
                    "scale": s,
                    "scaled": a / s,
                    "dequantized": float(np.asarray(dequantize(q))[0, 0]),
                }
            )
    block = np.zeros((1, 16), dtype=np.float32)
    block[0, 0] = 2.9
    nv = []
    for fmt in (NVFP4_SINGLE, NVFP4):
        q = quantize(block, fmt)
        nv.append(
            {
                "format": fmt.name,
                "scale": float(np.asarray(decode(q.scales, UE4M3)).ravel()[0]),
                "dequantized": float(np.asarray(dequantize(q))[0, 0]),
            }
        )
    return {"rows": rows, "examples": examples, "nvfp4": nv}


# --- exp2 models: correctly rounded and FA4's polynomial --------------------------------------------


@functools.cache
def experiment_exp2(sizes: Sizes) -> dict[str, Any]:
    """FA4's polynomial ex2 against float64 2^x, and fp4sim's correctly rounded exp2 against
    float64 exp2 rounded to float32, on a deterministic grid of x in [-126, 0]."""
    from fp4sim.attention import exp2_fa4, exp2_rn

    x = np.linspace(-126.0, 0.0, sizes.grid_points, endpoint=False, dtype=np.float64).astype(
        np.float32
    )
    truth = np.exp2(x.astype(np.float64))
    fa4 = np.asarray(exp2_fa4(x), dtype=np.float64)
    rel = fa4 / truth - 1.0
    frac = x.astype(np.float64) - np.floor(x.astype(np.float64))
    rn = np.asarray(exp2_rn(x), dtype=np.float32)
    want = truth.astype(np.float32)
    mismatches = int(np.count_nonzero(rn.view(np.uint32) != want.view(np.uint32)))
    curve_idx = np.argsort(frac)[:: max(1, len(frac) // 4000)]
    return {
        "n": int(x.size),
        "fa4_rel_min": float(rel.min()),
        "fa4_rel_max": float(rel.max()),
        "fa4_abs_max": float(np.abs(rel).max()),
        "rn_mismatches": mismatches,
        "curve_frac": frac[curve_idx],
        "curve_rel": rel[curve_idx],
    }


# --- normalization ---------------------------------------------------------------------------------


@functools.cache
def experiment_normalization_examples() -> dict[str, Any]:
    """The two-key example through the exact Direct-P converter and :func:`normalize`, and
    the flush-to-zero ordering through :func:`block_denominator`."""
    from fp4sim.attention import (
        ExactP,
        Normalization,
        NormalizerOrder,
        block_denominator,
        direct_p_coordinate,
        direct_p_payload,
        normalize,
    )
    from fp4sim.formats import E2M1, decode

    w = np.array(EXPECTED["norm_weights"], dtype=np.float64)
    t = np.log2(w).astype(np.float32)  # log2-domain scores against the row max (w_max = 1)
    x = direct_p_coordinate(t, np.int32(0))  # k_B = ceil(max t) = 0
    payload = np.asarray(decode(direct_p_payload(ExactP(), x), E2M1), dtype=np.float64)
    represented = payload / 6.0  # alpha = 2^0 under the alpha·q/6 convention
    outputs = {}
    for vals in EXPECTED["norm_outputs"]:
        v = np.array(vals, dtype=np.float64)
        outputs[vals] = {n.name: float(normalize(w, represented, v, n).out) for n in Normalization}
    payloads = np.full((1, 16), 0.5, dtype=np.float32)
    sums = payloads.sum(axis=-1)
    exps = np.array([-126], dtype=np.int32)
    den = {
        o.name: float(np.asarray(block_denominator(sums, exps, 6.0, o, payloads=payloads))[0])
        for o in NormalizerOrder
    }
    return {"payload": payload, "represented": represented, "outputs": outputs, "denominators": den}


@functools.cache
def experiment_normalization_routes(sizes: Sizes) -> dict[str, Any]:
    """The Direct-P routes (affine and Mitchell) with only the normalizer changed, on the largest
    Gaussian shape of the route-error sweep, on every seed of :attr:`Sizes.seed_values` (means
    and :func:`over_seeds` spreads of :data:`ERROR_METRICS`)."""
    from fp4sim.attention import (
        HW_FP4_DIRECT_P,
        HW_FP4_DIRECT_P_MITCHELL,
        Normalization,
        attention_forward,
        attention_reference,
    )

    s = sizes.seq_lens[-1]
    per_seed: dict[str, list[dict[str, float]]] = {}
    for seed in sizes.seed_values:
        q, k, v = gaussian_qkv(s, sizes.head_dim, seed + s)
        ref = attention_reference(*(a.astype(np.float64) for a in (q, k, v))).out
        for name, recipe in (
            ("hw_fp4_direct_p", HW_FP4_DIRECT_P),
            ("hw_fp4_direct_p_mitchell", HW_FP4_DIRECT_P_MITCHELL),
        ):
            for norm in (Normalization.CONSISTENT, Normalization.MISMATCHED):
                out = attention_forward(q, k, v, recipe.replace(normalization=norm)).out
                per_seed.setdefault(f"{name}/{norm.name}", []).append(output_errors(out, ref))
    errors = {key: over_seeds(m) for key, m in per_seed.items()}
    return {"seq_len": s, "errors": errors, "seeds": list(sizes.seed_values)}


# --- converters: code maps and code-match rates -----------------------------------------------------


def direct_p_converters() -> dict[str, Any]:
    from fp4sim.attention import (
        MITCHELL_BOUNDARY_SHIFT,
        SCHRAUDOLPH_ZERO_MEAN_SHIFT,
        AffineP,
        ExactP,
        MitchellP,
    )

    return {
        "exact": ExactP(),
        "affine": AffineP(),
        "mitchell_s0": MitchellP(shift=0.0),
        "mitchell_zero_mean": MitchellP(shift=SCHRAUDOLPH_ZERO_MEAN_SHIFT),
        "mitchell_boundary": MitchellP(shift=MITCHELL_BOUNDARY_SHIFT),
    }


CONVERTER_LABELS = {
    "affine": "Direct-P affine u = max(0, 1.5x + 1.2)",
    "mitchell_s0": "Mitchell-P, shift 0",
    "mitchell_zero_mean": "Mitchell-P, shift 0.0576 (zero mean)",
    "mitchell_boundary": "Mitchell-P, shift log2(1.25) − 1/4 (default)",
}


def code_match_grid(n: int) -> np.ndarray:
    """The published code-match grid: n points uniform on [-6, log2 6) (``uniform_grid``)."""
    from fp4sim.attention import uniform_grid

    return uniform_grid(n)


def attention_like_t(sizes: Sizes, seed: int | None = None) -> np.ndarray:
    """Log2-domain scores t = fl(u − max u), u = fl(log2(e)·q·k/√d), of Gaussian Q and K drawn
    with ``seed`` (default ``sizes.seed``, the first of :attr:`Sizes.seed_values`)."""
    rng = np.random.default_rng(sizes.seed if seed is None else seed)
    q = rng.standard_normal((sizes.attn_rows, sizes.head_dim)).astype(np.float32)
    k = rng.standard_normal((sizes.attn_keys, sizes.head_dim)).astype(np.float32)
    z = (q @ k.T) * np.float32(1.0 / math.sqrt(sizes.head_dim))
    u = z * np.float32(math.log2(math.e))
    return (u - u.max(axis=-1, keepdims=True)).astype(np.float32)


def attention_like_x(sizes: Sizes, seed: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Direct-P coordinates x of :func:`attention_like_t` with the exact route's block exponents
    (k_B = ceil of each 32-key block's max, from ``convert_tile``), and the exact codes."""
    from fp4sim.attention import HW_FP4_DIRECT_P, ExactP, convert_tile, direct_p_coordinate

    t = attention_like_t(sizes, seed)
    tile = convert_tile(HW_FP4_DIRECT_P.replace(converter=ExactP()), t)
    tb = t.reshape(t.shape[0], -1, 32)
    x = np.asarray(direct_p_coordinate(tb, np.asarray(tile.k)[..., None])).reshape(t.shape)
    return x, np.asarray(tile.codes)


@functools.cache
def experiment_code_match(sizes: Sizes) -> dict[str, Any]:
    """Code-match rates of the Direct-P family against the exact converter (grid and attention-like
    inputs), Schraudolph's 8-bit P against exact rounding, and the affine behaviour table.

    The grid is deterministic; the attention-like rates are measured on each seed of
    :attr:`Sizes.seed_values` (``"attention"`` etc. hold the means, ``"*_spread"`` the
    :func:`~fp4sim.report.tables.spread` with the per-seed values)."""
    from fp4sim.attention import (
        AttentionRecipe,
        ExactP,
        PFormat,
        SchraudolphP,
        code_match_rate,
        convert_tile,
        direct_p_payload,
    )
    from fp4sim.formats import E2M1, decode

    convs = direct_p_converters()
    x = code_match_grid(sizes.grid_points)
    grid = {name: code_match_rate(convs[name], convs["exact"], x) for name in CONVERTER_LABELS}

    attn_seeds: dict[str, list[float]] = {name: [] for name in CONVERTER_LABELS}
    attn_nz_seeds: dict[str, list[float]] = {name: [] for name in CONVERTER_LABELS}
    zero_fractions = []
    for seed in sizes.seed_values:
        xa, exact_codes = attention_like_x(sizes, seed)
        nonzero = exact_codes != 0
        zero_fractions.append(float(np.mean(~nonzero)))
        for name in CONVERTER_LABELS:
            attn_seeds[name].append(code_match_rate(convs[name], convs["exact"], xa))
            attn_nz_seeds[name].append(code_match_rate(convs[name], convs["exact"], xa[nonzero]))
    attn_spread = {name: spread(v) for name, v in attn_seeds.items()}
    attn_nz_spread = {name: spread(v) for name, v in attn_nz_seeds.items()}

    schraudolph = {}
    n = sizes.grid_points - sizes.grid_points % 128
    tg = (
        np.linspace(-6.0, 0.0, n, endpoint=False, dtype=np.float64)
        .astype(np.float32)
        .reshape(-1, 128)
    )
    ts = [attention_like_t(sizes, seed) for seed in sizes.seed_values]
    for fmt in (PFormat.FP8, PFormat.BF16):
        exact = AttentionRecipe(converter=ExactP(), p_format=fmt)
        approx = exact.replace(converter=SchraudolphP())

        # share of equal P codes (code_match_rate covers the Direct-P family only)
        def same(inputs: np.ndarray, approx: Any = approx, exact: Any = exact) -> float:
            return float(
                np.mean(
                    np.asarray(convert_tile(approx, inputs).codes)
                    == np.asarray(convert_tile(exact, inputs).codes)
                )
            )

        att = spread([same(t) for t in ts])
        schraudolph[fmt.name] = {
            "grid": same(tg),
            "attention": att["mean"],
            "attention_spread": att,
        }

    table = []
    for xv, exact_v, affine_v in EXPECTED["affine_table"]:
        xs = np.array([xv], dtype=np.float32)
        table.append(
            (
                xv,
                exact_v,
                float(decode(direct_p_payload(convs["exact"], xs), E2M1)[0]),
                affine_v,
                float(decode(direct_p_payload(convs["affine"], xs), E2M1)[0]),
            )
        )
    # code maps for the figure: a thinned grid, plus the disagreement intervals at full resolution
    xm = x[:: max(1, x.size // 3000)]
    maps = {
        name: np.asarray(decode(direct_p_payload(c, xm), E2M1), dtype=np.float32)
        for name, c in convs.items()
    }
    exact_codes_grid = np.asarray(direct_p_payload(convs["exact"], x))
    bands = {}
    for name in CONVERTER_LABELS:
        wrong = np.asarray(direct_p_payload(convs[name], x)) != exact_codes_grid
        edges = np.flatnonzero(np.diff(np.concatenate([[0], wrong.astype(np.int8), [0]])))
        bands[name] = [(float(x[a]), float(x[b - 1])) for a, b in zip(edges[::2], edges[1::2])]
    return {
        "grid": grid,
        "attention": {name: d["mean"] for name, d in attn_spread.items()},
        "attention_spread": attn_spread,
        "attention_nonzero": {name: d["mean"] for name, d in attn_nz_spread.items()},
        "attention_nonzero_spread": attn_nz_spread,
        "schraudolph": schraudolph,
        "table": table,
        "map_x": xm,
        "maps": maps,
        "bands": bands,
        "exact_zero_fraction": float(np.mean(zero_fractions)),
        "seeds": list(sizes.seed_values),
    }


# --- error of each published route against exact attention ------------------------------------------


def gaussian_qkv(
    seq_len: int, head_dim: int, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One head of standard-normal float32 Q, K, V of shape (1, seq_len, head_dim)."""
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((1, seq_len, head_dim)).astype(np.float32) for _ in range(3))


@functools.cache
def _jitted_forward_out(recipe: AttentionRecipe) -> Any:
    import jax

    from fp4sim.attention import attention_forward

    return jax.jit(lambda q, k, v: attention_forward(q, k, v, recipe).out)


ERROR_METRICS = ("cosine", "rel_l2", "norm_ratio")
"""What the error tables report per output: cosine similarity and relative L2 error against the
float64 reference (:func:`fp4sim.attention.error_summary`) and the norm ratio ‖O‖ / ‖O_ref‖."""


def output_errors(out: Any, ref: Any) -> dict[str, float]:
    """:data:`ERROR_METRICS` of ``out`` against ``ref``. They are tied by the identity
    ``rel_l2² = (1 − r)² + 2r(1 − cosine)`` for the norm ratio ``r`` (expand ‖O − O_ref‖²)."""
    from fp4sim.attention import error_summary

    out, ref = np.asarray(out, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    e = error_summary(out, ref)
    return {
        "cosine": float(e.cosine),
        "rel_l2": float(e.rel_l2),
        "norm_ratio": float(np.linalg.norm(out) / np.linalg.norm(ref)),
    }


def over_seeds(per_seed: list[dict[str, float]]) -> dict[str, Any]:
    """The means of per-seed metric dicts, and ``"spread"``: each metric's
    :func:`~fp4sim.report.tables.spread` (std, min, max and the per-seed values)."""
    if not per_seed:
        raise ValueError("per_seed is empty")
    keys = list(per_seed[0])
    spreads = {k: spread([d[k] for d in per_seed]) for k in keys}
    return {**{k: spreads[k]["mean"] for k in keys}, "spread": spreads}


def _route_error_case(case: tuple[int, int, int, Sizes, tuple[str, ...]]) -> dict[str, Any]:
    """One job of the route-error sweep: every preset at one (seed, sequence length, key tile)."""
    from fp4sim.attention import PRESETS, attention_forward, attention_reference

    seed, s, tile, sizes, presets = case
    q, k, v = gaussian_qkv(s, sizes.head_dim, seed + s)
    ref = np.asarray(
        attention_reference(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64)).out
    )
    row = {}
    for name in presets:
        recipe = PRESETS[name].replace(block_kv=tile)
        if _DEVICES:  # on this worker's device (jax.default_device), same bits as NumPy
            out = np.asarray(_jitted_forward_out(recipe)(q, k, v))
        else:
            out = np.asarray(attention_forward(q, k, v, recipe).out)
        row[name] = output_errors(out, ref)
    return row


@functools.cache
def experiment_route_errors(sizes: Sizes) -> dict[str, Any]:
    """Cosine, relative L2 error and norm ratio of every preset recipe against the float64
    reference, over sequence length (tile 128) and over the key-tile size (at the middle
    sequence length), each on every seed of :attr:`Sizes.seed_values`: an entry
    ``by_len[preset][S]`` holds the means and their ``"spread"`` (:func:`over_seeds`).

    The jobs (one per seed and distinct (S, tile)) are mapped over the devices of
    :func:`use_devices` (none: one by one)."""
    from tqdm import tqdm

    from fp4sim.attention import PRESETS
    from fp4sim.parallel import map_cases

    presets = tuple(n for n in PRESETS if n != "exact_f32")
    by_len: dict[str, dict[int, Any]] = {n: {} for n in presets}
    by_tile: dict[str, dict[int, Any]] = {n: {} for n in presets}
    mid = sizes.seq_lens[len(sizes.seq_lens) // 2]
    shapes = list(
        dict.fromkeys([(s, 128) for s in sizes.seq_lens] + [(mid, b) for b in sizes.block_sizes])
    )
    jobs = [(seed, s, tile, sizes, presets) for seed in sizes.seed_values for s, tile in shapes]
    with tqdm(
        total=len(jobs), desc="route errors", leave=False, disable=not _PROGRESS[0], file=sys.stderr
    ) as bar:
        rows = map_cases(_route_error_case, jobs, devices=_DEVICES, progress=bar.update)
    got: dict[tuple[int, int], list[dict[str, Any]]] = {shape: [] for shape in shapes}
    for (_, s, tile, _, _), row in zip(jobs, rows):  # jobs in seed order
        got[(s, tile)].append(row)
    for name in presets:
        for s in sizes.seq_lens:
            by_len[name][s] = over_seeds([row[name] for row in got[(s, 128)]])
        for b in sizes.block_sizes:
            by_tile[name][b] = over_seeds([row[name] for row in got[(mid, b)]])
    return {
        "presets": list(presets),
        "by_len": by_len,
        "by_tile": by_tile,
        "mid": mid,
        "seeds": list(sizes.seed_values),
    }


# --- causal leak ----------------------------------------------------------------------------------


def leak_class_of(leak: float) -> str:
    """The leak classes: exactly 0 (bitwise), tiny (< 1e-4), large (> 1e-3), else in between."""
    if leak == 0.0:
        return "exactly 0"
    if leak < 1e-4:
        return "tiny"
    if leak > 1e-3:
        return "large"
    return "between"


@functools.cache
def experiment_leak(sizes: Sizes) -> dict[str, Any]:
    """``leak_probe`` on every configuration of ``LEAK_TABLE`` (N = sizes.leak_tokens)."""
    from tqdm import tqdm

    from fp4sim.attention import LEAK_TABLE, leak_probe

    rows = []
    for name, recipe in tqdm(
        list(LEAK_TABLE.items()),
        desc="leak probes",
        leave=False,
        disable=not _PROGRESS[0],
        file=sys.stderr,
    ):
        rep = leak_probe(recipe, n_tokens=sizes.leak_tokens)
        rows.append(
            {
                "name": name,
                "leak_o": rep.leak_o,
                "leak_dq": rep.leak_dq,
                "target": rep.target,
                "gain": rep.gain,
                "bitwise": bool(rep.bitwise_o and rep.bitwise_dq),
                "vacuous": bool(rep.vacuous),
                "class": leak_class_of(max(rep.leak_o, rep.leak_dq)),
            }
        )
    return {"rows": rows}


# --- forward/backward consistency -------------------------------------------------------------------


@functools.cache
def experiment_consistency(sizes: Sizes) -> dict[str, Any]:
    """The two-key dS row sums, and :func:`check_consistency` of the matched training presets
    and of each named deliberate mismatch."""
    from fp4sim.attention import (
        TRAINING_PRESETS,
        Mismatch,
        Normalization,
        check_consistency,
        normalize,
        softmax_grad,
        training_backward,
        training_forward,
        with_mismatch,
    )

    # w = [1, 0.4] (represented [1, 1/3]), V = [0, 6], dO = 1, head dim 1.
    ex = experiment_normalization_examples()
    w, rep = np.array(EXPECTED["norm_weights"]), ex["represented"]
    v = np.array([0.0, 6.0])
    sums = {}
    for norm in (Normalization.CONSISTENT, Normalization.MISMATCHED):
        n = normalize(w, rep, v, norm)
        p_tilde = rep / n.denominator
        ds = softmax_grad(p_tilde[None], v[None], np.atleast_1d(n.out))[0]  # dP = dO·V, D = dO·O
        sums[norm.name] = {"p": p_tilde, "o": float(n.out), "ds": ds, "sum": float(ds.sum())}

    rng = np.random.default_rng(sizes.seed)
    n_tok = sizes.leak_tokens
    q, k, v3, do = (rng.standard_normal((1, n_tok, 64)).astype(np.float32) for _ in range(4))

    def run(rec: TrainingRecipe) -> list[np.ndarray]:
        out, saved = training_forward(q, k, v3, rec, causal=True)
        g = training_backward(saved, do, rec).grads
        return [np.asarray(a) for a in (out, *g)]

    checks = []
    for name, recipe in TRAINING_PRESETS.items():
        variants = [("matched", recipe)]
        for m in Mismatch:
            try:
                variants.append((m.name, with_mismatch(recipe, m)))
            except ValueError:
                continue  # this mismatch does not apply to the recipe (e.g. P_BITS needs 4-bit P)
        base = run(recipe)
        for label, rec in variants:
            c = check_consistency(rec, q, k, v3, do)
            # A mismatch that leaves O, dQ, dK and dV bitwise unchanged has nothing to detect.
            noop = label != "matched" and all(
                np.array_equal(a.view(np.uint32), b.view(np.uint32)) for a, b in zip(base, run(rec))
            )
            checks.append(
                {
                    "recipe": name,
                    "variant": label,
                    "p_bitwise": bool(c.p_bitwise),
                    "delta_ok": bool(c.delta_ok),
                    "ds_row_sum_ok": bool(c.ds_row_sum_ok),
                    "ok": bool(c.ok),
                    "failed": list(c.failed),
                    "noop": bool(noop),
                    "normalization": recipe.forward.normalization.name,
                }
            )
    return {"two_key": sums, "checks": checks}


# --- NumPy and jax.jit give the same bits -------------------------------------------------------------


def _same_bits(a: Any, b: Any) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return a.tobytes() == b.tobytes()


@functools.cache
def experiment_bit_identity(sizes: Sizes) -> dict[str, Any]:
    """Each emulator on NumPy and under ``jax.jit`` on this CPU (XLA flushes subnormals here):
    encode of every format, block quantization, and the attention forward of the first
    ``sizes.jit_presets`` presets."""
    import jax
    import jax.numpy as jnp
    from tqdm import tqdm

    from fp4sim.attention import PRESETS, attention_forward
    from fp4sim.formats import ALL_FORMATS, blocks, encode

    rng = np.random.default_rng(sizes.seed)
    x = (rng.standard_normal(4096) * np.exp2(rng.integers(-140, 20, 4096))).astype(np.float32)
    x[:7] = [0.0, -0.0, np.inf, -np.inf, 1e-40, -3e-39, np.nan]
    rows = []
    for fmt in ALL_FORMATS:
        xs = np.abs(x) if not fmt.signed else x
        if not fmt.has_nan:  # NaN input to a format without NaN raises on NumPy (documented policy)
            xs = xs[~np.isnan(xs)]
        got = jax.jit(lambda v, fmt=fmt: encode(v, fmt))(jnp.asarray(xs))
        rows.append(
            {
                "what": f"encode {fmt.name}",
                "n": int(xs.size),
                "same": _same_bits(encode(xs, fmt), got),
            }
        )
    xb = x.reshape(64, 64)
    for fmt in (blocks.MXFP8_E4M3, blocks.MXFP4, blocks.NVFP4):
        q_np = blocks.quantize(xb, fmt)
        q_jx = jax.jit(lambda v, fmt=fmt: blocks.quantize(v, fmt))(jnp.asarray(xb))
        same = _same_bits(q_np.codes, q_jx.codes) and _same_bits(q_np.scales, q_jx.scales)
        rows.append(
            {"what": f"quantize {fmt.name} (codes, scales)", "n": int(xb.size), "same": same}
        )
    q, k, v = gaussian_qkv(128, 64, sizes.seed)
    names = list(PRESETS)[: sizes.jit_presets]
    for name in tqdm(
        names, desc="jit forward", leave=False, disable=not _PROGRESS[0], file=sys.stderr
    ):
        recipe = PRESETS[name]
        ref = attention_forward(q, k, v, recipe)
        got = jax.jit(lambda a, b, c, r=recipe: attention_forward(a, b, c, r))(
            *map(jnp.asarray, (q, k, v))
        )
        rows.append(
            {
                "what": f"attention_forward `{name}` (O, LSE)",
                "n": int(q.size),
                "same": _same_bits(ref.out, got.out) and _same_bits(ref.lse, got.lse),
            }
        )
    return {"rows": rows}


# --- where the libraries' quantizers disagree -----------------------------------------------------------

_LIBRARY_COMPARISONS = (  # (reference preset, [presets compared with it])
    (
        "TE_MXFP8",
        (
            "OCP_MXFP8_E4M3",
            "TORCHAO_MXFP8_E4M3_FLOOR",
            "TORCHAO_MXFP8_E4M3_RCEIL",
            "TORCHAO_MXFP8_E4M3_EVEN",
            "JAX_MXFP8",
        ),
    ),
    ("TORCHAO_MXFP4_RCEIL", ("OCP_MXFP4", "TORCHAO_MXFP4_FLOOR", "TORCHAO_MXFP4_EVEN")),
    ("TE_NVFP4", ("TORCHAO_NVFP4", "JAX_NVFP4")),
)


def library_inputs(sizes: Sizes) -> np.ndarray:
    """Blocks of 32 where quantizers can disagree: Gaussian values with per-block magnitudes
    2^U(-20, 20), a quarter of the blocks holding exact E2M1/E4M3 tie midpoints."""
    rng = np.random.default_rng(sizes.seed + 1)
    n = max(4, sizes.scale_blocks // 4) * 4
    x = rng.standard_normal((n, 32)) * np.exp2(rng.integers(-20, 20, (n, 1)))
    ties = np.array(
        [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 9.0, 11.0, 13.0, 208.0, 232.0, 448.0]
    )
    k = n // 4
    signs = rng.choice([-1.0, 1.0], (k, 32))
    x[:k] = rng.choice(ties, (k, 32)) * signs * np.exp2(rng.integers(-8, 8, (k, 1)))
    return x.astype(np.float32)


@functools.cache
def experiment_libraries(sizes: Sizes) -> dict[str, Any]:
    """Share of scale codes and element codes on which each library preset differs from a reference."""
    from fp4sim.formats import blocks, presets

    x = library_inputs(sizes)

    def q(name: str) -> Any:
        fmt = presets.preset(name)
        if (
            fmt.global_scale is blocks.GlobalScale.CONSTANT
        ):  # JAX's NVFP4: the caller passes the factor
            g = blocks.global_decode_scale(np.abs(x).max(), fmt)
            return blocks.quantize(x, fmt, global_scale=g)
        return blocks.quantize(x, fmt)

    rows = []
    for ref_name, others in _LIBRARY_COMPARISONS:
        ref = q(ref_name)
        ref_values = np.asarray(blocks.dequantize(ref))
        for name in others:
            got = q(name)
            same_scale = (np.asarray(got.scales) == np.asarray(ref.scales)).all(
                axis=-1
            )  # per row of blocks
            values = np.asarray(blocks.dequantize(got))
            rows.append(
                {
                    "reference": ref_name,
                    "preset": name,
                    "scales_differ": float(
                        np.mean(np.asarray(got.scales) != np.asarray(ref.scales))
                    ),
                    "values_differ": float(
                        np.mean(values.view(np.uint32) != ref_values.view(np.uint32))
                    ),
                    "codes_differ_same_scale": float(
                        np.mean(
                            np.asarray(got.codes)[same_scale] != np.asarray(ref.codes)[same_scale]
                        )
                    )
                    if same_scale.any()
                    else 0.0,
                }
            )
    return {"rows": rows, "blocks": int(x.shape[0])}
