"""The study's data: English prose that ships with every CPython, as byte tokens.

This module owns :func:`corpus_bytes` (the text of ``pydoc_data.topics``, the ~0.5 MB of
Python reference documentation that ``help()`` shows: present offline on every CPython, no
download), :func:`split_tokens` (train/validation split), :func:`validation_windows` (the
fixed held-out windows), :func:`corpus_info` (size, sha256 and
source for the record: the text differs between Python releases, so the record pins it) and
:func:`sample_windows` (random training windows inside a jitted step).

Tokens are **bytes** of the UTF-8 text (vocabulary 256): no tokenizer to train or ship, the
same vocabulary whatever the Python release's text, every character representable (a non-ASCII
character is 2-3 tokens), and predicting the next byte of identifiers and keywords that recur
across a paragraph exercises attention over long distances at a small model size. A character
vocabulary would depend on which characters a release's text happens to contain.
"""

from __future__ import annotations

import hashlib
import sys
from typing import Any

import numpy as np

__all__ = [
    "corpus_bytes",
    "corpus_info",
    "split_tokens",
    "sample_windows",
    "validation_windows",
    "VALIDATION_FRACTION",
]

VALIDATION_FRACTION = 0.1
"""The last tenth of the corpus is held out for validation."""


def corpus_bytes() -> bytes:
    """UTF-8 bytes of every ``pydoc_data.topics`` topic, in sorted topic order, separated by
    blank lines."""
    from pydoc_data import topics

    return "\n\n".join(topics.topics[k] for k in sorted(topics.topics)).encode("utf-8")


def corpus_info(data: bytes | None = None) -> dict[str, Any]:
    """Where the corpus came from and its fingerprint (for the JSON record)."""
    from pydoc_data import topics

    data = corpus_bytes() if data is None else data
    return {
        "source": "pydoc_data.topics (CPython's bundled reference documentation)",
        "python": sys.version.split()[0],
        "tokens": "bytes (UTF-8), vocabulary 256",
        "n_bytes": len(data),
        "n_topics": len(topics.topics),
        "sha256": hashlib.sha256(data).hexdigest(),
        "validation_fraction": VALIDATION_FRACTION,
    }


def split_tokens(data: bytes | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(train, validation) int32 token arrays: the first 90 % and the last 10 % of the bytes."""
    data = corpus_bytes() if data is None else data
    tokens = np.frombuffer(data, dtype=np.uint8).astype(np.int32)
    cut = int(round(len(tokens) * (1.0 - VALIDATION_FRACTION)))
    return tokens[:cut], tokens[cut:]


def sample_windows(key: Any, tokens: Any, batch: int, context: int) -> tuple[Any, Any]:
    """``batch`` random windows of ``context + 1`` consecutive tokens (jax, jit-able):
    inputs (batch, context) and next-token targets (batch, context)."""
    import jax

    n = tokens.shape[0]
    if n < context + 2:
        raise ValueError(f"tokens has {n} entries; needs at least context + 2 = {context + 2}")
    starts = jax.random.randint(key, (batch,), 0, n - context - 1)
    win = jax.vmap(lambda s: jax.lax.dynamic_slice_in_dim(tokens, s, context + 1))(starts)
    return win[:, :-1], win[:, 1:]


def validation_windows(tokens: np.ndarray, n: int, context: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` fixed, evenly spaced validation windows (inputs, targets), (n, context) int32."""
    if len(tokens) < context + 2:
        raise ValueError(
            f"validation split has {len(tokens)} tokens; needs at least context + 2 = {context + 2}"
        )
    starts = np.linspace(0, len(tokens) - context - 1, n).astype(np.int64)
    win = np.stack([tokens[s : s + context + 1] for s in starts])
    return win[:, :-1], win[:, 1:]
