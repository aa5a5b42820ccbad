"""Golden vectors for kernel CI: named cases, their byte-reproducible files, and a bitwise check.

The application layer's golden package. It owns:

* :mod:`fp4sim.golden.store` — the registry (:data:`CASES`, :func:`register`), the ``.npz`` +
  ``manifest.json`` files (:func:`write`) and the bitwise :func:`check`;
* :mod:`fp4sim.golden.cases_formats`, :mod:`fp4sim.golden.cases_attention` — the registered
  cases, one module per library layer, each calling only public emulators;
* :mod:`fp4sim.golden.cli` — ``python -m fp4sim golden {write, check, list}``;
* ``data/`` — the set shipped with fp4sim (package data, :data:`DATA_DIR`; ``FORMAT.md``
  there describes the files for other languages; ``presets/`` holds third-party libraries'
  outputs that the formats tests compare with).

>>> from fp4sim import golden
>>> "formats.e2m1.all_codes" in golden.CASES
True
"""

from fp4sim.golden import cases_attention as _cases_attention  # noqa: F401  (registers its cases)
from fp4sim.golden import cases_formats as _cases_formats  # noqa: F401  (registers its cases)
from fp4sim.golden.store import (
    CASES,
    DATA_DIR,
    DEFAULT_DIR,
    FORMAT_VERSION,
    PLAIN_DTYPES,
    GoldenCase,
    GoldenMismatch,
    array_sha256,
    check,
    display_dir,
    generate,
    register,
    write,
)

__all__ = [
    "GoldenCase",
    "GoldenMismatch",
    "CASES",
    "register",
    "generate",
    "write",
    "check",
    "array_sha256",
    "display_dir",
    "DATA_DIR",
    "DEFAULT_DIR",
    "FORMAT_VERSION",
    "PLAIN_DTYPES",
]
