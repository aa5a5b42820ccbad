"""The main job: a ``--quick`` reproduce run writes the report, its JSON and its figures, and its
numbers equal what the public emulators give when the tests call them directly (one source of
truth: the report only calls the library)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import fp4sim
from fp4sim import report


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    path = report.reproduce(out, sizes=report.QUICK, progress=False)
    return out, path.read_text(), json.loads((out / "results.json").read_text())


def test_writes_every_section_table_and_figure(quick_run):
    from fp4sim.figures import FIGURES

    out, text, results = quick_run
    assert set(results["sections"]) == set(report.SECTIONS)
    drawn = {f for fn in report.SECTIONS.values() for f in fn(report.QUICK).figures}
    assert drawn == set(FIGURES), "every figure is part of the report"
    for fn in report.SECTIONS.values():
        section = fn(report.QUICK)  # cached experiments: cheap the second time
        assert f"## {section.title}" in text
        for table in section.tables:
            assert f"**{table.title}**" in text
            assert table.source, f"table {table.title!r} does not say what it is set beside"
        for fig in section.figures:
            png = out / "figures" / FIGURES[fig].filename
            assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
            assert f"figures/{FIGURES[fig].filename}" in text
    assert "| NaN |" not in text and "| NaN" not in text, "a NaN leaked into a table of the report"
    import re

    headings = {report.anchor(h) for h in re.findall(r"^## (.+)$", text, flags=re.M)}
    links = set(re.findall(r"\]\(#([^)]+)\)", text))
    assert links and links <= headings, f"links to no heading: {links - headings}"


_SIZES_OK = dict(
    name="x",
    grid_points=1,
    attn_rows=1,
    attn_keys=1,
    head_dim=1,
    seq_lens=(1,),
    block_sizes=(1,),
    scale_blocks=1,
    leak_tokens=1,
    jit_presets=1,
    seeds=2,
    study_seq_len=1,
    study_scales=(1.0,),
)


def test_sizes_are_validated():
    report.Sizes(**_SIZES_OK)  # the valid base of the cases below
    for field, bad, match in (
        ("grid_points", 0, "grid_points"),
        ("seq_lens", [1], "seq_lens"),
        ("seeds", 0, "seeds"),
        ("study_seq_len", 0, "study_seq_len"),
        ("study_scales", (), "study_scales"),
        ("study_scales", (1.0, -2.0), "study_scales"),
        ("study_scales", (float("inf"),), "study_scales"),
        ("seq_lens", (10_000,), "seed stride"),
    ):
        with pytest.raises(ValueError, match=match):
            report.Sizes(**{**_SIZES_OK, field: bad})
    with pytest.raises(TypeError, match="sizes"):
        report.reproduce("/nonexistent", sizes="quick")
    with pytest.raises(ValueError, match="sections"):
        report.reproduce("/nonexistent", sections=["nope"])


def test_default_out_dir_is_fresh(tmp_path, monkeypatch):
    import datetime as dt

    monkeypatch.chdir(tmp_path)
    now = dt.datetime(2026, 11, 29, 10, 0, 0)
    first = report.default_out_dir(now)
    assert first.name == "fp4sim-report-20261129-100000"
    first.mkdir()
    assert report.default_out_dir(now).name == "fp4sim-report-20261129-100000-1"


# --- the report's numbers are the library's numbers ------------------------------------------------


def test_formats_numbers(quick_run):
    nums = quick_run[2]["sections"]["formats"]["numbers"]
    codes = fp4sim.all_codes(fp4sim.E2M1)
    want = fp4sim.decode(codes, fp4sim.E2M1)
    got = np.array([float(v) for v in nums["e2m1_values"]], dtype=np.float32)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert nums["rne_all_agree"] is True


def _section(quick_run, key):
    return quick_run[2]["sections"][key]["numbers"]


def test_code_match_numbers(quick_run):
    nums = _section(quick_run, "code_match")
    x = fp4sim.uniform_grid(report.QUICK.grid_points)
    for name, conv in (
        ("affine", fp4sim.AffineP()),
        ("mitchell_boundary", fp4sim.MitchellP()),
        ("mitchell_s0", fp4sim.MitchellP(shift=0.0)),
    ):
        assert nums["grid"][name] == fp4sim.code_match_rate(conv, fp4sim.ExactP(), x)
    # and they are the published grid rates to within the grid's resolution
    assert abs(nums["grid"]["affine"] - 0.632884) < 2e-4
    assert abs(nums["grid"]["mitchell_boundary"] - 0.98671) < 2e-4


def test_seed_values():
    q = report.QUICK
    assert q.seeds >= 2, "--quick needs at least two seeds for a real spread"
    assert q.seed_values[0] == q.seed and len(set(q.seed_values)) == q.seeds
    assert report.DEFAULT.seed_values[: q.seeds] == q.seed_values


def test_route_error_numbers(quick_run):
    nums = _section(quick_run, "route_errors")
    assert nums["seeds"] == list(report.QUICK.seed_values)
    s = report.QUICK.seq_lens[-1]
    for name in ("hw_fp4_direct_p", "hao_log_mxfp8"):
        got = nums["by_len"][name][str(s)]
        for i, seed in enumerate(report.QUICK.seed_values):
            q, k, v = report.gaussian_qkv(s, report.QUICK.head_dim, seed + s)
            ref = fp4sim.attention_reference(*(a.astype(np.float64) for a in (q, k, v))).out
            out = fp4sim.attention_forward(q, k, v, fp4sim.attention.PRESETS[name]).out
            e = fp4sim.error_summary(out, ref)
            sp = got["spread"]
            assert sp["cosine"]["per_seed"][i] == float(e.cosine)
            assert sp["rel_l2"]["per_seed"][i] == float(e.rel_l2)
            r = np.linalg.norm(out.astype(np.float64)) / np.linalg.norm(ref)
            assert sp["norm_ratio"]["per_seed"][i] == float(r)
        for metric in ("cosine", "rel_l2", "norm_ratio"):
            per_seed = got["spread"][metric]["per_seed"]
            assert len(per_seed) == report.QUICK.seeds
            assert got[metric] == got["spread"][metric]["mean"] == float(np.mean(per_seed))
            assert got["spread"][metric]["std"] == float(np.std(per_seed))
        # the seeds are different draws: the spread is real
        assert got["spread"]["rel_l2"]["std"] > 0
    # the tile sweep at the middle length with tile 128 is the same case as the length sweep's
    mid = str(report.QUICK.seq_lens[len(report.QUICK.seq_lens) // 2])
    if 128 in report.QUICK.block_sizes:
        assert nums["by_tile"][name]["128"] == nums["by_len"][name][mid]


def test_code_match_attention_over_seeds(quick_run):
    nums = _section(quick_run, "code_match")
    assert nums["seeds"] == list(report.QUICK.seed_values)
    got = nums["attention_spread"]["affine"]["per_seed"]
    for i, seed in enumerate(report.QUICK.seed_values):
        x, _ = report.attention_like_x(report.QUICK, seed)
        assert got[i] == fp4sim.code_match_rate(fp4sim.AffineP(), fp4sim.ExactP(), x)
    assert nums["attention"]["affine"] == float(np.mean(got)) and len(set(got)) == len(got)
    x0, _ = report.attention_like_x(report.QUICK)  # default: the first seed
    assert got[0] == fp4sim.code_match_rate(fp4sim.AffineP(), fp4sim.ExactP(), x0)


def test_spread_and_its_format():
    s = report.spread([1.0, 3.0])
    assert (s["mean"], s["std"], s["min"], s["max"], s["n"]) == (2.0, 1.0, 1.0, 3.0, 2)
    assert s["per_seed"] == [1.0, 3.0]
    assert report.format_spread(s, 2) == "2.00 ± 1.00"
    assert report.format_spread(report.spread([0.5]), 1, as_percent=True) == "50.0 %"
    with pytest.raises(ValueError, match="values"):
        report.spread([])


# --- the Direct-P norm study -------------------------------------------------------------------


def test_norm_identity_and_the_articles_band():
    from fp4sim.report import norm_study

    # rel² = (1 − r)² + 2r(1 − cos): the roots give back the pair
    for cos, rel in ((0.944, 0.3366), (0.9418, 0.4316), (0.5, 0.9)):
        for r in norm_study.implied_norm_ratios(cos, rel):
            assert abs((1 - r) ** 2 + 2 * r * (1 - cos) - rel**2) < 1e-12
    assert norm_study.implied_norm_ratios(0.99, 0.01) == ()  # no ratio gives so small an error
    band = norm_study.article_norm_ratio_band()
    lo, hi = band["upper"]
    assert 1.0 < lo < hi < 1.02  # the article's pair: no norm bias to within 2 %
    assert norm_study.implied_norm_ratios(0.944, 0.3366)[-1] == pytest.approx(
        (lo + hi) / 2, abs=0.01
    )
    with pytest.raises(ValueError, match="cosine"):
        norm_study.implied_norm_ratios(1.5, 0.1)
    with pytest.raises(TypeError, match="rel_l2"):
        norm_study.implied_norm_ratios(0.9, float("nan"))


def test_study_inputs():
    from fp4sim.report.norm_study import InputCondition, study_qkv

    n, d, seed = 256, 64, 7
    base = report.gaussian_qkv(n, d, seed)
    for a, b in zip(study_qkv(n, d, seed), base):  # the default condition: the same bits
        assert a.dtype == np.float32 and np.array_equal(a.view(np.uint32), b.view(np.uint32))
    q, k, v = study_qkv(n, d, seed, InputCondition(score_scale=4.0, v_mean=0.5))
    assert np.array_equal(q, (base[0].astype(np.float64) * 4).astype(np.float32))
    assert np.array_equal(k, base[1])
    assert np.array_equal(v, (base[2].astype(np.float64) + 0.5).astype(np.float32))
    _, k, _ = study_qkv(n, d, seed, InputCondition(key_correlation=0.9))
    lag1 = np.mean(k[0, 1:] * k[0, :-1]) / np.mean(k[0] * k[0])
    assert abs(lag1 - 0.9) < 0.05 and abs(np.std(k) - 1) < 0.2
    q, k, _ = study_qkv(n, d, seed, InputCondition(sink_logit=8.0))
    z = (q[0] @ k[0].T).astype(np.float64) / np.sqrt(d)
    gap = z[:, 0] - np.median(z[:, 1:], axis=1)
    assert abs(np.median(gap) - 8.0) < 1.0  # key 0 scores about 8 above the rest
    for bad, exc in (
        (dict(score_scale=0.0), ValueError),
        (dict(key_correlation=1.0), ValueError),
        (dict(sink_logit=-1.0), ValueError),
        (dict(v_mean="1"), TypeError),
    ):
        with pytest.raises(exc, match=next(iter(bad))):
            InputCondition(**bad)
    with pytest.raises(TypeError, match="inputs"):
        study_qkv(n, d, seed, {"score_scale": 2.0})


def test_weight_norm_ratio():
    from fp4sim.report.norm_study import WEIGHT_ROWS, weight_norm_ratio

    n, d = 256, 64
    q, k, v = report.gaussian_qkv(n, d, 3)
    ref = fp4sim.attention_reference(*(a.astype(np.float64) for a in (q, k, v)))
    # float32 attention: the weights are the exact ones up to float32 rounding
    assert abs(weight_norm_ratio(q, k, fp4sim.attention.EXACT_F32, ref.probs) - 1) < 1e-5
    # MXFP4 V holds the identity exactly, so the preset's output rows are its normalized weights
    preset = fp4sim.attention.PRESETS["hw_fp4_direct_p"]
    eye = np.eye(n, dtype=np.float32)[None]
    w = fp4sim.attention_forward(q[:, :WEIGHT_ROWS], k, eye, preset).out
    assert np.all(w >= 0) and np.allclose(w.sum(-1), 1, atol=1e-5)
    want = np.sqrt(np.sum(w.astype(np.float64) ** 2) / np.sum(ref.probs[0, :WEIGHT_ROWS] ** 2))
    assert weight_norm_ratio(q, k, preset, ref.probs) == float(want) > 1.1


def test_study_cases_cover_every_factor():
    from fp4sim.report.norm_study import SWEEP_ROUTES, StudyFactor, study_cases

    cases = study_cases(report.QUICK)
    assert {c.factor for c in cases} == set(StudyFactor)
    scales = sorted({1.0, *report.QUICK.study_scales})
    for route in SWEEP_ROUTES:
        assert (
            sorted(
                c.inputs.score_scale
                for c in cases
                if c.route == route and c.inputs == type(c.inputs)(score_scale=c.inputs.score_scale)
            )
            == scales
        )
    base = [c for c in cases if c.factor is StudyFactor.BASELINE]
    assert len(base) == 1 and base[0].recipe == fp4sim.attention.PRESETS["hw_fp4_direct_p"]
    for c in cases:  # one factor at a time, except the crossed score sweep and the Q/K case
        if c.factor is StudyFactor.SCORE_SPREAD:
            assert c.route in SWEEP_ROUTES and c.inputs.score_scale != 1
        elif c.factor is StudyFactor.QK_SCALES:
            assert c.recipe == base[0].recipe.replace(qk=fp4sim.attention.QKFormat.FLOAT32)
        else:
            assert c.recipe == base[0].recipe or c.inputs.describe() == "Gaussian"


def test_direct_p_norm_study(quick_run):
    from fp4sim.report.norm_study import study_cases, study_qkv

    nums = _section(quick_run, "direct_p_norm")
    sz = report.QUICK
    cases = study_cases(sz)
    assert len(nums["rows"]) == len(cases) and nums["seeds"] == list(sz.seed_values)
    assert (nums["seq_len"], nums["head_dim"]) == (sz.study_seq_len, sz.head_dim)
    # the baseline on seed 0 is the library's own call on the route-error inputs
    i = next(j for j, c in enumerate(cases) if c.factor.value == "baseline")
    row, n = nums["rows"][i], sz.study_seq_len
    q, k, v = study_qkv(n, sz.head_dim, sz.seed + n)
    ref = fp4sim.attention_reference(*(a.astype(np.float64) for a in (q, k, v)))
    f = fp4sim.attention_forward(q, k, v, fp4sim.attention.PRESETS["hw_fp4_direct_p"])
    e = fp4sim.error_summary(f.out, ref.out)
    sp = row["spread"]
    assert sp["cosine"]["per_seed"][0] == float(e.cosine)
    assert sp["rel_l2"]["per_seed"][0] == float(e.rel_l2)
    assert sp["normalizer_ratio"]["per_seed"][0] == float(
        np.mean(np.exp(f.lse.astype(np.float64) - ref.lse))
    )
    for row in nums["rows"]:
        for metric in ("cosine", "rel_l2", "norm_ratio", "normalizer_ratio"):
            assert len(row["spread"][metric]["per_seed"]) == sz.seeds
            assert row[metric] == float(np.mean(row["spread"][metric]["per_seed"]))
        for c, e2, r in zip(
            *(row["spread"][m]["per_seed"] for m in ("cosine", "rel_l2", "norm_ratio"))
        ):
            assert abs((1 - r) ** 2 + 2 * r * (1 - c) - e2**2) < 1e-9  # the identity, per seed
    # the exact-sum normalizer divides by the unquantized weights of the same scores
    mism = next(r for r in nums["rows"] if r["factor"] == "normalizer")
    assert abs(mism["normalizer_ratio"] - 1) < abs(nums["rows"][i]["normalizer_ratio"] - 1)
    assert nums["closest"] and all(0 <= j < len(cases) for j in nums["closest"])
    text = quick_run[1]
    assert "rel-L2² = (1 − r)² + 2r·(1 − cos)" in text and "**Finding.**" in text


def test_disagreements_section(quick_run):
    nums = _section(quick_run, "disagreements")
    checks = {c["what"]: c for c in nums["checks"]}
    cm = _section(quick_run, "code_match")
    assert checks["code match, Direct-P affine (uniform x)"]["fp4sim"] == cm["grid"]["affine"]
    dp = _section(quick_run, "route_errors")["by_len"]["hw_fp4_direct_p"][
        str(report.QUICK.seq_lens[-1])
    ]
    assert checks["Direct-P relative L2 vs exact"]["fp4sim"] == dp["rel_l2"]
    for c in nums["checks"]:
        assert c["agrees"] == (abs(c["fp4sim"] - c["published"]) <= c["tolerance"])
    text = quick_run[1]
    body = text.split("## Where fp4sim and the articles disagree", 1)[1]
    for words in ("*Likely cause:*", "*Does it matter?*"):
        assert body.count(words) >= 2, words


def test_scale_rule_numbers(quick_run):
    rows = {(r["format"], r["rule"]): r for r in _section(quick_run, "scale_rules")["rows"]}
    rng = np.random.default_rng(report.QUICK.seed)
    x = rng.standard_normal((report.QUICK.scale_blocks, 32)).astype(np.float32)
    from fp4sim.formats import blocks

    q = blocks.quantize(x, blocks.MXFP4, rule=blocks.ScaleRule.FLOOR)
    scale = fp4sim.decode(q.scales, fp4sim.UE8M0).astype(np.float64)[:, 0]
    clipped = np.abs(x).max(-1) > 6.0 * scale
    assert rows[("MXFP4", "FLOOR")]["clip_rate"] == clipped.mean() > 0.1
    assert rows[("MXFP4", "RCEIL")]["clip_rate"] == 0.0


def test_exp2_numbers(quick_run):
    nums = _section(quick_run, "exp2")
    x = np.linspace(-126.0, 0.0, report.QUICK.grid_points, endpoint=False).astype(np.float32)
    rel = np.asarray(fp4sim.exp2_fa4(x), np.float64) / np.exp2(x.astype(np.float64)) - 1
    assert nums["fa4_rel_min"] == rel.min() and nums["fa4_rel_max"] == rel.max()
    assert nums["fa4_abs_max"] <= 9e-5  # FA4 polynomial bound
    assert nums["rn_mismatches"] == 0


def test_normalization_numbers(quick_run):
    nums = _section(quick_run, "normalization")
    for v, want in (([2.0, 2.0], (2.0, 2.0, 40 / 21)), ([0.0, 6.0], (12 / 7, 1.5, 10 / 7))):
        got = nums["outputs"][str(v)]
        for name, w in zip(("EXACT", "CONSISTENT", "MISMATCHED"), want):
            assert got[name] == float(
                fp4sim.normalize(
                    np.array([1.0, 0.4]),
                    np.array([1.0, 1 / 3]),
                    np.array(v),
                    fp4sim.Normalization[name],
                ).out
            )
            assert abs(got[name] - w) < 1e-12
    assert nums["denominators"]["PER_ELEMENT"] == 0.0
    assert nums["denominators"]["PAYLOAD_SUM_FIRST"] == float(
        np.float32(8 / 6) * np.float32(2.0**-126)
    )


def test_leak_numbers(quick_run):
    rows = _section(quick_run, "leak")["rows"]
    assert [r["name"] for r in rows] == list(fp4sim.LEAK_TABLE)
    for r in (rows[0], rows[4]):
        rep = fp4sim.leak_probe(fp4sim.LEAK_TABLE[r["name"]], n_tokens=report.QUICK.leak_tokens)
        assert (r["leak_o"], r["leak_dq"], r["vacuous"]) == (rep.leak_o, rep.leak_dq, rep.vacuous)
    assert rows[0]["class"] == "exactly 0" and rows[4]["class"] == "large"


def test_consistency_numbers(quick_run):
    nums = _section(quick_run, "consistency")
    assert nums["two_key_sums"]["CONSISTENT"] == 0.0
    assert abs(nums["two_key_sums"]["MISMATCHED"] - 0.068027) < 1e-6
    matched = [
        c
        for c in nums["checks"]
        if c["variant"] == "matched" and c["normalization"] != "MISMATCHED"
    ]
    assert matched and all(c["ok"] for c in matched)
    assert all(not c["ok"] or c["noop"] for c in nums["checks"] if c["variant"] != "matched")


def test_summary_is_in_the_report(quick_run):
    text = quick_run[1]
    numbers = {k: v["numbers"] for k, v in quick_run[2]["sections"].items()}
    for what, _, computed in report.summary_rows(numbers):
        assert f"| {what} |" in text and computed in text


def test_readme_table_is_the_report_summary(quick_run):
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    body = readme.split("## What fp4sim reproduces", 1)[1].split("\n## ", 1)[0]
    listed = [
        m.group(1).strip() for m in re.finditer(r"^\| (.+?) \| .+ \| .+ \|$", body, flags=re.M)
    ]
    numbers = {k: v["numbers"] for k, v in quick_run[2]["sections"].items()}
    assert listed[1:] == [what for what, _, _ in report.summary_rows(numbers)]  # [0] is the header


def test_bit_identity_numbers(quick_run):
    nums = _section(quick_run, "bit_identity")
    assert nums["all_identical"] is True
    assert (
        len([r for r in nums["rows"] if r["what"].startswith("attention_forward")])
        == report.QUICK.jit_presets
    )


def test_repository_figures_are_present_and_indexed():
    from pathlib import Path

    from fp4sim.report.figures import FIGURES

    repo_figures = Path(__file__).resolve().parents[1] / "figures"
    index = (repo_figures / "INDEX.md").read_text()
    for name, spec in FIGURES.items():
        assert (repo_figures / spec.filename).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        assert f"`fp4sim.report.figures.{spec.draw.__name__}`" in index
    stray = (
        {p.name for p in repo_figures.iterdir()}
        - {f.filename for f in FIGURES.values()}
        - {"INDEX.md"}
    )
    assert not stray, f"files in figures/ that no figure function makes: {stray}"


def test_library_numbers(quick_run):
    from fp4sim.formats import blocks, presets

    rows = {(r["preset"], r["reference"]): r for r in _section(quick_run, "libraries")["rows"]}
    x = report.library_inputs(report.QUICK)
    ref, ocp = (blocks.quantize(x, presets.preset(n)) for n in ("TE_MXFP8", "OCP_MXFP8_E4M3"))
    assert (
        rows[("OCP_MXFP8_E4M3", "TE_MXFP8")]["scales_differ"]
        == np.mean(ocp.scales != ref.scales)
        > 0
    )
    assert rows[("TORCHAO_MXFP8_E4M3_RCEIL", "TE_MXFP8")]["values_differ"] == 0.0


def test_provenance_in_the_report_and_the_json(quick_run):
    import jax

    import fp4sim

    prov = quick_run[2]["provenance"]
    assert (
        prov["versions"]["jax"] == jax.__version__
        and prov["versions"]["fp4sim"] == fp4sim.__version__
    )
    assert prov["git"]["revision"] and prov["jax"]["backend"] == jax.default_backend()
    assert set(prov) >= {"git", "versions", "platform", "jax", "flags", "argv"}
    text = quick_run[1]
    assert "## Provenance" in text and f"| jax | {jax.__version__} |" in text
    assert prov["git"]["revision"] in text


def test_git_revision_falls_back_to_the_environment(monkeypatch):
    from fp4sim.report import provenance as prov

    monkeypatch.setattr(prov, "_git", lambda *a: None)
    monkeypatch.setenv("FP4SIM_GIT_REVISION", "abc1234")
    assert prov.git_revision() == {"revision": "abc1234", "dirty": None, "source": "environment"}
    monkeypatch.delenv("FP4SIM_GIT_REVISION")
    assert prov.git_revision()["revision"] == "unknown"
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=false")
    p = prov.provenance(["fp4sim", "reproduce"])
    assert p["flags"]["XLA_FLAGS"] == "--xla_cpu_enable_fast_math=false" and p["argv"] == [
        "fp4sim",
        "reproduce",
    ]
    assert "`--xla_cpu_enable_fast_math=false`" in prov.provenance_markdown(p)


def test_every_published_recipe_links_its_source():
    import fp4sim

    for name in [*fp4sim.PRESETS, *fp4sim.TRAINING_PRESETS]:
        link = report.preset_source(name)
        if name in ("exact_f32", "float32"):  # fp4sim's own baselines
            assert link == "—"
        else:
            assert link.startswith("[") and "](https://" in link, (name, link)
