"""The causal leak probe (after FLAMIA's, github.com/yandex-research/flamia-blackwell-attention): can a future token change earlier outputs?

This module owns :func:`leak_probe` and its result :class:`LeakReport`. Protocol:

1. Fixed inputs: token inputs ``X`` (N × d_model, standard normal), projections ``Wq, Wk, Wv``
   (d_model × head_dim, normal with variance 1/d_model), upstream gradient ``dO`` (N × head_dim,
   standard normal); causal mask; one (batch, head).
2. A target future token ``j*`` whose scale groups also hold past tokens (default
   ``77·N/128``: 77 for N = 128, inside the 32-token group 64..95, as in the seed).
3. Perturb the *input* of ``j*``: ``X[j*] ← gain · X[j*]`` (default gain 5), so that its K and V
   entries become their groups' maxima. The default gain is deliberately *not* a power of two
   (FLAMIA used 4): when ``j*`` already held a group's max, a power-of-two gain rescales a
   non-power-of-two scale (FP32 amax/448, UE4M3) by exactly that power of two, and E4M3
   rounding is invariant under it — which hides a real leak (measured: per-tensor amax/448 at
   gain 4 gives 1.7e-6 on the default inputs, at gain 5 6.5e-2). The probe then checks that the scale of at least one
   group holding ``j*`` really changed (K or V: block scale codes or FP32 factor); if none did,
   the probe proves nothing and the report says ``vacuous`` (a gain of 1.3 is typically vacuous).
4. Re-run the emulated forward and backward with everything else identical.
5. Metric: ``leak_O = max_{i<j*} ‖O'_i − O_i‖_∞ / max_{i<j*} ‖O_i‖_∞``, the same for dQ.
   ``0.0`` is reported only when the earlier rows are *bitwise* identical (``bitwise_o``,
   ``bitwise_dq``; a difference below the float64 resolution of the ratio would still be
   reported as the smallest positive float).

Which class to expect is :func:`fp4sim.attention.causal.leak_class` of the recipe's operand
scalings.

Measured with the defaults on :data:`fp4sim.attention.autodiff.LEAK_TABLE` (leak_O / leak_dQ;
gain 5, then FLAMIA's gain 4): V unquantized, V per-token pow2, V token-block ceil, V MXFP8
32-token RCEIL: 0 / 0 (bitwise) at both gains; OCP floor 1.2e-2 / 7.2e-3 (same at 4); MXFP4
2.8e-2 / 1.3e-2 (4: 2.8e-2 / 1.0e-2); NVFP4 16-token 2.6e-2 / 1.6e-2 (4: 2.6e-2 / 2.3e-2);
per-tensor amax/448 6.5e-2 / 6.4e-2 (4: 1.7e-6 / 0, the hidden case above); per-tensor pow2
2.6e-6 / 0 (both); dS 32×32 floor with V per-token 0 / 1.2e-2 (4: 0 / 3.1e-6).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from fp4sim.attention import operands
from fp4sim.attention.recipe import TrainingRecipe

__all__ = ["LeakReport", "leak_probe", "probe_inputs", "leak_metric"]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class LeakReport:
    """Result of one :func:`leak_probe` run (see the module docstring)."""

    recipe: str
    target: int
    gain: float
    leak_o: float
    leak_dq: float
    bitwise_o: bool
    bitwise_dq: bool
    scale_changed: bool
    changed_operands: tuple[str, ...]

    @property
    def vacuous(self) -> bool:
        """True when no scale of a group holding the target changed: the probe proves nothing."""
        return not self.scale_changed

    def __str__(self) -> str:
        flag = " (VACUOUS: no scale changed)" if self.vacuous else ""
        return (
            f"{self.recipe}: leak_O={self.leak_o:.3g} leak_dQ={self.leak_dq:.3g} "
            f"target={self.target} gain={self.gain}{flag}"
        )


def probe_inputs(
    n_tokens: int = 128, d_model: int = 64, head_dim: int = 64, *, seed: int = 0
) -> dict[str, np.ndarray]:
    """The fixed float32 inputs of the probe: ``x``, ``wq``, ``wk``, ``wv``, ``d_out``."""
    for name, value in (("n_tokens", n_tokens), ("d_model", d_model), ("head_dim", head_dim)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} must be a positive int")
    rng = np.random.default_rng(seed)
    f = np.float32
    w = 1.0 / np.sqrt(d_model)
    return {
        "x": rng.standard_normal((n_tokens, d_model)).astype(f),
        "wq": (w * rng.standard_normal((d_model, head_dim))).astype(f),
        "wk": (w * rng.standard_normal((d_model, head_dim))).astype(f),
        "wv": (w * rng.standard_normal((d_model, head_dim))).astype(f),
        "d_out": rng.standard_normal((n_tokens, head_dim)).astype(f),
    }


def leak_metric(before: np.ndarray, after: np.ndarray, target: int) -> tuple[float, bool]:
    """``(max_{i<target} ‖after_i − before_i‖_∞ / max_{i<target} ‖before_i‖_∞, bitwise equal)``."""
    b = np.asarray(before, dtype=np.float64)[:target]
    a = np.asarray(after, dtype=np.float64)[:target]
    same = bool(
        np.array_equal(
            np.asarray(before)[:target].view(np.uint32), np.asarray(after)[:target].view(np.uint32)
        )
    )
    if same:
        return 0.0, True
    denom = float(np.max(np.abs(b)))
    diff = float(np.max(np.abs(a - b)))
    if not np.isfinite(diff) or denom == 0.0:
        return float("inf"), False
    return max(diff / denom, np.finfo(np.float64).tiny), False


def _group_scales_changed(
    x0: np.ndarray, x1: np.ndarray, scaling: operands.OperandScaling, target: int
) -> bool:
    """Did any scale (block code or FP32 factor) covering row ``target`` change?"""
    from fp4sim.formats import blocks

    q0 = operands.quantize_operand(x0, scaling)
    q1 = operands.quantize_operand(x1, scaling)
    if q0 is None:
        return False
    changed = False
    if q0.scales is not None:
        s0 = np.asarray(blocks.expand_scales(np.asarray(q0.scales), q0))
        s1 = np.asarray(blocks.expand_scales(np.asarray(q1.scales), q1))
        changed |= bool(np.any(s0[target] != s1[target]))
    if q0.global_scale is not None:
        g0 = np.broadcast_to(
            np.asarray(q0.global_scale),
            np.asarray(q0.scales).shape if q0.scales is not None else (),
        )
        g1 = np.broadcast_to(np.asarray(q1.global_scale), g0.shape)
        if q0.scales is not None:
            g0 = np.asarray(blocks.expand_scales(np.ascontiguousarray(g0), q0))
            g1 = np.asarray(blocks.expand_scales(np.ascontiguousarray(g1), q1))
            changed |= bool(np.any(g0[target] != g1[target]))
        else:
            changed |= bool(np.any(g0 != g1))
    return changed


def leak_probe(
    recipe: TrainingRecipe,
    *,
    n_tokens: int = 128,
    d_model: int = 64,
    head_dim: int = 64,
    target: int | None = None,
    gain: float = 5.0,
    seed: int = 0,
    softmax_scale: float | None = None,
) -> LeakReport:
    """Run the probe of the module docstring for ``recipe`` (NumPy, one head, causal)."""
    from fp4sim.attention.autodiff import training_backward, training_forward

    if not isinstance(recipe, TrainingRecipe):
        raise TypeError(f"recipe={recipe!r} must be a TrainingRecipe")
    inputs = probe_inputs(n_tokens, d_model, head_dim, seed=seed)  # validates the sizes
    if target is None:
        target = (77 * n_tokens) // 128
    if not (isinstance(target, int) and 0 < target < n_tokens):
        raise ValueError(
            f"target={target!r} must be an int in 1..{n_tokens - 1} (it needs "
            f"earlier rows to measure)"
        )
    if not (np.isfinite(gain) and gain > 0):
        raise ValueError(f"gain={gain!r} must be a positive finite number")
    x1 = inputs["x"].copy()
    x1[target] = (np.float32(gain) * x1[target]).astype(np.float32)

    results = []
    qkv = []
    for x in (inputs["x"], x1):
        q, k, v = (x @ inputs[w] for w in ("wq", "wk", "wv"))
        out, saved = training_forward(q, k, v, recipe, softmax_scale=softmax_scale, causal=True)
        trace = training_backward(saved, inputs["d_out"], recipe)
        results.append((np.asarray(out), np.asarray(trace.grads.dq)))
        qkv.append((q, k, v))

    changed = tuple(
        name
        for name, i, scaling in (("q", 0, recipe.qk), ("k", 1, recipe.qk), ("v", 2, recipe.v))
        if _group_scales_changed(qkv[0][i], qkv[1][i], scaling, target)
    )
    leak_o, bit_o = leak_metric(results[0][0], results[1][0], target)
    leak_dq, bit_dq = leak_metric(results[0][1], results[1][1], target)
    return LeakReport(
        recipe=recipe.name,
        target=target,
        gain=float(gain),
        leak_o=leak_o,
        leak_dq=leak_dq,
        bitwise_o=bit_o,
        bitwise_dq=bit_dq,
        scale_changed=bool(changed),
        changed_operands=changed,
    )
