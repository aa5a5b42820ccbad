"""Assemble the PTX instructions a cross-lowered Mosaic GPU kernel emits with ``ptxas``.

This module owns the host-side check that the architecture-specific instructions of a kernel
are valid for the target (``ptxas -arch=sm_100a``) on a machine without that GPU. After
:func:`fp4sim.kernels.harness.cross_lower`, a Mosaic GPU kernel is an MLIR module in which every
``tcgen05`` instruction (``tcgen05.mma ... block_scale``, ``tcgen05.cp``, ``tcgen05.ld``,
``tcgen05.alloc``/``dealloc``, ...) is an ``llvm.inline_asm`` op carrying its PTX text; the
rest (TMA copies, mbarriers, fences, address arithmetic) is in the ``llvm``/``nvvm`` dialects
that the CUDA plugin's LLVM lowers at compile time. :func:`kernel_snippets` collects the inline
PTX (plus the ``nvvm.tcgen05.*`` ops, written out as their PTX), :func:`ptx_program` wraps each
snippet in its own scope of one ``.entry`` with typed registers for its operands (from the
operand types and constraint letters), and :func:`assemble` runs ptxas on it.

What this proves: each of those instructions, with the qualifiers, shapes and operand types the
lowering chose, is accepted by ptxas for the architecture. What it does not: the whole kernel's
PTX (that needs the CUDA plugin's compile pipeline, i.e. a GPU machine) and anything about what
the instructions compute.

``ptxas`` is looked up as ``$FP4SIM_PTXAS``, then in the ``nvidia-cuda-nvcc`` pip package (a
``dev`` extra of fp4sim), then on ``PATH``.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fp4sim.kernels.harness import Arch, cross_lower

__all__ = [
    "PtxSnippet",
    "AssemblyResult",
    "find_ptxas",
    "kernel_snippets",
    "ptx_program",
    "assemble",
    "check_kernel",
]

_SM = {Arch.SM90A: "sm_90a", Arch.SM100A: "sm_100a"}
_REG = {
    "r": ("b32", "r"),
    "l": ("b64", "rd"),
    "h": ("b16", "h"),
    "b": ("pred", "p"),
    "f": ("f32", "f"),
    "d": ("f64", "fd"),
}
_NVVM = {  # nvvm ops of Blackwell that the inline assembly does not cover, as PTX
    "nvvm.tcgen05.commit.cg1": (
        "tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64 [$0];",
        "r",
    ),
    "nvvm.tcgen05.commit.cg2": (
        "tcgen05.commit.cta_group::2.mbarrier::arrive::one.shared::cluster.b64 [$0];",
        "r",
    ),
    "nvvm.tcgen05.fence": ("tcgen05.fence::{kind}_thread_sync;", ""),
}


@dataclasses.dataclass(frozen=True, slots=True)
class PtxSnippet:
    """One PTX instruction sequence of a kernel: ``asm`` with ``$i`` operands, LLVM
    ``constraints`` (``=r,r,l,b``...), the MLIR ``source`` op."""

    asm: str
    constraints: str
    source: str = "llvm.inline_asm"

    @property
    def mnemonic(self) -> str:
        """The snippet's main instruction (its first ``tcgen05`` one, else its first), as
        ``family.op`` (``tcgen05.mma``, ``tcgen05.cp``, ``mbarrier.init``)."""
        names = []
        for line in re.split(r"[;{}\n]", self.asm):
            line = re.sub(r"^@!?[$%]?\w+\s+", "", line.strip())
            if line and not line.startswith((".reg", "//")):
                names.append(".".join(line.split()[0].split(".")[:2]))
        return next((n for n in names if n.startswith("tcgen05")), names[0] if names else "")


@dataclasses.dataclass(frozen=True, slots=True)
class AssemblyResult:
    ok: bool
    ptxas: str
    arch: str
    snippets: int
    mnemonics: tuple[str, ...]
    log: str


def find_ptxas() -> str | None:
    """Path of a ptxas binary, or None."""
    env = os.environ.get("FP4SIM_PTXAS")
    if env:
        return env if Path(env).exists() else None
    try:
        import nvidia

        for base in getattr(nvidia, "__path__", []):
            for sub in ("cu13", "cuda_nvcc", "cu12"):
                cand = Path(base) / sub / "bin" / "ptxas"
                if cand.exists():
                    return str(cand)
    except ImportError:
        pass
    return shutil.which("ptxas")


def _walk(op: Any, visit: Callable[[Any], None]) -> None:
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                visit(inner.operation)
                _walk(inner.operation, visit)


def kernel_snippets(
    fn: Callable[..., Any], *avals: Any, arch: Arch = Arch.SM100A
) -> list[PtxSnippet]:
    """The PTX snippets of every Mosaic GPU kernel ``fn`` lowers to for ``arch`` (distinct ones,
    in order of appearance)."""
    from jax._src.lib.mlir import ir

    found: list[PtxSnippet] = []

    def visit(op: Any) -> None:
        if op.name == "llvm.inline_asm":
            asm = ir.StringAttr(op.attributes["asm_string"]).value
            cons = ir.StringAttr(op.attributes["constraints"]).value
            found.append(PtxSnippet(asm, cons))
        elif op.name in _NVVM:
            asm, cons = _NVVM[op.name]
            if "{kind}" in asm:  # the fence's <before>/<after> attribute
                kind = "before" if "before" in str(op) else "after"
                asm = asm.format(kind=kind)
            found.append(PtxSnippet(asm, cons, op.name))

    cross_lower(fn, *avals, arch=arch, on_module=lambda m: _walk(m.operation, visit))
    seen, out = set(), []
    for s in found:
        if (s.asm, s.constraints) not in seen:
            seen.add((s.asm, s.constraints))
            out.append(s)
    return out


def ptx_program(snippets: list[PtxSnippet], arch: Arch = Arch.SM100A, version: str = "8.8") -> str:
    """A PTX module with one ``.entry`` holding every snippet in its own ``{ }`` scope, its
    operands bound to initialised registers of the constraint's type."""
    counts = {k: 0 for k in _REG}
    body = []
    for s in snippets:
        cons = [c for c in s.constraints.split(",") if c]
        names = []
        for c in cons:
            letter = c.lstrip("=+&*")
            if letter == "n":
                names.append("0")
                continue
            if letter not in _REG:
                raise ValueError(f"constraint {c!r} of {s.asm!r} is not one of {sorted(_REG)}")
            _, prefix = _REG[letter]
            names.append(f"%{prefix}{counts[letter]}")
            counts[letter] += 1
        text = re.sub(r"\$(\d+)", lambda m, names=names: names[int(m.group(1))], s.asm)
        body.append("  {\n" + text + "\n  }")
    decls, init = ["  .reg .b32 %lane;"], ["  mov.u32 %lane, %tid.x;"]
    for letter, (ty, prefix) in _REG.items():
        n = counts[letter]
        if not n:
            continue
        decls.append(f"  .reg .{ty} %{prefix}<{n}>;")
        for i in range(n):
            if letter == "b":
                init.append(f"  setp.ne.u32 %{prefix}{i}, %lane, {i};")
            elif letter == "l":
                init.append(f"  mov.u64 %{prefix}{i}, {8 * i};")
            elif letter in ("f", "d"):
                init.append(
                    f"  mov.{ty} %{prefix}{i}, 0f00000000;"
                    if ty == "f32"
                    else f"  mov.f64 %{prefix}{i}, 0d0000000000000000;"
                )
            else:
                init.append(f"  mov.{ty} %{prefix}{i}, {16 * i};")
    return "\n".join(
        [
            f".version {version}",
            f".target {_SM[arch]}",
            ".address_size 64",
            "",
            ".visible .entry fp4sim_ptx_check()",
            "{",
            *decls,
            *init,
            *body,
            "  ret;",
            "}",
            "",
        ]
    )


def assemble(
    snippets: list[PtxSnippet], arch: Arch = Arch.SM100A, ptxas: str | None = None
) -> AssemblyResult:
    """Run ``ptxas -arch=<arch>`` on :func:`ptx_program` (the newest PTX ISA version the
    ptxas accepts among 9.0, 8.8, 8.7). ``FileNotFoundError`` without a ptxas."""
    ptxas = ptxas or find_ptxas()
    if ptxas is None:
        raise FileNotFoundError(
            "no ptxas: install the dev extra (nvidia-cuda-nvcc) or set FP4SIM_PTXAS"
        )
    mnemonics = tuple(dict.fromkeys(s.mnemonic for s in snippets))
    log = ""
    with tempfile.TemporaryDirectory() as tmp:
        src, obj = Path(tmp) / "check.ptx", Path(tmp) / "check.cubin"
        for version in ("9.0", "8.8", "8.7"):
            src.write_text(ptx_program(snippets, arch, version))
            proc = subprocess.run(
                [ptxas, f"-arch={_SM[arch]}", str(src), "-o", str(obj)],
                capture_output=True,
                text=True,
                timeout=300,
            )
            log = (proc.stdout + proc.stderr).strip()
            if proc.returncode == 0:
                return AssemblyResult(True, ptxas, _SM[arch], len(snippets), mnemonics, log)
            if "Unsupported .version" not in log:
                break
    return AssemblyResult(False, ptxas, _SM[arch], len(snippets), mnemonics, log)


def check_kernel(
    fn: Callable[..., Any], *avals: Any, arch: Arch = Arch.SM100A, ptxas: str | None = None
) -> AssemblyResult:
    """Cross-lower ``fn`` for ``arch`` and assemble the PTX its kernels carry."""
    return assemble(kernel_snippets(fn, *avals, arch=arch), arch, ptxas)
