"""The report's building blocks: :class:`Table`, :class:`Section` and the value formatting.

:func:`format_value` renders one table cell, :func:`percent` a share, :func:`to_jsonable` turns
the numbers of a section (NumPy scalars and arrays, tuples as keys) into JSON values. A
:class:`Table` shows itself rendered in a Jupyter notebook (``text/markdown``, IPython's rich
display; the notebooks in ``notebooks/`` show their tables this way) and prints as its Markdown.
:func:`spread` summarizes one number measured over several seeds (mean, standard deviation,
min, max and the per-seed values, as ``results.json`` records them) and :func:`format_spread`
renders it as ``mean ± std``. :func:`anchor` is a section title's Markdown anchor and
:func:`section_link` a link to it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

__all__ = [
    "Table",
    "Section",
    "format_value",
    "percent",
    "spread",
    "format_spread",
    "to_jsonable",
    "anchor",
    "section_link",
]


# --- report building blocks -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class Table:
    """A Markdown table with a caption and the published or expected statement it is set beside."""

    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]
    source: str = ""  # what a paper, a library or the definitions give, with its citation
    note: str = ""

    def markdown(self) -> str:
        head = "| " + " | ".join(self.columns) + " |"
        rule = "|" + "|".join("---" for _ in self.columns) + "|"
        body = ["| " + " | ".join(format_value(v) for v in row) + " |" for row in self.rows]
        parts = [f"**{self.title}**", ""]
        if self.source:
            parts += [f"*Source:* {self.source}", ""]
        parts += [head, rule, *body]
        if self.note:
            parts += ["", self.note]
        return "\n".join(parts)

    def _repr_markdown_(self) -> str:
        """IPython's rich display: a Jupyter notebook shows the table rendered (``text/markdown``)."""
        return self.markdown()

    def __str__(self) -> str:
        """``print(table)`` and ``IPython.display.display`` outside IPython: the Markdown text."""
        return self.markdown()


@dataclasses.dataclass(frozen=True, kw_only=True)
class Section:
    """One part of the report: prose, tables, figure names and the numbers recorded in JSON."""

    key: str
    title: str
    intro: str
    tables: tuple[Table, ...] = ()
    figures: tuple[str, ...] = ()  # names in fp4sim.figures.FIGURES
    numbers: dict[str, Any] = dataclasses.field(default_factory=dict)


def format_value(v: Any) -> str:
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        v = float(v)
        if math.isnan(v):
            return "NaN"
        if math.isinf(v):
            return "∞" if v > 0 else "−∞"
        if v == 0:
            return "−0" if math.copysign(1.0, v) < 0 else "0"
        if abs(v) >= 1e5 or abs(v) < 1e-3:
            return f"{v:.4g}"
        return f"{v:.6g}"
    return str(v)


def percent(x: float) -> str:
    return f"{100 * x:.2f} %"


def spread(values: Any) -> dict[str, Any]:
    """One number over seeds: ``{"mean", "std", "min", "max", "n", "per_seed"}`` (population
    standard deviation, ``ddof=0``; per-seed values in seed order)."""
    x = np.asarray(values, dtype=np.float64).reshape(-1)
    if x.size == 0:
        raise ValueError("values is empty; a spread needs at least one seed")
    return {
        "mean": float(x.mean()),
        "std": float(x.std()),
        "min": float(x.min()),
        "max": float(x.max()),
        "n": int(x.size),
        "per_seed": [float(v) for v in x],
    }


def format_spread(s: dict[str, Any], digits: int = 4, *, as_percent: bool = False) -> str:
    """``mean ± std`` of a :func:`spread` (the mean alone for one seed), ``digits`` decimals."""
    k = 100.0 if as_percent else 1.0
    unit = " %" if as_percent else ""
    if digits < 0:
        raise ValueError(f"digits={digits!r} must be >= 0")
    if s["n"] == 1:
        return f"{k * s['mean']:.{digits}f}{unit}"
    return f"{k * s['mean']:.{digits}f} ± {k * s['std']:.{digits}f}{unit}"


def to_jsonable(v: Any) -> Any:
    if isinstance(v, dict):
        return {str(k): to_jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [to_jsonable(x) for x in v]
    if isinstance(v, (np.bool_, bool)):
        return bool(v)
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        v = float(v)
        return v if math.isfinite(v) else str(v)
    if isinstance(v, np.ndarray):
        return to_jsonable(v.tolist())
    return v


def anchor(title: str) -> str:
    """The Markdown anchor of a heading: lower case, spaces and hyphens to ``-``, other
    punctuation dropped."""
    keep = [c.lower() if c.isalnum() else "-" if c in " -" else "" for c in title]
    return "".join(keep)


def section_link(title: str) -> str:
    """``[title](#anchor)``: a link to the report's section called ``title``."""
    return f"[{title}](#{anchor(title)})"
