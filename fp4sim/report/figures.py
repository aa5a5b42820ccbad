"""Figures: ``python -m fp4sim figures`` draws every image of the report into ``figures/``.

Each figure is made by one named function ``fig_*(fig, sizes)`` that draws on a matplotlib
``Figure`` from the numbers of the report's experiments (:mod:`fp4sim.report.experiments`, cached
per size), so a figure and the report's tables always show the same data. :data:`FIGURES` maps a
figure's name to its function, file name and caption. matplotlib is imported only inside
:func:`render` and :func:`draw`. :func:`render` writes a PNG with the non-interactive Agg backend,
a fixed style and a fixed file name, so rendering is deterministic and works without a display;
:func:`draw` returns the same figure unsaved, in the current backend (inline in a Jupyter
notebook: the notebooks show the report's figures this way). Importing fp4sim never loads
matplotlib.
This module also holds the ``figures`` command line (:func:`add_arguments`, :func:`run`); it
writes into ``--out`` or ``./figures``, never into the package.

>>> from fp4sim.report.figures import FIGURES
>>> FIGURES["e2m1_grid"].filename, FIGURES["e2m1_grid"].draw.__name__
('e2m1_grid.png', 'fig_e2m1_grid')
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fp4sim.report import experiments
from fp4sim.report.sizes import DEFAULT, SIZES

__all__ = ["FigureSpec", "FIGURES", "draw", "render", "render_all", "write_index", "DEFAULT_DIR"]

DEFAULT_DIR = Path("figures")
"""Where ``python -m fp4sim figures`` writes without ``--out``: ``./figures`` in the working
directory (the repository's ``figures/`` when run from its root), never the installed package."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class FigureSpec:
    """A named figure: the function drawing it, its file name, caption and size in inches."""

    name: str
    draw: Callable[[Any, Any], None]
    caption: str
    size: tuple[float, float] = (7.0, 4.0)

    @property
    def filename(self) -> str:
        return f"{self.name}.png"


FIGURES: dict[str, FigureSpec] = {}


def _figure(name: str, caption: str, size: tuple[float, float] = (7.0, 4.0)):
    def deco(fn):
        FIGURES[name] = FigureSpec(name=name, draw=fn, caption=caption, size=size)
        return fn

    return deco


_STYLE = {
    "figure.dpi": 110,
    "savefig.dpi": 110,
    "font.size": 9,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "legend.frameon": False,
    "svg.hashsalt": "fp4sim",
}


def _spec(name: str) -> FigureSpec:
    if name not in FIGURES:
        raise ValueError(f"name={name!r} is not a figure; known: {sorted(FIGURES)}")
    return FIGURES[name]


def _draw(spec: FigureSpec, sizes: Any) -> Any:
    """``spec`` drawn on a new pyplot figure (call inside the report's style); closed on error."""
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=spec.size, layout="constrained")
    try:
        spec.draw(fig, DEFAULT if sizes is None else sizes)
    except BaseException:
        plt.close(fig)
        raise
    return fig


def _style() -> Any:
    import matplotlib
    import matplotlib.pyplot as plt

    style = contextlib.ExitStack()
    style.enter_context(plt.style.context("default"))
    style.enter_context(matplotlib.rc_context(_STYLE))
    return style


def draw(name: str, *, sizes: Any = None) -> Any:
    """The figure ``name`` at ``sizes`` (default: the report's DEFAULT) as a matplotlib
    ``Figure``, drawn in the report's style and not saved: the current backend shows it (in a
    Jupyter notebook, inline at the end of the cell). No backend is switched and no file written;
    ``matplotlib.pyplot.close(fig)`` releases it."""
    spec = _spec(name)
    import matplotlib.pyplot as plt

    # Load pyplot's backend before the style context: loading Jupyter's inline backend turns on
    # interactive mode (which queues new figures for display), and leaving the style context
    # would undo that, so that the figures of later cells were never shown.
    plt.draw_if_interactive()
    with _style():
        return _draw(spec, sizes)


def render(name: str, out_dir: str | Path = DEFAULT_DIR, *, sizes: Any = None) -> Path:
    """Draw the figure ``name`` at ``sizes`` (default: the report's DEFAULT) into ``out_dir``."""
    spec = _spec(name)
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / spec.filename
    with _style():
        fig = _draw(spec, sizes)
        try:
            fig.savefig(path, metadata={"Software": None})
        finally:
            plt.close(fig)
    return path


def render_all(
    out_dir: str | Path = DEFAULT_DIR,
    *,
    sizes: Any = None,
    names: Sequence[str] | None = None,
    progress: bool = False,
) -> list[Path]:
    """Render every figure (or those named) into ``out_dir``; returns the written paths."""
    names = sorted(FIGURES) if names is None else list(names)
    unknown = [n for n in names if n not in FIGURES]
    if unknown:
        raise ValueError(f"names={unknown} are not figures; known: {sorted(FIGURES)}")
    selected = list(names)
    if progress:
        from tqdm import tqdm

        names = tqdm(names, desc="fp4sim figures", unit="figure", file=sys.stderr)
    paths = [render(n, out_dir, sizes=sizes) for n in names]
    if len(selected) == len(FIGURES):
        write_index(out_dir, sizes=sizes)
    return paths


def write_index(out_dir: str | Path = DEFAULT_DIR, *, sizes: Any = None) -> Path:
    """``INDEX.md`` in ``out_dir``: every figure's file, the function that draws it and its caption."""
    sizes = DEFAULT if sizes is None else sizes
    lines = [
        "# Figures",
        "",
        f"Generated by `python -m fp4sim figures` (sizes `{sizes.name}`); do not edit by hand.",
        "",
        "| file | made by | caption |",
        "|---|---|---|",
    ]
    for name in sorted(FIGURES):
        f = FIGURES[name]
        lines.append(
            f"| [{f.filename}]({f.filename}) | `fp4sim.report.figures.{f.draw.__name__}` | {f.caption} |"
        )
    path = Path(out_dir) / "INDEX.md"
    path.write_text("\n".join(lines) + "\n")
    return path


# --- the figures ----------------------------------------------------------------------------------


@_figure(
    "e2m1_grid",
    "The 16 E2M1 codes on the real line (round-to-nearest-even decision "
    "boundaries dashed; ties go to the even code)",
    size=(7.0, 2.6),
)
def fig_e2m1_grid(fig, sizes) -> None:
    r = experiments.experiment_formats()
    codes, values = r["e2m1_codes"], r["e2m1_values"].astype(np.float64)
    ax = fig.add_subplot()
    pos = np.unique(np.abs(values))
    mids = (pos[:-1] + pos[1:]) / 2
    for m in np.concatenate([mids, -mids]):
        ax.axvline(m, color="0.6", ls="--", lw=0.7, zorder=0)
    neg = (codes & 0x8) != 0
    ax.scatter(
        values[~neg], np.zeros((~neg).sum()), color="C0", zorder=3, label="sign 0 (codes 0x0–0x7)"
    )
    ax.scatter(
        values[neg],
        np.zeros(neg.sum()),
        color="C3",
        marker="x",
        zorder=3,
        label="sign 1 (codes 0x8–0xF)",
    )
    for c, v in zip(codes, values):
        if c == 0x8:  # -0 sits on +0; label it below
            ax.annotate(
                "0x8 (−0)",
                (v, 0),
                xytext=(0, -16),
                textcoords="offset points",
                ha="center",
                fontsize=7,
                color="C3",
            )
            continue
        ax.annotate(
            f"0x{int(c):X}",
            (v, 0),
            xytext=(0, 8),
            textcoords="offset points",
            ha="center",
            fontsize=7,
            color="C3" if c & 0x8 else "C0",
        )
    ax.set_yticks([])
    ax.set_ylim(-1, 1)
    ax.set_xlim(-6.8, 6.8)
    ax.set_xlabel("value")
    ax.set_title("E2M1 (FP4): 1 sign, 2 exponent, 1 mantissa bit; max 6, subnormal 0.5")
    ax.legend(loc="lower right", fontsize=7)


@_figure(
    "scale_rule_clipping",
    "UE8M0 scale rules on Gaussian blocks of 32: share of blocks whose max "
    "is clipped (left; black ticks: what the OCP mantissa rule predicts for the "
    "floor rule) and "
    "relative L2 error (right)",
    size=(8.0, 3.4),
)
def fig_scale_rule_clipping(fig, sizes) -> None:
    rows = experiments.experiment_scale_rules(sizes)["rows"]
    formats = sorted({r["format"] for r in rows}, reverse=True)
    rules = [r["rule"] for r in rows if r["format"] == formats[0]]
    ax1, ax2 = fig.subplots(1, 2)
    width = 0.8 / len(formats)
    xs = np.arange(len(rules))
    for i, f in enumerate(formats):
        sel = [r for r in rows if r["format"] == f]
        off = xs + (i - (len(formats) - 1) / 2) * width
        bars = ax1.bar(
            off, [100 * r["clip_rate"] for r in sel], width, color=f"C{i}", label=f"{f} measured"
        )
        ax1.bar_label(bars, fmt="%.1f", fontsize=7, padding=1)
        # the floor rule's prediction as a black tick on the measured bar (which stays visible)
        fl = [(o, r) for o, r in zip(off, sel) if r["rule"] == "FLOOR"]
        ax1.hlines(
            [100 * r["mantissa_rule_predicts"] for _, r in fl],
            [o - 0.45 * width for o, _ in fl],
            [o + 0.45 * width for o, _ in fl],
            colors="k",
            lw=2.0,
            zorder=3,
            label="floor: mantissa rule predicts" if i == 0 else None,
        )
        bars = ax2.bar(off, [r["rel_l2"] for r in sel], width, color=f"C{i}", label=f)
        ax2.bar_label(bars, fmt="%.3f", fontsize=7, padding=1)
    for ax in (ax1, ax2):
        ax.set_xticks(xs, rules)
        ax.set_xlabel("scale rule")
    ax1.set_ylabel("blocks whose max clips (%)")
    ax2.set_ylabel("relative L2 error")
    ax1.legend(fontsize=7)
    ax2.legend(fontsize=7)


@_figure(
    "exp2_error",
    "Relative error of FA4's degree-3 polynomial ex2 emulation against 2^x, "
    "as a function of the fractional part of x (dashed: the expected bounds)",
)
def fig_exp2_error(fig, sizes) -> None:
    r = experiments.experiment_exp2(sizes)
    ax = fig.add_subplot()
    ax.plot(
        r["curve_frac"],
        1e5 * r["curve_rel"],
        ".",
        ms=1.5,
        color="C0",
        label="exp2_fa4(x) / 2^x − 1",
    )
    for i, b in enumerate((-8.52e-5, 8.76e-5)):
        ax.axhline(
            1e5 * b, color="C3", ls="--", lw=0.8, label="expected bounds" if i == 0 else None
        )
    ax.set_xlabel("frac(x)")
    ax.set_ylabel("relative error (×1e-5)")
    ax.legend(loc="upper center", markerscale=6)


@_figure(
    "converter_code_maps",
    "E2M1 payload chosen by each Direct-P converter as a function of the "
    "coordinate x (2^x is the exact payload before rounding); grey: x where "
    "the converter disagrees with the exact one",
    size=(8.0, 5.0),
)
def fig_converter_code_maps(fig, sizes) -> None:
    r = experiments.experiment_code_match(sizes)
    x, maps = r["map_x"], r["maps"]
    names = ["affine", "mitchell_s0", "mitchell_boundary"]
    axes = fig.subplots(len(names), 1, sharex=True)
    for ax, name in zip(axes, names):
        for i, (a, b) in enumerate(
            r["bands"][name]
        ):  # full-resolution intervals; thin ones get an edge
            ax.axvspan(a, b, color="0.8", ec="0.6", lw=0.6, label="disagrees" if i == 0 else None)
        ax.step(x, maps["exact"], where="mid", color="k", lw=1.0, label="exact RN(2^x)")
        ax.step(x, maps[name], where="mid", color="C1", lw=1.0, ls="--", label="this converter")
        ax.set_ylim(-0.2, 6.4)
        ax.set_yticks([0, 0.5, 1, 1.5, 2, 3, 4, 6])
        ax.tick_params(axis="y", labelsize=6)
        ax.set_ylabel("payload")
        ax.set_title(
            f"{experiments.CONVERTER_LABELS[name]}: {100 * r['grid'][name]:.2f} % of x match",
            fontsize=8,
            loc="left",
        )
        ax.legend(loc="upper left", fontsize=7, ncols=3)
    axes[-1].set_xlabel("Direct-P coordinate x = t − k_B + log2 6")


@_figure(
    "route_errors",
    "Relative L2 error of each published route against exact float64 attention "
    "(Gaussian Q, K, V): one column per route, the sequence lengths (left) and "
    "key-tile sizes (right) side by side within it, so that routes with equal "
    "errors stay apart",
    size=(9.0, 4.2),
)
def fig_route_errors(fig, sizes) -> None:
    r = experiments.experiment_route_errors(sizes)
    names = list(r["presets"])
    ax1, ax2 = fig.subplots(1, 2, sharey=True)
    xs = np.arange(len(names))
    markers = "osD^v<>px*"
    for ax, key, label in ((ax1, "by_len", "S = {}"), (ax2, "by_tile", "tile {}")):
        values = sorted(r[key][names[0]])
        width = 0.7 / max(len(values) - 1, 1)
        for j, val in enumerate(values):
            off = xs + (j - (len(values) - 1) / 2) * width
            ax.plot(
                off,
                [r[key][n][val]["rel_l2"] for n in names],
                ls="none",
                marker=markers[j % len(markers)],
                ms=5,
                color=f"C{j % 10}",
                label=label.format(val),
            )
        for n, x0 in zip(names, xs):  # a thin line joins a route's points
            ax.plot(
                x0 + (np.arange(len(values)) - (len(values) - 1) / 2) * width,
                [r[key][n][v]["rel_l2"] for v in values],
                color="0.6",
                lw=0.8,
                zorder=0,
            )
        ax.set_xticks(xs, names, rotation=60, ha="right", fontsize=7)
        ax.grid(axis="x", color="0.92", lw=6)
        ax.legend(fontsize=7, loc="upper right")
    ax1.set_yscale("log")
    ax1.set_title("over sequence length (key tile 128)", fontsize=8)
    ax2.set_title(f"over the key tile (block_kv), S = {r['mid']}", fontsize=8)
    ax1.set_ylabel("relative L2 error vs exact")


@_figure(
    "direct_p_norm",
    "Direct-P norm study: cosine, relative L2 error and norm ratio ‖O‖/‖O_ref‖ over the "
    "score spread (Q scaled) for the affine preset, the affine route with the exact-sum "
    "normalizer and the exact converter (mean ± std over the seeds; dashed: the "
    "article's cosine and rel-L2; grey band: the norm ratios they imply)",
    size=(9.0, 3.8),
)
def fig_direct_p_norm(fig, sizes) -> None:
    from fp4sim.report import norm_study

    r = norm_study.experiment_direct_p_norm(sizes)
    art = r["article"]
    scales = r["scales"]
    only_scaled = {"key_correlation": 0.0, "v_mean": 0.0, "sink_logit": 0.0}
    by = {
        (d["route"], d["inputs"]["score_scale"]): d
        for d in r["rows"]
        if d["route"] in norm_study.SWEEP_ROUTES
        and all(d["inputs"][k] == v for k, v in only_scaled.items())
    }
    axes = fig.subplots(1, 3, sharex=True)
    for ax, key, label in zip(
        axes,
        ("cosine", "rel_l2", "norm_ratio"),
        ("cosine", "relative L2 error", "norm ratio ‖O‖ / ‖O_ref‖"),
    ):
        for i, route in enumerate(norm_study.SWEEP_ROUTES):
            ds = [by[(route, s)] for s in scales]
            ax.errorbar(
                scales,
                [d[key] for d in ds],
                yerr=[d["spread"][key]["std"] for d in ds],
                marker="os^"[i],
                ms=4,
                capsize=2,
                lw=1.0,
                color=f"C{i}",
                label=route,
            )
        ax.set_title(label, fontsize=8)
        ax.set_xscale("log", base=2)
        ax.set_xticks(scales, [f"{s:g}" for s in scales], fontsize=7)
        ax.set_xlabel("score scale (std of q·k/√D)")
    axes[0].axhline(art["cosine"], color="k", ls="--", lw=0.8, label="article")
    axes[1].axhline(art["rel_l2"], color="k", ls="--", lw=0.8, label="article")
    lo, hi = art["norm_ratio_band"]["upper"]
    axes[2].axhspan(lo, hi, color="0.75", alpha=0.6, lw=0, label="implied by the article")
    axes[2].axhline(1.0, color="0.4", ls=":", lw=0.8)
    handles, labels = [], []
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="outside lower center", ncols=len(labels), fontsize=7)


@_figure(
    "leak_classes",
    "Causal leak probe: largest relative change of earlier rows of O and dQ when "
    "a future token becomes its scale group's maximum (bitwise zeros labelled at the "
    "left edge; dotted: the tiny / large class limits 1e-4 and 1e-3)",
    size=(8.0, 4.2),
)
def fig_leak_classes(fig, sizes) -> None:
    rows = experiments.experiment_leak(sizes)["rows"]
    ax = fig.add_subplot()
    floor = 1e-9
    y = np.arange(len(rows))[::-1]
    for dy, key, color, label in (
        (0.18, "leak_o", "C0", "leak_O"),
        (-0.18, "leak_dq", "C1", "leak_dQ"),
    ):
        vals = np.array([r[key] for r in rows], dtype=np.float64)
        shown = np.maximum(vals, floor)
        ax.hlines(y + dy, floor, shown, color=color, lw=4, label=label)
        for yy, v in zip(y + dy, vals):
            if v == 0:
                ax.text(floor * 1.3, yy, "0 (bitwise)", va="center", fontsize=6)
    for b in (1e-4, 1e-3):
        ax.axvline(b, color="k", ls=":", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlim(floor, 1)
    ax.set_yticks(y, [r["name"] + (" (vacuous)" if r["vacuous"] else "") for r in rows], fontsize=7)
    ax.set_xlabel("leak (max relative change of earlier rows)")
    ax.legend(loc="lower right", fontsize=7)


# --- CLI -------------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_DIR,
        metavar="DIR",
        help="output folder (default: ./figures in the working directory)",
    )
    size = parser.add_mutually_exclusive_group()
    size.add_argument(
        "--quick",
        dest="size",
        action="store_const",
        const="quick",
        help="the report's small sizes (fast; for checking)",
    )
    size.add_argument(
        "--full",
        dest="size",
        action="store_const",
        const="full",
        help="the report's full sizes (slow); default: the make-demo sizes",
    )
    parser.set_defaults(size="default")
    parser.add_argument(
        "--only",
        dest="names",
        action="append",
        metavar="NAME",
        help="only this figure (repeatable); see --list",
    )
    parser.add_argument("--list", action="store_true", help="list the figures and their captions")
    parser.add_argument(
        "--no-progress", dest="progress", action="store_false", help="no progress bar"
    )


def run(args: argparse.Namespace) -> int:
    if args.list:
        for name in sorted(FIGURES):
            print(f"{FIGURES[name].filename:32s} {FIGURES[name].caption}")
        return 0
    if args.names:
        unknown = [n for n in args.names if n not in FIGURES]
        if unknown:
            print(
                f"error: --only {unknown[0]!r} is not a figure; known: {', '.join(sorted(FIGURES))}",
                file=sys.stderr,
            )
            return 2
    paths = render_all(args.out, sizes=SIZES[args.size], names=args.names, progress=args.progress)
    for p in paths:
        print(p)
    return 0
