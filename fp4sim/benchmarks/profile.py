"""Per-kernel device time of a compiled jax call, from a ``jax.profiler`` trace, as a text table.

This module owns the benches' ``--profile DIR`` option: :func:`profile_calls` traces a few calls
of an already compiled function (``jax.profiler.trace``; no nsys or ncu needed), reads the XSpace
back (``jax.profiler.ProfileData``) and summarises the device planes: per call the module time,
the sum of kernel times and the kernel count (their ratio shows whether a call is launch-bound),
then the kernels with the most total time (the device planes' stream lines; on the CPU the
host's XLA thunks), grouped by HLO op, each with its share, count, and
the source location and op name the compiled HLO's metadata gives for it (which emulator step
it is). The table is printed and written to ``DIR/profile.txt``; the raw trace (megabytes)
goes to a temporary directory, removed afterwards.
"""

from __future__ import annotations

import collections
import glob
import os
import re
import tempfile
import time
from collections.abc import Callable
from typing import Any

__all__ = ["hlo_locations", "profile_calls", "summarize_trace"]

_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_FRAME = re.compile(r"stack_frame_id=(\d+)")
_TABLE_ROW = re.compile(r"^(\d+) (.*)$")
_FIELD = re.compile(r"(\w+)=(\d+)")


def _frames(hlo_text: str) -> dict[int, str]:
    """stack frame id -> ``file:line function < caller ...`` (at most 3 frames) from the tables
    (FileNames, FunctionNames, FileLocations, StackFrames) at the top of an HLO module's text."""
    tables: dict[str, dict[int, str]] = {}
    current = None
    for line in hlo_text.splitlines():
        if line in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
            current = tables.setdefault(line, {})
            continue
        m = _TABLE_ROW.match(line)
        if current is None or not m:
            if line.startswith("%") or line.startswith("ENTRY"):
                break
            current = None if not line.strip() else current
            continue
        current[int(m.group(1))] = m.group(2)
    files, funcs = tables.get("FileNames", {}), tables.get("FunctionNames", {})
    locs: dict[int, str] = {}
    for i, row in tables.get("FileLocations", {}).items():
        f = dict((k, int(v)) for k, v in _FIELD.findall(row))
        path = files.get(f.get("file_name_id", 0), "?").strip('"')
        cut = path.rfind("fp4sim/")
        path = path[cut + 7 :] if cut >= 0 else os.path.basename(path)
        locs[i] = (
            f"{path}:{f.get('line', 0)} {funcs.get(f.get('function_name_id', 0), '?').strip(chr(34))}"
        )
    parent: dict[int, tuple[int, int]] = {}
    for i, row in tables.get("StackFrames", {}).items():
        f = dict((k, int(v)) for k, v in _FIELD.findall(row))
        parent[i] = (f.get("file_location_id", 0), f.get("parent_frame_id", 0))
    out: dict[int, str] = {}
    for i in parent:
        chain, j, seen = [], i, set()
        while j in parent and j not in seen and len(chain) < 3:
            seen.add(j)
            loc, up = parent[j]
            chain.append(locs.get(loc, "?"))
            j = up
        out[i] = " < ".join(chain)
    return out


def hlo_locations(hlo_text: str) -> dict[str, str]:
    """HLO instruction name -> ``shape file:line function < caller ... | op name`` from the metadata
    of the compiled HLO text (its stack frame tables; files shortened below ``fp4sim/``)."""
    frames = _frames(hlo_text)
    out: dict[str, str] = {}
    for line in hlo_text.splitlines():
        m = _INSTR.match(line)
        if not m or "metadata=" not in line:
            continue
        name, rest = m.groups()
        op = _OP_NAME.search(rest)
        fr = _FRAME.search(rest)
        where = frames.get(int(fr.group(1)), "") if fr else ""
        parts = [
            c
            for c in (op.group(1).split("/") if op else [])
            if not c.startswith(("jit(", "jvp(", "transpose(", "vmap(", "branch_", "eval_jaxpr"))
            and c not in ("while", "body", "cond", "cond_fun", "body_fun", "pjit", "remat")
        ]
        shape = rest.split(" ", 1)[0].split("{")[0]
        shape = shape if len(shape) <= 40 else shape[:37] + "..."
        out[name] = f"{shape} {where} | {'/'.join(parts[-3:])}"
    return out


def summarize_trace(trace_dir: str, calls: int, top: int, hlo_text: str = "") -> list[str]:
    """The text table (lines) of the newest trace under ``trace_dir`` of ``calls`` calls: the
    device planes' stream lines (or the CPU's XLA thunks), the top ``top`` kernels by total
    time."""
    from jax.profiler import ProfileData

    files = sorted(glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True))
    if not files:
        return [f"no .xplane.pb under {trace_dir}"]
    data = ProfileData.from_file(files[-1])
    where = hlo_locations(hlo_text) if hlo_text else {}
    lines: list[str] = []
    for plane in data.planes:
        device = plane.name.startswith("/device:")
        if not device and plane.name != "/host:CPU":
            continue
        kernels: dict[str, list] = collections.defaultdict(lambda: [0.0, 0, set()])
        module_ns, n_kernels, kernel_ns = 0.0, 0, 0.0
        spans: list[tuple[float, float]] = []
        for line in plane.lines:
            name = line.name
            if name == "XLA Modules":
                for ev in line.events:
                    module_ns += ev.duration_ns
                continue
            if device and not name.startswith("Stream"):
                continue
            for ev in line.events:
                stats = dict(ev.stats)
                if not device and "hlo_op" not in stats:  # XLA:CPU thunks only
                    continue
                op = str(stats.get("hlo_op", "")) or ev.name
                k = kernels[op]
                k[0] += ev.duration_ns
                k[1] += 1
                if len(k[2]) < 2:
                    k[2].add(ev.name)
                n_kernels += 1
                kernel_ns += ev.duration_ns
                spans.append((ev.start_ns, ev.start_ns + ev.duration_ns))
        if not n_kernels:
            continue
        busy, end = 0.0, -1.0
        for a, b in sorted(spans):  # the union of the kernels' intervals
            if b <= end:
                continue
            busy += b - max(a, end)
            end = b
        lines.append(
            f"== {plane.name}: per call: module {module_ns / calls / 1e6:.3f} ms, kernels "
            f"{kernel_ns / calls / 1e6:.3f} ms (busy {busy / calls / 1e6:.3f} ms), "
            f"{n_kernels / calls:.0f} kernels"
        )
        lines.append(f"  {'ms/call':>9s} {'share':>6s} {'n/call':>7s}  hlo op [kernel]  -- where")
        rows = sorted(kernels.items(), key=lambda kv: -kv[1][0])[:top]
        for op, (ns, count, names) in rows:
            kname = ",".join(sorted(names))
            label = op if kname == op else f"{op} [{kname[:60]}]"
            loc = where.get(op, "")
            if len(loc) > 160:
                loc = loc[:157] + "..."
            lines.append(
                f"  {ns / calls / 1e6:9.4f} {100 * ns / kernel_ns:5.1f}% {count / calls:7.1f}  "
                f"{label}  -- {loc}"
            )
    return lines or ["no device kernels in the trace"]


def profile_calls(
    fn: Callable[[], Any], compiled: Any, out_dir: str, *, calls: int = 3, top: int = 30
) -> list[str]:
    """Trace ``calls`` calls of ``fn`` (each blocking; ``fn`` compiled and warmed up already)
    into a temporary directory, print the table of :func:`summarize_trace` (with the HLO of
    ``compiled``, a ``jax.stages.Compiled`` or None, for the source locations), write it to
    ``out_dir/profile.txt`` and return its lines."""
    import jax

    os.makedirs(out_dir, exist_ok=True)
    hlo = ""
    if compiled is not None:
        try:
            hlo = compiled.as_text()
        except Exception as e:  # noqa: BLE001 - the table is still useful without locations
            hlo = ""
            print(f"(no HLO text for the locations: {type(e).__name__}: {e})")
    jax.block_until_ready(fn())
    with tempfile.TemporaryDirectory(prefix="fp4sim-trace-") as trace_dir:
        t0 = time.perf_counter()
        with jax.profiler.trace(trace_dir):
            for _ in range(calls):
                jax.block_until_ready(fn())
        wall = (time.perf_counter() - t0) / calls
        lines = [f"{calls} traced calls, {wall * 1e3:.3f} ms each (wall, with the profiler)"]
        lines += summarize_trace(trace_dir, calls, top, hlo)
    with open(os.path.join(out_dir, "profile.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)
    return lines
