"""The import graph of a Python package, read with ``ast`` (nothing is imported or executed).

Shared by ``tests/test_architecture.py`` (the guardrails: no import against the layer order, no
private name imported across modules, no cycle) and ``scripts/arch_metrics.py`` (the numbers of
docs/architecture.md: module sizes, cycles, private crossings, the share of ``Any``).

A *private crossing* is a name ``_x`` (not a dunder) that one module takes from another: ``from
m import _x``, or ``m._x`` read through an imported module ``m`` (``mod._x`` where ``mod`` is an
fp4sim module imported under that alias). Importing a private *module* (``_xp``, ``_ordered``)
is allowed only from inside the package that holds it (it is that package's private business).
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class Module:
    name: str  # dotted, e.g. fp4sim.attention.forward (a package is its __init__)
    path: Path
    is_package: bool
    lines: int
    tree: ast.Module


@dataclasses.dataclass(frozen=True)
class Import:
    importer: str
    target: str  # the module imported (a module of the package), dotted
    names: tuple[str, ...]  # names taken from it ("*" for a star import; () for import x)
    line: int


@dataclasses.dataclass(frozen=True)
class Crossing:
    importer: str
    source: str  # the module the private name belongs to
    name: str
    line: int
    how: str  # "from-import", "attribute" or "private module"


def load(root: Path, package: str = "fp4sim") -> dict[str, Module]:
    """Every module of ``root/package`` by dotted name."""
    base = root / package
    out = {}
    for path in sorted(base.rglob("*.py")):
        rel = path.relative_to(root).with_suffix("")
        parts = list(rel.parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts = parts[:-1]
        src = path.read_text()
        out[".".join(parts)] = Module(
            ".".join(parts), path, is_pkg, src.count("\n"), ast.parse(src, str(path))
        )
    return out


def _resolve(mod: Module, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    parts = mod.name.split(".")
    if not mod.is_package:
        parts = parts[:-1]
    parts = parts[: len(parts) - (node.level - 1)]
    return ".".join(parts + ([node.module] if node.module else []))


def imports(mods: dict[str, Module], package: str = "fp4sim") -> Iterator[Import]:
    """Every import of a package module by a package module (function-level ones included)."""
    for mod in mods.values():
        for node in ast.walk(mod.tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name == package or a.name.startswith(package + "."):
                        yield Import(mod.name, a.name, (), node.lineno)
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(mod, node)
                if not (base == package or base.startswith(package + ".")):
                    continue
                plain = []
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    if sub in mods:  # "from pkg import submodule"
                        yield Import(mod.name, sub, (), node.lineno)
                    else:
                        plain.append(a.name)
                if plain:
                    yield Import(mod.name, base, tuple(plain), node.lineno)


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _aliases(mod: Module, mods: dict[str, Module]) -> dict[str, str]:
    """Local names under which ``mod`` holds other package modules."""
    out = {}
    for node in ast.walk(mod.tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in mods and a.asname:
                    out[a.asname] = a.name
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(mod, node)
            for a in node.names:
                if f"{base}.{a.name}" in mods:
                    out[a.asname or a.name] = f"{base}.{a.name}"
    return out


def private_crossings(mods: dict[str, Module]) -> list[Crossing]:
    """Every private name one module takes from another (module docstring)."""
    out = []
    for imp in imports(mods):
        if imp.target == imp.importer:
            continue
        for name in imp.names:
            if _private(name):
                out.append(Crossing(imp.importer, imp.target, name, imp.line, "from-import"))
        leaf = imp.target.rsplit(".", 1)
        if len(leaf) == 2 and _private(leaf[1]):
            owner = leaf[0]  # the package holding the private module
            if not (imp.importer == owner or imp.importer.startswith(owner + ".")):
                out.append(Crossing(imp.importer, owner, leaf[1], imp.line, "private module"))
    for mod in mods.values():
        aliases = _aliases(mod, mods)
        for node in ast.walk(mod.tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                target = aliases.get(node.value.id)
                if (
                    target
                    and target != mod.name
                    and _private(node.attr)
                    and f"{target}.{node.attr}" not in mods
                ):
                    out.append(Crossing(mod.name, target, node.attr, node.lineno, "attribute"))
    return sorted(set(out), key=lambda c: (c.importer, c.line, c.name))


def layer_violations(mods: dict[str, Module], layer: Callable[[str], int]) -> list[Import]:
    """Imports of a module of a higher layer than the importer's."""
    return [
        imp
        for imp in imports(mods)
        if imp.target in mods and layer(imp.target) > layer(imp.importer)
    ]


def cycles(mods: dict[str, Module]) -> list[list[str]]:
    """Strongly connected components of more than one module in the import graph (a package's
    ``__init__`` importing its own submodules is not an edge: that is how it re-exports them)."""
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for imp in imports(mods):
        t = imp.target
        if t in mods and t != imp.importer and not t.startswith(imp.importer + "."):
            graph[imp.importer].add(t)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def any_share(mods: dict[str, Module]) -> tuple[int, int]:
    """(annotations mentioning ``Any``, all annotations) over parameters, returns and
    annotated assignments."""
    total = with_any = 0
    for mod in mods.values():
        for node in ast.walk(mod.tree):
            anns = []
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                anns = [x.annotation for x in a.posonlyargs + a.args + a.kwonlyargs]
                anns += [x.annotation for x in (a.vararg, a.kwarg) if x is not None]
                anns.append(node.returns)
            elif isinstance(node, ast.AnnAssign):
                anns = [node.annotation]
            for ann in anns:
                if ann is None:
                    continue
                total += 1
                with_any += "Any" in ast.unparse(ann)
    return with_any, total
