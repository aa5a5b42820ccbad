"""The architecture's guardrails, read from the source with ``ast`` (docs/architecture.md):

* imports run one way: the base (``fp4sim._xp``, ``fp4sim._checks``) -> ``fp4sim.formats`` ->
  ``fp4sim.attention`` -> ``fp4sim.kernels`` -> the applications (golden, report, benchmarks,
  the CLI);
* no module takes a private name (``_x``) from another, nor a private module from outside its
  package;
* the import graph has no cycle.

Each check is also run on a small package planted in a temporary folder with one violation of
each kind, so a checker that silently finds nothing fails here.
"""

from __future__ import annotations

from pathlib import Path

import module_graph as mg
import pytest

ROOT = Path(__file__).resolve().parents[1]

LAYERS = (("fp4sim._xp", "fp4sim._checks"), ("fp4sim.formats",), ("fp4sim.attention",),
          ("fp4sim.kernels",))
"""The library layers, lowest first (each a tuple of module or package names); every other
module is the application layer."""

def layer(name: str) -> int:
    """0 (the base) .. 3 (kernels), 4 for the applications; the root package ``fp4sim`` is the
    façade of formats and attention (layer 2)."""
    if name == "fp4sim":
        return 2
    for i, prefixes in enumerate(LAYERS):
        if any(name == p or name.startswith(p + ".") for p in prefixes):
            return i
    return len(LAYERS)


@pytest.fixture(scope="module")
def mods() -> dict[str, mg.Module]:
    return mg.load(ROOT)


def test_no_import_against_the_layer_order(mods):
    bad = [f"{i.importer} (layer {layer(i.importer)}) imports {i.target} (layer "
           f"{layer(i.target)}), line {i.line}" for i in mg.layer_violations(mods, layer)]
    assert not bad, "imports against the layer order:\n" + "\n".join(bad)


def test_no_private_name_crosses_modules(mods):
    bad = [f"{c.importer}:{c.line} takes {c.source}.{c.name} ({c.how})"
           for c in mg.private_crossings(mods)]
    assert not bad, "private names across modules (make them public or move them):\n" + \
        "\n".join(bad)


def test_no_import_cycle(mods):
    assert mg.cycles(mods) == []


def test_every_layer_exists(mods):
    for prefixes in LAYERS:
        assert all(p in mods for p in prefixes), prefixes
    assert {"fp4sim.golden", "fp4sim.report", "fp4sim.benchmarks"} <= set(mods)


def _plant(tmp_path: Path, files: dict[str, str]) -> dict[str, mg.Module]:
    for rel, text in files.items():
        path = tmp_path / "fp4sim" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return mg.load(tmp_path)


def test_the_checks_catch_planted_violations(tmp_path):
    mods = _plant(tmp_path, {
        "__init__.py": "",
        "_xp.py": "",
        "formats/__init__.py": "",
        "formats/codec.py": "def _helper():\n    pass\n",
        # against the layer order (formats -> attention), and a private name taken
        "formats/blocks.py": "from fp4sim.attention import forward\n"
                             "from fp4sim.formats.codec import _helper\n",
        "attention/__init__.py": "",
        "attention/_impl.py": "",
        # a private name read through a module alias, and a cycle with blocks
        "attention/forward.py": "from fp4sim.formats import codec, blocks\nx = codec._helper\n",
        "kernels/__init__.py": "",
        # a private module of another package
        "kernels/k.py": "from fp4sim.attention._impl import y\n",
    })
    violations = {(i.importer, i.target) for i in mg.layer_violations(mods, layer)}
    assert violations == {("fp4sim.formats.blocks", "fp4sim.attention.forward")}
    crossings = {(c.importer, c.name, c.how) for c in mg.private_crossings(mods)}
    assert crossings == {("fp4sim.formats.blocks", "_helper", "from-import"),
                         ("fp4sim.attention.forward", "_helper", "attribute"),
                         ("fp4sim.kernels.k", "_impl", "private module")}
    assert mg.cycles(mods) == [["fp4sim.attention.forward", "fp4sim.formats.blocks"]]
