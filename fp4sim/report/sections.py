"""The report's sections: one ``section_*(sizes) -> Section`` per topic, and :data:`SECTIONS`.

A section sets the numbers of its experiments (:mod:`fp4sim.report.experiments`) beside what the
papers and libraries report, or what follows from the definitions
(:data:`fp4sim.report.claims.EXPECTED`, cited with :func:`fp4sim.report.claims.cite`) in Markdown
tables, names the
figures that show them (:data:`fp4sim.report.figures.FIGURES` keys) and records its numbers for
``results.json``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fp4sim.report.claims import EXPECTED, cite, preset_source
from fp4sim.report.experiments import (
    CONVERTER_LABELS,
    experiment_bit_identity,
    experiment_code_match,
    experiment_consistency,
    experiment_exp2,
    experiment_formats,
    experiment_leak,
    experiment_libraries,
    experiment_normalization_examples,
    experiment_normalization_routes,
    experiment_route_errors,
    experiment_scale_rules,
)
from fp4sim.report.sizes import Sizes
from fp4sim.report.tables import Section, Table, percent

__all__ = [
    "section_formats",
    "section_scale_rules",
    "section_exp2",
    "section_normalization",
    "section_code_match",
    "section_route_errors",
    "section_leak",
    "section_consistency",
    "section_bit_identity",
    "section_libraries",
    "SECTIONS",
]


def section_formats(sizes: Sizes) -> Section:
    r = experiment_formats()
    spec_rows = tuple(
        (
            s["name"],
            s["bits"],
            s["ebits"],
            s["mbits"],
            s["bias"],
            s["max"],
            s["min_normal"],
            s["min_subnormal"],
            s["eps"],
            s["inf"],
            s["nan"],
            s["ml_dtypes"],
        )
        for s in r["specs"]
    )
    grid_rows = tuple(
        (f"0x{int(c):X}", f"{int(c):04b}", float(v))
        for c, v in zip(r["e2m1_codes"], r["e2m1_values"])
    )
    mags = sorted({abs(float(v)) for v in r["e2m1_values"]})
    rne_rows = tuple(
        (float(a), want, float(got), float(got) == want)
        for (a, want), got in zip(EXPECTED["e2m1_rne_examples"], r["rne_outputs"])
    )
    return Section(
        key="formats",
        title="Element formats and the E2M1 grid",
        intro="Spec numbers are derived from each format's bit layout (`fp4sim.formats.spec`); the "
        "values are decoded by `fp4sim.decode` from every code.",
        tables=(
            Table(
                title="Format specifications",
                columns=(
                    "format",
                    "bits",
                    "e",
                    "m",
                    "bias",
                    "max",
                    "min normal",
                    "min subnormal",
                    "eps",
                    "has Inf",
                    "has NaN",
                    "ml_dtypes",
                ),
                rows=spec_rows,
                source=f"{cite('OCP MX v1.0')}, {cite('NVFP4')}: E2M1 max 6, min normal 1, min subnormal 0.5; "
                "E4M3 max 448, 2^-6, 2^-9; E5M2 max 57344, 2^-14, 2^-16; UE8M0 2^-127 .. 2^127, 0xFF NaN.",
            ),
            Table(
                title="Every E2M1 code",
                columns=("code", "bits s.ee.m", "value"),
                rows=grid_rows,
                source=f"{cite('OCP MX v1.0')}: magnitudes {list(EXPECTED['e2m1_magnitudes'])}.",
                note=f"fp4sim magnitudes: {mags} — "
                f"{'identical to' if tuple(mags) == EXPECTED['e2m1_magnitudes'] else 'DIFFERENT from'} "
                "the specification.",
            ),
            Table(
                title="E2M1 round-to-nearest-even, saturating: every tie, and beyond max",
                columns=("input", "expected", "fp4sim", "agree"),
                rows=rne_rows,
                source=f"{cite('NVFP4')} `cvt.rn.satfinite.e2m1x2.f32`: ties go to the even code "
                "(0, 1, 2, 4); beyond the maximum saturates to 6.",
            ),
        ),
        figures=("e2m1_grid",),
        numbers={
            "e2m1_values": r["e2m1_values"],
            "rne_outputs": r["rne_outputs"],
            "rne_all_agree": all(row[-1] for row in rne_rows),
        },
    )


def section_scale_rules(sizes: Sizes) -> Section:
    r = experiment_scale_rules(sizes)
    said = {
        "FLOOR": None,
        "RCEIL": "0 (never clips)",
        "CEIL": "0 (never clips)",
        "EVEN": "— (not stated)",
    }
    rows = tuple(
        (
            d["format"],
            d["rule"],
            percent(d["clip_rate"]),
            percent(d["mantissa_rule_predicts"]) if d["rule"] == "FLOOR" else said[d["rule"]],
            f"{d['rel_l2']:.4f}",
            f"{d['max_elem_rel_err']:.4f}",
        )
        for d in r["rows"]
    )
    ex_rows = tuple(
        (d["format"], d["amax"], d["rule"], d["scale"], d["scaled"], d["dequantized"])
        for d in r["examples"]
    )
    nv_rows = tuple((d["format"], d["scale"], d["dequantized"]) for d in r["nvfp4"])
    return Section(
        key="scale_rules",
        title="Block-scale rules: OCP floor vs round-up",
        intro=f"{sizes.scale_blocks} blocks of 32 standard-normal float32 values, quantized by "
        "`fp4sim.formats.blocks.quantize` with each UE8M0 scale rule. A block clips when its largest "
        "magnitude exceeds the element maximum times the chosen scale (so the saturating "
        "element cast changes it).",
        tables=(
            Table(
                title="Clipping rate and error per scale rule",
                columns=(
                    "format",
                    "rule",
                    "blocks clipped",
                    "mantissa rule predicts",
                    "rel. L2 error",
                    "mean rel. error of the block max",
                ),
                rows=rows,
                source=f"{cite('OCP MX v1.0')}, {cite('microxcaling')}: OCP's floor rule puts amax/2^s in [2^emax, 2^(emax+1)), so the "
                "block max clips exactly when amax's mantissa exceeds 1.75 (E4M3) or 1.5 "
                f"(E2M1); {cite('TransformerEngine')}/{cite('cuDNN')}'s round-up rule (and ceil) "
                "never clips. The prediction column counts those mantissas in the same data; "
                f"{cite('torchao')}'s EVEN rule rounds amax's mantissa first, then floors.",
            ),
            Table(
                title="Worked examples",
                columns=("format", "amax", "rule", "scale", "amax / scale", "dequantized max"),
                rows=ex_rows,
                source="expected (closed form): amax 500 (E4M3): floor 2^0 → clamps to 448, ceil 2^1 → 250; amax 1.0: both "
                "2^-8 → 256; amax 7 (E2M1): floor 2^0 → clamps to 6, ceil 2^1 → 3.5.",
            ),
            Table(
                title="NVFP4: E4M3 scale rounding can clip the block max",
                columns=("format", "E4M3 block scale", "dequantized 2.9"),
                rows=nv_rows,
                source="expected (closed form): amax 2.9 without a global factor: RN_E4M3(2.9/6) = 0.46875 → 6.19 saturates "
                "to 6 → 2.8125 (−3 %); with the per-tensor factor the scale is 448 and 2.9 is "
                "exact.",
            ),
        ),
        figures=("scale_rule_clipping",),
        numbers={"rows": r["rows"], "examples": r["examples"], "nvfp4": r["nvfp4"]},
    )


def section_exp2(sizes: Sizes) -> Section:
    r = experiment_exp2(sizes)
    rows = (
        (
            "FA4 polynomial `exp2_fa4`",
            "relative error vs float64 2^x",
            f"[{r['fa4_rel_min']:.3e}, {r['fa4_rel_max']:.3e}]",
            "[−8.52e-5, +8.76e-5] (float64 poly); 8.77e-5 max (float32 Horner); assert ≤ 9e-5",
            r["fa4_abs_max"] <= 9e-5,
        ),
        (
            "correctly rounded `exp2_rn`",
            "float32 results different from float64 exp2 rounded to float32",
            f"{r['rn_mismatches']} of {r['n']}",
            '— (fp4sim\'s definition of "exact")',
            r["rn_mismatches"] == 0,
        ),
    )
    return Section(
        key="exp2",
        title="exp2 models",
        intro=f"{r['n']} float32 points evenly spaced on [−126, 0). `exp2_fa4` is FA4's degree-3 "
        f"polynomial with the integer exponent add ({cite('FlashAttention-4')} `flash_attn/cute`), bit-exact including the FMAs; "
        "`exp2_rn` is the correctly rounded float32 exp2 fp4sim uses as the exact converter's "
        "exponential.",
        tables=(
            Table(
                title="Accuracy of the exp2 models",
                columns=("model", "measure", "fp4sim", "expected", "within the bound"),
                rows=rows,
                source="expected (an independent float64 evaluation of the polynomial): the "
                "degree-3 polynomial's relative error on frac ∈ [0, 1) lies in "
                "[−8.52e-5, +8.76e-5].",
            ),
        ),
        figures=("exp2_error",),
        numbers={k: v for k, v in r.items() if not k.startswith("curve")},
    )


def section_normalization(sizes: Sizes) -> Section:
    r = experiment_normalization_examples()
    rr = experiment_normalization_routes(sizes)
    route_rows = tuple(
        (
            f"`{key.split('/')[0]}`",
            key.split("/")[1].lower(),
            f"{e['cosine']:.4f}",
            f"{e['rel_l2']:.4f}",
        )
        for key, e in rr["errors"].items()
    )
    rows = []
    for vals, outs in r["outputs"].items():
        for name in ("EXACT", "CONSISTENT", "MISMATCHED"):
            want = EXPECTED["norm_outputs"][vals][name]
            rows.append(
                (
                    f"V = {list(vals)}",
                    name.lower(),
                    want,
                    outs[name],
                    abs(outs[name] - want) < 1e-12,
                )
            )
    den_rows = tuple(
        (
            name.lower().replace("_", " "),
            f"{EXPECTED['ftz_denominator'][name]:.8g}"
            if name in EXPECTED["ftz_denominator"]
            else "—",
            f"{got:.8g}",
            (got == EXPECTED["ftz_denominator"][name])
            if name == "PER_ELEMENT"
            else (
                abs(got - EXPECTED["ftz_denominator"][name])
                <= 1e-7 * EXPECTED["ftz_denominator"][name]
                if name in EXPECTED["ftz_denominator"]
                else "—"
            ),
        )
        for name, got in r["denominators"].items()
    )
    return Section(
        key="normalization",
        title="Represented-weight normalization",
        intro="The two-key example: exact weights w = [1, 0.4] in one block with α = 1 go through "
        "the exact Direct-P converter (`direct_p_payload`), which gives E2M1 payloads "
        f"{r['payload'].tolist()} and represented weights "
        f"[{', '.join(f'{x:.6g}' for x in r['represented'])}]; `normalize` then forms the "
        "three outputs.",
        tables=(
            Table(
                title="Outputs of the three normalizers",
                columns=("values", "normalizer", "expected", "fp4sim", "agree"),
                rows=tuple(rows),
                source="expected (closed form): payloads [6, 2] → w̃ = [1, 1/3]; V = [2, 2]: exact 2, consistent 2, "
                "mismatched 40/21 = 1.904762; V = [0, 6]: exact 12/7 = 1.714286, consistent 1.5, "
                "mismatched 10/7 = 1.428571. Only the consistent normalizer reproduces a constant V.",
            ),
            Table(
                title=f"The Direct-P routes with only the normalizer changed (Gaussian, S = {rr['seq_len']})",
                columns=("route", "normalizer", "cosine", "relative L2"),
                rows=route_rows,
                source=f"{cite('HW-FP4 FA4')}: Direct-P uses the consistent normalizer (a convex "
                "combination that keeps a constant V exact); the paper gives no error comparison "
                "on random inputs.",
            ),
            Table(
                title="Flush-to-zero and the order of the block denominator",
                columns=("order", "expected", "fp4sim (float32, FTZ)", "agree"),
                rows=den_rows,
                source="expected (closed form): α = 2^-126, sixteen payloads 0.5: per-element products flush to 0; "
                "summing the payloads first gives (8/6)·2^-126 = 1.5673258e-38.",
            ),
        ),
        numbers={
            "outputs": {str(list(k)): v for k, v in r["outputs"].items()},
            "represented": r["represented"],
            "denominators": r["denominators"],
            "route_errors": rr["errors"],
        },
    )


def section_code_match(sizes: Sizes) -> Section:
    r = experiment_code_match(sizes)
    rows = []
    for name, label in CONVERTER_LABELS.items():
        want_grid = EXPECTED["code_match_grid"].get(name)
        claimed = EXPECTED["code_match_claimed"].get(name)
        want_text = (f"{percent(want_grid)}" if want_grid is not None else "—") + (
            f"; claimed {percent(claimed)}" if claimed is not None else ""
        )
        want_att = EXPECTED["code_match_attention"].get(name)
        rows.append(
            (
                label,
                percent(r["grid"][name]),
                want_text,
                percent(r["attention"][name]),
                f"{percent(want_att)}" if want_att is not None else "—",
                percent(r["attention_nonzero"][name]),
            )
        )
    sch_rows = tuple(
        (f"Schraudolph (shift 0.0576) in {fmt}", percent(v["grid"]), percent(v["attention"]))
        for fmt, v in r["schraudolph"].items()
    )
    table_rows = tuple(
        (xv, ev, eg, av, ag, ev == eg and av == ag) for xv, ev, eg, av, ag in r["table"]
    )
    return Section(
        key="code_match",
        title="Converters: code maps and code-match rates",
        intro=f"Grid: {sizes.grid_points} points uniform on [−6, log2 6) in the Direct-P coordinate x "
        "(`direct_p_payload` of each converter against the exact one). Attention-like: "
        f"{sizes.attn_rows} rows × {sizes.attn_keys} keys of Gaussian Q·Kᵀ/√{sizes.head_dim}, "
        "t = log2-domain scores against the row max, 32-key blocks with k_B = ceil(block max) "
        f"(`convert_tile` with the HW-FP4 Direct-P recipe; {percent(r['exact_zero_fraction'])} of the "
        "exact codes are 0 there).",
        tables=(
            Table(
                title="Code-match rate against the exact converter (E2M1 payload codes)",
                columns=(
                    "converter",
                    "grid",
                    "expected (grid)",
                    "attention-like",
                    "expected (attention)",
                    "attention-like, non-zero exact codes",
                ),
                rows=tuple(rows),
                source=f"claimed: Direct-P affine 63.3 % ({cite('HW-FP4 FA4')}) and Mitchell-P 98.7 % "
                f"({cite('FLAMIA')}); expected (an independent float64 computation): 63.29 % / "
                "98.67 % on an 8,000,000-point uniform grid on [−6, log2 6) and 43.8 % (26.3 % "
                "non-zero) / 97.98 % on a Gaussian-logit simulation (d 128, N 4096, 256 rows); "
                "Mitchell shift 0 → 95.161 %, 0.0576 → 98.504 %.",
            ),
            Table(
                title="Schraudolph's integer exp2 for 8/16-bit P against exact rounding",
                columns=("converter", "t uniform on [−6, 0)", "attention-like"),
                rows=sch_rows,
                source=f"{cite('FLAMIA')}: used for BF16 / 8-bit P on some element pairs; no "
                "code-match rate is published.",
            ),
            Table(
                title="Direct-P affine behaviour table",
                columns=(
                    "x",
                    "expected exact",
                    "fp4sim exact",
                    "expected affine",
                    "fp4sim affine",
                    "agree",
                ),
                rows=table_rows,
                source=f"expected (closed form from {cite('HW-FP4 FA4')}'s u = 1.5·x + 1.2): x = 0 → u 1.2 → code 1 (exact 1); x = 1 → u 2.7 → 3 (exact 2).",
            ),
        ),
        figures=("converter_code_maps",),
        numbers={
            "grid": r["grid"],
            "attention": r["attention"],
            "attention_nonzero": r["attention_nonzero"],
            "schraudolph": r["schraudolph"],
        },
    )


def section_route_errors(sizes: Sizes) -> Section:
    r = experiment_route_errors(sizes)
    big = sizes.seq_lens[-1]
    rows = []
    for name in r["presets"]:
        e = r["by_len"][name][big]
        rows.append(
            (
                f"`{name}`",
                preset_source(name),
                f"{e['cosine']:.4f}",
                f"{e['rel_l2']:.4f}",
                EXPECTED["route_errors"].get(name, "—"),
            )
        )
    len_rows = tuple(
        (f"`{n}`", *[f"{r['by_len'][n][s]['rel_l2']:.4f}" for s in sizes.seq_lens])
        for n in r["presets"]
    )
    tile_rows = tuple(
        (f"`{n}`", *[f"{r['by_tile'][n][b]['rel_l2']:.4f}" for b in sizes.block_sizes])
        for n in r["presets"]
    )
    return Section(
        key="route_errors",
        title="Error of each published route against exact attention",
        intro=f"One head, Q, K, V standard normal (D = {sizes.head_dim}), softmax scale 1/√D, non-causal; "
        "each preset of `fp4sim.attention.PRESETS` through the tiled forward emulator "
        "(`attention_forward`, NumPy) against the float64 reference (`attention_reference`); "
        "errors by `error_summary`.",
        tables=(
            Table(
                title=f"Output error at S = {big} (key tile 128)",
                columns=("route (preset)", "source", "cosine", "relative L2", "published"),
                rows=tuple(rows),
                source=f"{cite('HW-FP4 FA4')}: Direct-P rel-L2 0.3366, cosine ≈ 0.944 (shape and "
                f"reference not stated); {cite('HAO flash-attention-fp4')} README: cosine 0.990 "
                "(NVFP4 QK), 0.9985 (MXFP8 QK + FP8 PV), 0.9817 (NVFP4 QK + NVFP4 PV), 0.990 "
                "(NVFP4 + MXFP8 PV) against BF16 on N(0, 1) Q/K/V.",
            ),
            Table(
                title="Relative L2 error over sequence length (key tile 128)",
                columns=("route", *[f"S = {s}" for s in sizes.seq_lens]),
                rows=len_rows,
                source="— (the papers report one shape only).",
            ),
            Table(
                title=f"Relative L2 error over the key-tile size (S = {r['mid']})",
                columns=("route", *[f"tile {b}" for b in sizes.block_sizes]),
                rows=tile_rows,
                source="— (128-key tiles as in FlashAttention-4; the tile moves the running max, so every "
                "block anchor, and changes the numbers).",
            ),
        ),
        figures=("route_errors",),
        numbers={"by_len": r["by_len"], "by_tile": r["by_tile"]},
    )


def section_leak(sizes: Sizes) -> Section:
    r = experiment_leak(sizes)
    targets = ", ".join(sorted({str(d["target"]) for d in r["rows"]}))
    gains = ", ".join(sorted({f"{d['gain']:g}" for d in r["rows"]}))
    want = EXPECTED["leak_table"]
    rows = []
    for i, d in enumerate(r["rows"]):
        s_o, s_dq, s_cls, flamia = want[i] if i < len(want) else ("—", "—", "—", "")
        cls = d["class"] + (" (VACUOUS)" if d["vacuous"] else "")
        rows.append((d["name"], d["leak_o"], d["leak_dq"], cls, s_o, s_dq, s_cls, flamia or "—"))
    return Section(
        key="leak",
        title="Causal leak through shared scales",
        intro=f"`leak_probe` (the perturbation probe of {cite('FLAMIA')}) on each configuration of `fp4sim.attention.LEAK_TABLE` "
        f"with its defaults: N = {sizes.leak_tokens} tokens, future token j* = {targets} with its "
        f"input scaled by g = {gains}; "
        "leak = max relative change of the rows before j* of O and dQ, 0 only when those rows are "
        "bitwise identical. A probe in which no scale changed is marked VACUOUS.",
        tables=(
            Table(
                title="Leak per V / dS configuration",
                columns=(
                    "configuration",
                    "leak_O",
                    "leak_dQ",
                    "class",
                    "expected leak_O",
                    "expected leak_dQ",
                    "expected class",
                    "FLAMIA (published)",
                ),
                rows=tuple(rows),
                source="expected: an independent float64 emulation (N 128, d 64, NVFP4 Q/K per "
                "token, exact P, consistent normalization, g = 4); published: "
                f"{cite('FLAMIA')}'s measurements; tests assert the class (exactly 0 / tiny "
                "< 1e-4 / large > 1e-3), not the magnitudes.",
            ),
        ),
        figures=("leak_classes",),
        numbers={"rows": r["rows"]},
    )


def section_consistency(sizes: Sizes) -> Section:
    r = experiment_consistency(sizes)
    two = tuple(
        (
            name.lower(),
            [round(float(x), 6) for x in d["p"]],
            d["o"],
            [round(float(x), 6) for x in d["ds"]],
            d["sum"],
            EXPECTED["ds_row_sum"][name],
        )
        for name, d in r["two_key"].items()
    )

    def verdict(c: dict[str, Any]) -> str:
        if c["variant"] == "matched":
            if c["ok"]:
                return "consistent"
            why = (
                " (mismatched normalizer: Σ P̃ ≠ 1 by design)"
                if c["normalization"] == "MISMATCHED"
                else ""
            )
            return "FAILS: " + ", ".join(c["failed"]) + why
        if c["ok"]:
            return "no-op here (O and gradients bitwise unchanged)" if c["noop"] else "NOT DETECTED"
        return "detected: " + ", ".join(c["failed"])

    rows = tuple(
        (c["recipe"], c["variant"], c["p_bitwise"], c["delta_ok"], c["ds_row_sum_ok"], verdict(c))
        for c in r["checks"]
    )
    return Section(
        key="consistency",
        title="Forward/backward consistency",
        intro="The softmax-gradient invariant Σ_j dS_ij = 0 holds only when D = rowsum(dO∘O) comes from the "
        "same P̃ as dS and Σ_j P̃_ij = 1 (consistent normalization). Below: the two-key case, "
        f"then `check_consistency` (N = {sizes.leak_tokens}, head dim 64, causal) of each matched "
        "training preset and of each named deliberate mismatch (`with_mismatch`).",
        tables=(
            Table(
                title="Two keys: w = [1, 0.4], V = [0, 6], dO = 1",
                columns=("normalizer", "P̃", "O = D", "dS", "Σ dS", "expected Σ dS"),
                rows=two,
                source="expected (closed form): consistent P̃ = [0.75, 0.25], O = D = 1.5, dS = [−1.125, +1.125], Σ dS = 0; "
                "mismatched P̃ = [0.7143, 0.2381], O = D = 1.428571, dS = [−1.020408, +1.088435], "
                "Σ dS = 0.068027.",
            ),
            Table(
                title="Consistency checks of the training presets and the deliberate mismatches",
                columns=(
                    "preset",
                    "variant",
                    "P̃ bitwise",
                    "D from the same P̃",
                    "Σ dS = 0",
                    "verdict",
                ),
                rows=rows,
                source=f"{cite('FLAMIA')} and {cite('Attn-QAT')} (the conditions as fp4sim states them): a causal training route needs (i) backward P̃ bit-identical to the "
                "forward's, (ii) D from the same P̃, (iii) scales of row i depending on tokens ≤ i.",
            ),
        ),
        numbers={
            "two_key_sums": {k: v["sum"] for k, v in r["two_key"].items()},
            "checks": r["checks"],
        },
    )


def section_bit_identity(sizes: Sizes) -> Section:
    r = experiment_bit_identity(sizes)
    rows = tuple((d["what"], d["n"], d["same"]) for d in r["rows"])
    return Section(
        key="bit_identity",
        title="NumPy and jax.jit give the same bits",
        intro="Every emulator is written once against an array namespace. Here each one runs on NumPy "
        "and under `jax.jit` on this CPU, whose XLA backend flushes float32 subnormals, and the "
        "results are compared as bytes. Inputs: 4096 float32 values spread over 2^-140 .. 2^20 "
        "with ±0, ±Inf and subnormals; Gaussian Q, K, V (1, 128, 64) for the forward.",
        tables=(
            Table(
                title="Bitwise identity, NumPy vs jax.jit",
                columns=("emulator", "elements", "identical"),
                rows=rows,
                source="— (fp4sim's own promise: NumPy and jitted JAX results are bit-identical, "
                "independent of XLA's flush-to-zero and FMA choices).",
            ),
        ),
        numbers={"rows": r["rows"], "all_identical": all(d["same"] for d in r["rows"])},
    )


def section_libraries(sizes: Sizes) -> Section:
    r = experiment_libraries(sizes)
    rows = tuple(
        (
            d["preset"],
            d["reference"],
            percent(d["scales_differ"]),
            percent(d["values_differ"]),
            percent(d["codes_differ_same_scale"]),
        )
        for d in r["rows"]
    )
    return Section(
        key="libraries",
        title="Where the libraries' quantizers disagree",
        intro=f"{r['blocks']} blocks of 32 float32 values (Gaussian with per-block magnitudes 2^-20 .. 2^20; a "
        "quarter of the blocks made of exact E2M1/E4M3 tie midpoints) quantized with the presets of "
        "`fp4sim.formats.presets`, each of which reproduces one library's quantizer bit for bit "
        "(checked against stored torchao vectors and the installed JAX in the formats tests).",
        tables=(
            Table(
                title="How often each preset differs from the reference preset",
                columns=(
                    "preset",
                    "compared with",
                    "scale codes differ",
                    "dequantized values differ",
                    "element codes differ where the scales agree",
                ),
                rows=rows,
                source=f"{cite('OCP MX v1.0')} ({cite('microxcaling')}) floors the scale exponent and "
                f"rounds elements to nearest with ties away; {cite('TransformerEngine')}/"
                f"{cite('cuDNN')} round the scale up (RCEIL); {cite('torchao')} offers FLOOR, "
                "RCEIL, CEIL, EVEN; NVFP4 libraries differ in the order of the FP32 operations.",
            ),
        ),
        numbers={"rows": r["rows"]},
    )


# --- the section registry and the driver ----------------------------------------------------------------

SECTIONS: dict[str, Callable[[Sizes], Section]] = {
    "formats": section_formats,
    "code_match": section_code_match,
    "scale_rules": section_scale_rules,
    "libraries": section_libraries,
    "exp2": section_exp2,
    "normalization": section_normalization,
    "route_errors": section_route_errors,
    "leak": section_leak,
    "consistency": section_consistency,
    "bit_identity": section_bit_identity,
}
