"""Figures: ``python -m fp4sim figures`` regenerates every image under ``figures/``.

Each figure is made by one named function ``fig_*(fig, sizes)`` that draws on a matplotlib
``Figure`` from the numbers of the report's experiments (:mod:`fp4sim.report`, cached per size),
so a figure and the report's tables always show the same data. :data:`FIGURES` maps a figure's
name to its function, file name and caption. matplotlib is imported only inside :func:`render`,
with the non-interactive Agg backend, a fixed style and fixed file names, so rendering is
deterministic and works without a display; importing fp4sim never loads matplotlib.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["FigureSpec", "FIGURES", "render", "render_all", "DEFAULT_DIR"]

DEFAULT_DIR = Path(__file__).resolve().parent.parent / "figures"


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


def render(name: str, out_dir: str | Path = DEFAULT_DIR, *, sizes: Any = None) -> Path:
    """Draw the figure ``name`` at ``sizes`` (default: the report's DEFAULT) into ``out_dir``."""
    if name not in FIGURES:
        raise ValueError(f"name={name!r} is not a figure; known: {sorted(FIGURES)}")
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    from fp4sim import report

    sizes = report.DEFAULT if sizes is None else sizes
    spec = FIGURES[name]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / spec.filename
    with plt.style.context("default"), matplotlib.rc_context(_STYLE):
        fig = plt.figure(figsize=spec.size, layout="constrained")
        try:
            spec.draw(fig, sizes)
            fig.savefig(path, metadata={"Software": None})
        finally:
            plt.close(fig)
    return path


def render_all(out_dir: str | Path = DEFAULT_DIR, *, sizes: Any = None, names: Sequence[str] | None = None,
               progress: bool = False) -> list[Path]:
    """Render every figure (or those named) into ``out_dir``; returns the written paths."""
    names = sorted(FIGURES) if names is None else list(names)
    unknown = [n for n in names if n not in FIGURES]
    if unknown:
        raise ValueError(f"names={unknown} are not figures; known: {sorted(FIGURES)}")
    if progress:
        from tqdm import tqdm

        names = tqdm(names, desc="fp4sim figures", unit="figure", file=sys.stderr)
    return [render(n, out_dir, sizes=sizes) for n in names]


# --- the figures ----------------------------------------------------------------------------------

@_figure("e2m1_grid", "The 16 E2M1 codes on the real line (round-to-nearest-even decision "
                      "boundaries dashed; ties go to the even code)", size=(7.0, 2.6))
def fig_e2m1_grid(fig, sizes) -> None:
    from fp4sim import report

    r = report.experiment_formats()
    codes, values = r["e2m1_codes"], r["e2m1_values"].astype(np.float64)
    ax = fig.add_subplot()
    pos = np.unique(np.abs(values))
    mids = (pos[:-1] + pos[1:]) / 2
    for m in np.concatenate([mids, -mids]):
        ax.axvline(m, color="0.6", ls="--", lw=0.7, zorder=0)
    neg = (codes & 0x8) != 0
    ax.scatter(values[~neg], np.zeros((~neg).sum()), color="C0", zorder=3, label="sign 0 (codes 0x0–0x7)")
    ax.scatter(values[neg], np.zeros(neg.sum()), color="C3", marker="x", zorder=3,
               label="sign 1 (codes 0x8–0xF)")
    for c, v in zip(codes, values):
        if c == 0x8:  # -0 sits on +0; label it below
            ax.annotate("0x8 (−0)", (v, 0), xytext=(0, -16), textcoords="offset points", ha="center",
                        fontsize=7, color="C3")
            continue
        ax.annotate(f"0x{int(c):X}", (v, 0), xytext=(0, 8), textcoords="offset points", ha="center",
                    fontsize=7, color="C3" if c & 0x8 else "C0")
    ax.set_yticks([])
    ax.set_ylim(-1, 1)
    ax.set_xlim(-6.8, 6.8)
    ax.set_xlabel("value")
    ax.set_title("E2M1 (FP4): 1 sign, 2 exponent, 1 mantissa bit; max 6, subnormal 0.5")
    ax.legend(loc="lower right", fontsize=7)


@_figure("scale_rule_clipping", "UE8M0 scale rules on Gaussian blocks of 32: share of blocks whose max "
                                "is clipped (left; hatched: the seed's mantissa rule predicts it) and "
                                "relative L2 error (right)", size=(8.0, 3.4))
def fig_scale_rule_clipping(fig, sizes) -> None:
    from fp4sim import report

    rows = report.experiment_scale_rules(sizes)["rows"]
    formats = sorted({r["format"] for r in rows}, reverse=True)
    rules = [r["rule"] for r in rows if r["format"] == formats[0]]
    ax1, ax2 = fig.subplots(1, 2)
    width = 0.8 / len(formats)
    xs = np.arange(len(rules))
    for i, f in enumerate(formats):
        sel = [r for r in rows if r["format"] == f]
        off = xs + (i - (len(formats) - 1) / 2) * width
        bars = ax1.bar(off, [100 * r["clip_rate"] for r in sel], width, color=f"C{i}", label=f"{f} measured")
        ax1.bar_label(bars, fmt="%.1f", fontsize=7, padding=1)
        ax1.bar(off, [100 * r["seed_predicted"] for r in sel], width, fill=False, hatch="//",
                edgecolor="k", lw=0.6, label="seed's rule predicts" if i == 0 else None)
        bars = ax2.bar(off, [r["rel_l2"] for r in sel], width, color=f"C{i}", label=f)
        ax2.bar_label(bars, fmt="%.3f", fontsize=7, padding=1)
    for ax in (ax1, ax2):
        ax.set_xticks(xs, rules)
        ax.set_xlabel("scale rule")
    ax1.set_ylabel("blocks whose max clips (%)")
    ax2.set_ylabel("relative L2 error")
    ax1.legend(fontsize=7)
    ax2.legend(fontsize=7)


@_figure("exp2_error", "Relative error of FA4's degree-3 polynomial ex2 emulation against 2^x, "
                       "as a function of the fractional part of x (dashed: the seed's bounds)")
def fig_exp2_error(fig, sizes) -> None:
    from fp4sim import report

    r = report.experiment_exp2(sizes)
    ax = fig.add_subplot()
    ax.plot(r["curve_frac"], 1e5 * r["curve_rel"], ".", ms=1.5, color="C0", label="exp2_fa4(x) / 2^x − 1")
    for b in (-8.52e-5, 8.76e-5):
        ax.axhline(1e5 * b, color="C3", ls="--", lw=0.8)
    ax.set_xlabel("frac(x)")
    ax.set_ylabel("relative error (×1e-5)")
    ax.legend(loc="lower left", markerscale=6)


@_figure("converter_code_maps", "E2M1 payload chosen by each Direct-P converter as a function of the "
                                "coordinate x (2^x is the exact payload before rounding); grey: x where "
                                "the converter disagrees with the exact one", size=(8.0, 5.0))
def fig_converter_code_maps(fig, sizes) -> None:
    from fp4sim import report

    r = report.experiment_code_match(sizes)
    x, maps = r["map_x"], r["maps"]
    names = ["affine", "mitchell_s0", "mitchell_boundary"]
    axes = fig.subplots(len(names), 1, sharex=True)
    for ax, name in zip(axes, names):
        wrong = maps[name] != maps["exact"]
        ax.fill_between(x, 0, 6.4, where=wrong, color="0.85", step="mid", lw=0, label="disagrees")
        ax.step(x, maps["exact"], where="mid", color="k", lw=1.0, label="exact RN(2^x)")
        ax.step(x, maps[name], where="mid", color="C1", lw=1.0, ls="--", label="this converter")
        ax.set_ylim(-0.2, 6.4)
        ax.set_yticks([0, 0.5, 1, 1.5, 2, 3, 4, 6])
        ax.tick_params(axis="y", labelsize=6)
        ax.set_ylabel("payload")
        ax.set_title(f"{report._CONVERTER_LABELS[name]}: {100 * r['grid'][name]:.2f} % of x match",
                     fontsize=8, loc="left")
        ax.legend(loc="upper left", fontsize=7, ncols=3)
    axes[-1].set_xlabel("Direct-P coordinate x = t − k_B + log2 6")


@_figure("route_errors", "Relative L2 error of each published route against exact float64 attention "
                         "(Gaussian Q, K, V), over sequence length (left) and key-tile size (right)",
         size=(8.5, 3.8))
def fig_route_errors(fig, sizes) -> None:
    from fp4sim import report

    r = report.experiment_route_errors(sizes)
    ax1, ax2 = fig.subplots(1, 2, sharey=True)
    markers = "osD^v<>px*"
    for i, name in enumerate(r["presets"]):
        lens = sorted(r["by_len"][name])
        tiles = sorted(r["by_tile"][name])
        style = dict(marker=markers[i % len(markers)], ms=4, lw=1, color=f"C{i % 10}")
        ax1.plot(lens, [r["by_len"][name][s]["rel_l2"] for s in lens], label=name, **style)
        ax2.plot(tiles, [r["by_tile"][name][b]["rel_l2"] for b in tiles], **style)
    ax1.set_xscale("log", base=2)
    ax2.set_xscale("log", base=2)
    ax1.set_yscale("log")
    ax1.set_xlabel("sequence length S (key tile 128)")
    ax2.set_xlabel(f"key tile (block_kv), S = {r['mid']}")
    ax1.set_ylabel("relative L2 error vs exact")
    fig.legend(loc="outside right center", fontsize=7)


# --- CLI -------------------------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=DEFAULT_DIR, metavar="DIR",
                        help="output folder (default: the repository's figures/)")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", dest="size", action="store_const", const="quick",
                      help="the report's small sizes (fast; for checking)")
    size.add_argument("--full", dest="size", action="store_const", const="full", help="the seeds' sizes")
    parser.set_defaults(size="default")
    parser.add_argument("--only", dest="names", action="append", metavar="NAME",
                        help="only this figure (repeatable); see --list")
    parser.add_argument("--list", action="store_true", help="list the figures and their captions")
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    if args.list:
        for name in sorted(FIGURES):
            print(f"{FIGURES[name].filename:32s} {FIGURES[name].caption}")
        return 0
    from fp4sim import report

    if args.names:
        unknown = [n for n in args.names if n not in FIGURES]
        if unknown:
            print(f"error: --only {unknown[0]!r} is not a figure; known: {', '.join(sorted(FIGURES))}",
                  file=sys.stderr)
            return 2
    paths = render_all(args.out, sizes=report.SIZES[args.size], names=args.names, progress=args.progress)
    for p in paths:
        print(p)
    return 0
