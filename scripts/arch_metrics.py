"""Print the structure numbers of docs/architecture.md: module count and sizes, import cycles,
private names crossing modules, imports against the layer order, the share of ``Any``.

    python scripts/arch_metrics.py            # from the repository root

The graph is read with ``ast`` by ``tests/module_graph.py`` (the same code the guardrail tests
``tests/test_architecture.py`` use); nothing of fp4sim is imported.
"""

from __future__ import annotations

import collections
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import module_graph as mg  # noqa: E402
from test_architecture import layer  # noqa: E402


def main() -> int:
    mods = mg.load(ROOT)
    total = sum(m.lines for m in mods.values())
    print(f"modules: {len(mods)} ({total} lines)")
    groups: dict[str, list[int]] = collections.defaultdict(list)
    for name, m in mods.items():
        parts = name.split(".")
        key = ".".join(parts[:2]) if len(parts) > 1 and f"{parts[0]}.{parts[1]}" in mods \
            and mods[f"{parts[0]}.{parts[1]}"].is_package else "fp4sim (root modules)"
        groups[key].append(m.lines)
    for key in sorted(groups):
        print(f"  {key}: {len(groups[key])} modules, {sum(groups[key])} lines")
    big = sorted(((m.lines, n) for n, m in mods.items()), reverse=True)[:8]
    print("largest: " + ", ".join(f"{n} {k}" for k, n in big))
    print(f"import cycles: {mg.cycles(mods)}")
    crossings = mg.private_crossings(mods)
    names = {(c.source, c.name) for c in crossings}
    print(f"private names crossing modules: {len(names)} names, {len(crossings)} uses")
    for c in crossings:
        print(f"  {c.importer}:{c.line} {c.source}.{c.name} ({c.how})")
    bad = mg.layer_violations(mods, layer)
    print(f"imports against the layer order: {len(bad)}")
    with_any, n = mg.any_share(mods)
    print(f"annotations mentioning Any: {with_any} of {n} ({100 * with_any / max(n, 1):.1f} %)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
