"""Figure, table and claim summary of a training-study record (``train_study.json``).

This module owns everything computed from the JSON record alone, so that
``python -m fp4sim train --replot RECORD`` regenerates the outputs without jax:
:func:`divergence_step` (the rule of :class:`~fp4sim.train.config.StudyConfig`),
:func:`recipe_summary` (final loss, divergence, gradient-norm statistics, leak, timing, per
recipe), :func:`table_markdown` (the table and the claims with the numbers that bear on them),
:func:`plot_curves` (the loss-curve figure: one line per recipe, the seeds' range shaded; the
difference from float32 paired by seed; the gradient norm) and
:func:`regenerate` (both, written beside the record or into another folder).
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "divergence_step",
    "common_steps",
    "recipe_summary",
    "table_markdown",
    "plot_curves",
    "regenerate",
    "FIGURE_NAME",
    "TABLE_NAME",
    "CLAIMS",
    "CLOSE_NATS",
]

FIGURE_NAME = "train_loss.png"
TABLE_NAME = "train_table.md"


def _moving_average(x: np.ndarray, w: int) -> np.ndarray:
    """Trailing mean over the last ``min(w, i + 1)`` values at each step i."""
    c = np.cumsum(np.concatenate([[0.0], np.asarray(x, np.float64)]))
    i = np.arange(1, len(x) + 1)
    lo = np.maximum(0, i - w)
    return (c[i] - c[lo]) / (i - lo)


def divergence_step(loss: Any, margin: float, smooth: int) -> int | None:
    """The first step whose loss is not finite, or whose ``smooth``-step trailing mean exceeds
    the running minimum of that mean by more than ``margin`` nats; None if there is none."""
    x = np.asarray(loss, np.float64)
    if x.size == 0:
        return None
    bad = ~np.isfinite(x)
    if bad.any():
        first_bad = int(np.argmax(bad))
        x = x[:first_bad]
    else:
        first_bad = None
    if x.size:
        ma = _moving_average(x, smooth)
        up = ma > np.minimum.accumulate(ma) + margin
        if up.any():
            return int(np.argmax(up))
    return first_bad


def _stats(values: list[float]) -> tuple[float, float]:
    a = np.asarray(values, np.float64)
    return float(np.mean(a)), float(np.std(a, ddof=1)) if a.size > 1 else 0.0


def common_steps(record: dict[str, Any]) -> int:
    """The step count every trained recipe reached (the table compares recipes there)."""
    counts = [
        len(r["loss"][0])
        for r in record["recipes"].values()
        if r.get("loss") and "skipped" not in r
    ]
    return min(counts) if counts else 0


def recipe_summary(record: dict[str, Any], name: str) -> dict[str, Any]:
    """Per-recipe numbers of the table (from the record only), the curves cut at
    :func:`common_steps` so that every recipe is compared after the same number of steps."""
    cfg = record["config"]
    r = record["recipes"][name]
    out: dict[str, Any] = {"name": name, "label": r.get("label", name)}
    if not r.get("loss") or "skipped" in r:
        out["skipped"] = r.get("skipped", "not run")
        return out
    smooth, margin = int(cfg["smooth"]), float(cfg["divergence_margin"])
    common = common_steps(record)
    loss = [np.asarray(s, np.float64)[:common] for s in r["loss"]]
    gn = [np.asarray(s, np.float64)[:common] for s in r["grad_norm"]]
    tail = max(1, min(smooth, common))
    finals = [float(np.mean(s[-tail:])) for s in loss]
    out["final_loss"] = _stats(finals)
    out["finals"] = finals
    out["diverged"] = [divergence_step(s, margin, smooth) for s in loss]
    nan = [math.nan] * len(loss)
    own, f32 = r.get("val_loss_own", nan), r.get("val_loss_float32", nan)
    out["val_own"] = _stats(own)
    out["val_own_seeds"] = list(own)
    out["val_float32"] = _stats(f32)
    out["dual_gap"] = _stats([a - b for a, b in zip(own, f32)])
    allg = np.concatenate(gn) if gn else np.zeros(0)
    fin = allg[np.isfinite(allg)]
    out["grad_norm"] = {
        "median": float(np.median(fin)) if fin.size else math.nan,
        "p99": float(np.percentile(fin, 99)) if fin.size else math.nan,
        "max": float(np.max(fin)) if fin.size else math.nan,
        "final": float(np.mean([np.mean(s[-tail:]) for s in gn])),
    }
    out["steps"] = r["steps"]
    out["truncated"] = r.get("truncated", False)
    lf = r.get("leak_final") or {
        "loss_equal": [False],
        "grad_equal": [False],
        "loss_rel": [math.nan],
        "grad_rel": [math.nan],
        "future_changed": [False],
    }
    out["leak"] = {
        "loss_equal": all(lf["loss_equal"]),
        "grad_equal": all(lf["grad_equal"]),
        "loss_rel": max(lf["loss_rel"]),
        "grad_rel": max(lf["grad_rel"]),
        "future_changed": all(lf["future_changed"]),
    }
    li = r.get("leak_init")
    if li:
        out["leak_init"] = {
            "loss_equal": all(li["loss_equal"]),
            "grad_equal": all(li["grad_equal"]),
        }
    out["operator_probe"] = r.get("operator_probe")
    out["leak_class"] = r.get("leak_class", {})
    out["deterministic"] = (r.get("determinism") or {}).get("bitwise_equal")
    timing = record.get("timing", {})
    out["ratio"] = timing.get("ratio_to_jnp_float32", {}).get(name)
    out["steps_per_s"] = timing.get("steps_per_s", {}).get(name)
    comp = timing.get("compile", {}).get("per_recipe", {}).get(name, {})
    out["compile_s"] = (comp.get("trace_lower_s"), comp.get("xla_compile_s"))
    out["accumulation"] = r.get("accumulation", record.get("accumulation", "?"))
    return out


def _pm(ms: tuple[float, float], digits: int = 3) -> str:
    m, s = ms
    if not math.isfinite(m):
        return "nan"
    return f"{m:.{digits}f} ± {s:.{digits}f}"


def _div(d: list[int | None]) -> str:
    hit = [x for x in d if x is not None]
    if not hit:
        return f"0/{len(d)}"
    return f"{len(hit)}/{len(d)} (step {min(hit)})"


def _leak_text(s: dict[str, Any]) -> str:
    lk = s["leak"]
    if not lk["future_changed"]:
        return "vacuous"
    if lk["loss_equal"] and lk["grad_equal"]:
        return "none (equal)"
    return f"loss {lk['loss_rel']:.1e}, grad {lk['grad_rel']:.1e}"


def _probe_text(p: dict[str, Any] | None) -> str:
    if not p:
        return "—"
    return f"{p['leak_o']:.1e} / {p['leak_dq']:.1e}"


def _classes(c: dict[str, str]) -> str:
    shared = [f"{k}:{v.lower()}" for k, v in c.items() if v != "NONE"]
    return ", ".join(shared) if shared else "none"


CLAIMS: tuple[dict[str, Any], ...] = (
    {
        "id": "control",
        "claim": "control: the emulator's all-float32 route trains like jnp float32 attention",
        "test": "emulated_float32",
        "against": "jnp_float32",
        "expect": "close",
    },
    {
        "id": "fp8-trains",
        "claim": "Direct-P (Hardware-Aware FP4 FlashAttention-4): the retained FP8 P/V training "
        "route trains (close to the high-precision baseline)",
        "test": "direct_p_fp8_training",
        "against": "jnp_float32",
        "expect": "close",
    },
    {
        "id": "mxfp4-diverges",
        "claim": "Direct-P: MXFP4 P/V training trajectories diverge (hence FP8 P/V in training)",
        "test": "mxfp4_pv_training",
        "against": "direct_p_fp8_training",
        "expect": "diverges",
    },
    {
        "id": "fp4-forward",
        "claim": "Direct-P: an FP4 (MXFP4 P) forward with an FP8 backward trains",
        "test": "direct_p_fp4_forward",
        "against": "direct_p_fp8_training",
        "expect": "close",
    },
    {
        "id": "normalization",
        "claim": "Direct-P: the normalizer must be the sum of the represented P (a mismatched "
        "normalizer breaks Σ dS = 0)",
        "test": "direct_p_fp4_mismatched_norm",
        "against": "direct_p_fp4_forward",
        "expect": "worse",
    },
    {
        "id": "dout-mismatch",
        "claim": "FLAMIA: D and dP from different dO representations diverge (within 500 steps)",
        "test": "direct_p_fp8_training+d_out_representation",
        "against": "direct_p_fp8_training",
        "expect": "diverges",
    },
    {
        "id": "p-bits-mismatch",
        "claim": "FLAMIA: a 4-bit P forward with an 8-bit P backward goes wrong (attention collapses)",
        "test": "direct_p_fp4_forward+p_bits",
        "against": "direct_p_fp4_forward",
        "expect": "worse",
    },
    {
        "id": "causal-safe",
        "claim": "FLAMIA: token-block power-of-two (ceil) scaling does not leak the future",
        "test": "flamia_mxfp8_training",
        "against": None,
        "expect": "no-leak",
    },
    {
        "id": "causal-unsafe",
        "claim": "FLAMIA: scales shared across the causal boundary with the OCP floor rule leak "
        "the future (and a leaky model looks better under its own attention)",
        "test": "flamia_mxfp8_v_floor_unsafe",
        "against": "flamia_mxfp8_training",
        "expect": "leak",
    },
)
"""The claims the study tests, the recipe that tests each and its comparison recipe."""


def _paired(t: dict[str, Any], a: dict[str, Any], key: str) -> tuple[float, float]:
    """Mean and sample sd over seeds of ``t[key] − a[key]`` per seed: every recipe sees the
    same initialization and batches for a given seed, so the paired difference removes the
    data noise that dominates the spread between seeds."""
    d = np.asarray(t[key], np.float64) - np.asarray(a[key], np.float64)
    return float(np.mean(d)), float(np.std(d, ddof=1)) if d.size > 1 else 0.0


def _verdict(c: dict[str, Any], s: dict[str, dict[str, Any]]) -> str | None:
    t = s.get(c["test"])
    a = s.get(c["against"]) if c["against"] else None
    if t is None or "skipped" in t or (c["against"] and (a is None or "skipped" in a)):
        return None
    n_div = sum(d is not None for d in t["diverged"])
    if c["expect"] in ("close", "worse", "diverges"):
        gm, gsd = _paired(t, a, "finals")
        hm, hsd = _paired(t, a, "val_own_seeds")
        se = max(gsd, 1e-4) / math.sqrt(max(1, len(t["finals"])))
        at = (
            ""
            if t["steps"] == a["steps"]
            else f" (its final state at step {t['steps']}, the other's at {a['steps']})"
        )
        facts = (
            f"paired over seeds vs `{c['against']}`: final train loss {gm:+.4f} ± "
            f"{gsd:.4f}, held-out {hm:+.4f} ± {hsd:.4f}{at}; diverged "
            f"{n_div}/{len(t['diverged'])} (against: "
            f"{sum(d is not None for d in a['diverged'])}/{len(a['diverged'])})"
        )
        if c["expect"] == "diverges":
            ok = n_div > 0 and not any(d is not None for d in a["diverged"])
            word = (
                "reproduced"
                if ok
                else (
                    "not reproduced at this scale: no divergence" if n_div == 0 else "inconclusive"
                )
            )
        elif c["expect"] == "worse":
            ok = n_div > 0 or gm > 3 * se
            word = "reproduced (worse)" if ok else "not reproduced at this scale"
        elif n_div:
            word = "not reproduced: diverged"
        elif gm > 3 * se and gm > CLOSE_NATS:
            word = (
                f"not reproduced at this scale: it trains (no divergence) but ends worse by "
                f"{gm:+.4f} nats (> 3 standard errors and > {CLOSE_NATS})"
            )
        elif gm > 3 * se:
            word = (
                f"reproduced (close: worse by {gm:+.4f} nats, beyond 3 standard errors but "
                f"< {CLOSE_NATS})"
            )
        else:
            word = "reproduced (no difference beyond 3 standard errors)"
        return f"{word} — {facts}"
    lk = t["leak"]
    probe = t.get("operator_probe") or {}
    size = max(lk["loss_rel"], lk["grad_rel"])
    exact = lk["loss_equal"] and lk["grad_equal"]
    facts = (
        f"past-position loss Δ {lk['loss_rel']:.1e}, gradient Δ {lk['grad_rel']:.1e}; "
        f"operator probe O/dQ {_probe_text(probe)}; own − float32 held-out loss "
        f"{t['dual_gap'][0]:+.5f}"
    )
    if c["id"] == "causal-unsafe":
        better = t["dual_gap"][0] < 0
        facts += (
            f" (the leaky model is {'better' if better else 'not better'} under its own "
            f"attention than under float32)"
        )
    if c["expect"] == "no-leak":
        if exact:
            word = "reproduced (the earlier positions are unchanged)"
        elif size <= _TINY_LEAK:
            word = (
                "reproduced up to the subnormal scale (a change ≤ 1e-6: an element crossing "
                "E4M3's subnormal range, the power-of-two ceil scales' only leak)"
            )
        else:
            word = "not reproduced (a leak above the subnormal scale)"
        return f"{word} — {facts}"
    if size >= _LARGE_LEAK:
        word = "reproduced (leak detected)"
    elif exact:
        word = "not detected"
    else:
        word = "inconclusive (only a tiny change)"
    return f"{word} — {facts}"


CLOSE_NATS = 0.02
"""A recipe expected to train "close" to its comparison is reported as not reproducing that
claim when it ends worse by more than this (nats) and by more than 3 standard errors."""
_TINY_LEAK = 1e-6  # relative change: subnormal-scale (the leak classes: exact 0 / tiny / large)
_LARGE_LEAK = 1e-5


def table_markdown(record: dict[str, Any]) -> str:
    """The table (one row per recipe) and the claims, as Markdown."""
    prov = record.get("provenance", {})
    cfg = record["config"]
    m = cfg["model"]
    names = record.get("recipe_order", list(record["recipes"]))
    s = {n: recipe_summary(record, n) for n in names}
    dev = prov.get("device", {})
    lines = [
        f"Training study ({record.get('status', '?')}): {m['layers']} layers, width "
        f"{m['width']}, {m['heads']} heads, context {m['context']}, batch {cfg['batch']}, loss "
        f"scale {cfg['optim'].get('loss_scale', 1.0):g}, seeds "
        f"{cfg['seeds']}, at most {cfg['steps']} steps; device "
        f"{dev.get('platform', '?')} ({dev.get('kind', '?')}); emulated backward accumulation "
        f"**{record.get('accumulation', '?')}** (each recipe's: the 'accumulation' column); "
        f"git {str(prov.get('git_revision', '?'))[:12]}.",
        "",
        f"Compared after {common_steps(record)} steps (the count every recipe reached; "
        f"'steps' = the recipe's own total, its checks use its final state).",
        "",
        "| recipe | steps | final train loss | held-out (own attn) | held-out (float32 attn) "
        "| diverged | grad norm median / p99 / max | leak check (past positions) "
        "| operator probe O / dQ | shared-scale classes | accumulation | compile (trace / XLA) "
        "| steps/s | step time / jnp f32 | bitwise rerun |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for n in names:
        x = s[n]
        if "skipped" in x:
            lines.append(f"| {n} | skipped: {x['skipped']} |" + " |" * 13)
            continue
        g = x["grad_norm"]
        ratio = "—" if x["ratio"] is None else f"{x['ratio']:.2f}x"
        det = {True: "yes", False: "NO", None: "—"}[x["deterministic"]]
        tr, xc = x["compile_s"]
        comp = "—" if tr is None or xc is None else f"{tr:.1f} / {xc:.1f} s"
        sps = "—" if x["steps_per_s"] is None else f"{x['steps_per_s']:.2f}"
        steps = f"{x['steps']}{' (budget)' if x['truncated'] else ''}"
        lines.append(
            f"| {n} | {steps} | {_pm(x['final_loss'])} | {_pm(x['val_own'])} "
            f"| {_pm(x['val_float32'])} | {_div(x['diverged'])} "
            f"| {g['median']:.3g} / {g['p99']:.3g} / {g['max']:.3g} | {_leak_text(x)} "
            f"| {_probe_text(x['operator_probe'])} | {_classes(x['leak_class'])} "
            f"| {x['accumulation']} | {comp} | {sps} | {ratio} | {det} |"
        )
    lines += [
        "",
        f"Final train loss: mean over seeds (± sample sd) of each seed's mean over "
        f"the last {cfg['smooth']} of the compared steps. Diverged: seeds whose loss "
        f"became non-finite or whose "
        f"{cfg['smooth']}-step mean rose {cfg['divergence_margin']} nats above its "
        f"running minimum (first such step). Leak check: positions ≥ "
        f"{record.get('leak_target', (77 * m['context']) // 128)} replaced by other "
        f"tokens; the earlier positions' losses and the gradient of their loss compared "
        f"(relative change; 'none' = equal). Operator probe: fp4sim.attention.leak."
        f"leak_probe (N 128, d 64, gain 5). Step time: median per step, all seeds, "
        f"measured in turn in the same run (steps/s: of all seeds at once). Bitwise "
        f"rerun: the first chunk again from the initial state, checked for one recipe "
        f"('—': not checked).",
        "",
    ]
    lines.append(
        "Claims (this run's numbers; a claim that does not reproduce at this scale is "
        "a finding at this scale only):"
    )
    lines.append("")
    for c in CLAIMS:
        v = _verdict(c, s)
        if v is not None:
            lines.append(f"* **{c['claim']}** (`{c['test']}`): {v}.")
    timing = record.get("timing", {})
    if timing.get("ratio_to_jnp_float32"):
        r8 = timing["ratio_to_jnp_float32"].get("direct_p_fp8_training")
        if r8 is not None:
            lines.append(
                f"* Speed: the emulated FP8 route's training step is {r8:.2f}x the "
                f"jnp float32 model's (same run; accumulation "
                f"{record.get('accumulation')}; target ≤ 5x at context 512)."
            )
    return "\n".join(lines) + "\n"


def plot_curves(record: dict[str, Any], path: str | Path) -> Path:
    """Three panels over the steps: the training loss (one line per recipe: the mean over seeds
    of a trailing moving average; the seeds' min–max shaded), its difference from the float32
    baseline paired by seed (same initialization and batches: the data noise cancels, so
    differences far below the spread between seeds show), and the gradient norm. Written to
    ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cfg = record["config"]
    m = cfg["model"]
    recs = record["recipes"]
    names = [
        n
        for n in record.get("recipe_order", list(recs))
        if recs[n].get("loss") and "skipped" not in recs[n]
    ]
    w = max(1, int(cfg["smooth"]))
    fig, (ax, dx, bx) = plt.subplots(
        3, 1, figsize=(10, 11), sharex=True, gridspec_kw={"height_ratios": [3, 2, 2]}
    )
    cmap = plt.get_cmap("tab10" if len(names) <= 10 else "tab20")
    base = np.asarray(recs["jnp_float32"]["loss"], np.float64) if "jnp_float32" in names else None

    def band(axis: Any, curves: np.ndarray, color: Any, style: str, label: str | None) -> None:
        sm = np.stack([_moving_average(c, w) for c in curves])
        x = np.arange(1, sm.shape[1] + 1)
        axis.fill_between(
            x, np.nanmin(sm, axis=0), np.nanmax(sm, axis=0), color=color, alpha=0.18, linewidth=0
        )
        axis.plot(x, np.nanmean(sm, axis=0), style, color=color, linewidth=1.4, label=label)

    for i, n in enumerate(names):
        r = recs[n]
        color = cmap(i % cmap.N)
        style = "--" if r.get("kind", "").startswith("JNP") else "-"
        loss = np.asarray(r["loss"], np.float64)  # (seeds, steps)
        band(ax, loss, color, style, r.get("label", n))
        if base is not None and n != "jnp_float32":
            k = min(loss.shape[1], base.shape[1])
            band(dx, loss[:, :k] - base[:, :k], color, style, None)
        band(bx, np.asarray(r["grad_norm"], np.float64), color, style, None)
    bx.set_yscale("log")
    ax.set_ylabel(f"training loss (nats/byte, {w}-step mean)")
    dx.set_ylabel("minus float32's, same seed")
    dx.axhline(0.0, color="0.3", linewidth=0.8)
    bx.set_ylabel("gradient norm (before clipping)")
    bx.set_xlabel("step")
    for axis in (ax, dx, bx):
        axis.grid(alpha=0.3)
    finals = [np.asarray(recs[n]["loss"], np.float64) for n in names]
    finite = np.concatenate([f[:, f.shape[1] // 10 :].ravel() for f in finals if f.size])
    finite = finite[np.isfinite(finite)]
    if finite.size:
        top = min(float(np.percentile(finite, 99.5)) + 0.2, float(np.max(finite)) + 0.1)
        ax.set_ylim(max(0.0, float(np.min(finite)) - 0.1), top)
    common = common_steps(record)
    if common:
        for axis in (ax, dx, bx):
            axis.axvline(common, color="0.4", linestyle=":", linewidth=1)
        bx.annotate(
            f"compared at step {common} ",
            (common, 0.02),
            xycoords=("data", "axes fraction"),
            ha="right",
            va="bottom",
            fontsize=7.5,
            color="0.35",
        )
    ax.legend(fontsize=8, ncol=2, loc="upper right")
    prov = record.get("provenance", {})
    dev = prov.get("device", {})
    fig.suptitle(
        f"Byte-level LM on Python's pydoc topics: {m['layers']} layers, width {m['width']}, "
        f"context {m['context']}, batch {cfg['batch']}, loss scale "
        f"{cfg['optim'].get('loss_scale', 1.0):g}, {len(cfg['seeds'])} seeds (shaded: "
        f"min–max)\nemulated attention: backward accumulation {record.get('accumulation')}, "
        f"forward the emulator's; jnp attention: XLA dot; device "
        f"{dev.get('platform')} ({dev.get('kind')}); git {str(prov.get('git_revision'))[:12]}",
        fontsize=9.5,
    )
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def regenerate(
    record_path: str | Path, out_dir: str | Path | None = None
) -> tuple[Path | None, Path]:
    """Figure and table from the record at ``record_path``, into ``out_dir`` (default: the
    record's folder). Returns (figure, table) paths; the figure is None where matplotlib is
    not installed (``--replot`` on a machine with it draws it later from the same record)."""
    record_path = Path(record_path)
    record = json.loads(record_path.read_text())
    if record.get("schema", "").split("/")[0] != "fp4sim.train.study":
        raise ValueError(
            f"{record_path}: not a training-study record (schema {record.get('schema')!r})"
        )
    out = Path(out_dir) if out_dir is not None else record_path.parent
    out.mkdir(parents=True, exist_ok=True)
    table = out / TABLE_NAME
    table.write_text(table_markdown(record))
    if importlib.util.find_spec("matplotlib") is None:  # no plot extra: the table only
        return None, table
    fig = plot_curves(record, out / FIGURE_NAME)
    return fig, table
