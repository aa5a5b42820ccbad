"""Frozen configurations of the training study, and its named sizes.

This module owns :class:`ModelConfig` (the transformer's shape), :class:`OptimConfig` (AdamW with
warm-up, gradient clipping), :class:`StudyConfig` (everything a run needs besides the recipes:
batch, seeds, steps, chunking, the backward accumulation, the time budget, the leak check) and
:data:`SIZES`, the named sizes (``smoke`` for CI, ``cpu`` for a study on two CPU cores, ``h200``
for the GPU study). Every config is keyword-only, validated and hashable; nothing here imports
jax.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from typing import Any

from fp4sim.attention.backward import BackwardAccumulation

__all__ = ["Device", "ModelConfig", "OptimConfig", "StudyConfig", "SIZES", "size"]


class Device(enum.Enum):
    """Where the study runs (jax's platform name)."""

    CPU = "cpu"
    GPU = "gpu"


def _positive_int(owner: str, name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{owner}.{name}={value!r} must be a positive int")


def _positive_float(owner: str, name: str, value: Any, *, zero_ok: bool = False) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not (value >= 0 if zero_ok else value > 0)
        or value != value
        or value == float("inf")
    ):
        raise ValueError(
            f"{owner}.{name}={value!r} must be a finite "
            f"{'non-negative' if zero_ok else 'positive'} number"
        )


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ModelConfig:
    """A pre-LayerNorm decoder-only transformer over byte tokens (:mod:`fp4sim.train.model`).

    ``width`` = model dimension, ``heads`` attention heads of ``width // heads`` dimensions
    (a multiple of 32: the emulated recipes' MXFP8 blocks run along the head dimension),
    ``context`` tokens per sequence (a multiple of 32: the 32-token V blocks and 32×32 dS
    tiles then cover whole groups), an MLP of ``mlp_ratio · width`` with GELU, learned
    positions, the output head tied to the token embedding."""

    vocab: int = 256
    layers: int = 2
    width: int = 128
    heads: int = 2
    context: int = 128
    mlp_ratio: int = 4

    def __post_init__(self) -> None:
        own = "ModelConfig"
        for name in ("vocab", "layers", "width", "heads", "context", "mlp_ratio"):
            _positive_int(own, name, getattr(self, name))
        if self.width % self.heads:
            raise ValueError(f"{own}.width={self.width} must be a multiple of heads={self.heads}")
        if self.head_dim % 32:
            raise ValueError(
                f"{own}: head dimension width/heads = {self.head_dim} must be a "
                f"multiple of 32 (MXFP8 blocks of 32 along the head dimension)"
            )
        if self.context % 32:
            raise ValueError(f"{own}.context={self.context} must be a multiple of 32")

    @property
    def head_dim(self) -> int:
        return self.width // self.heads

    @property
    def n_params(self) -> int:
        """Trainable parameters (the head is tied to the embedding)."""
        d, f = self.width, self.mlp_ratio * self.width
        per_layer = 4 * d + 3 * d * d + d * d + d * f + f + f * d + d
        return self.vocab * d + self.context * d + self.layers * per_layer + 2 * d

    def train_flops_per_token(self) -> float:
        """Model FLOPs per token of one training step (forward + backward ≈ 3x forward):
        ``6·N`` for the weights plus causal attention's ``3·2·2·(S/2)·d`` per layer (the
        QKᵀ and PV products over the visible half of the keys). The emulated recipes do far
        more elementwise work than this; it is the yardstick, not their cost."""
        attn = 3 * 2 * 2 * (self.context / 2) * self.width * self.layers
        return 6.0 * self.n_params + attn


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class OptimConfig:
    """AdamW (decoupled weight decay on matrices only) after global-norm gradient clipping,
    learning rate linear warm-up over ``warmup_steps`` then constant (the schedule does not
    depend on the number of steps, which a time budget decides only after the warm-up).

    ``loss_scale`` (a power of two): the loss is multiplied by it before differentiation and the
    gradients divided by it after, as in mixed-precision training. Exact for float32 (a power
    of two commutes with rounding): the jnp float32 model's bits do not depend on it. It
    matters where the emulated backward casts dO to E5M2 without a scale: at this model's
    gradient scale (a mean over batch × context tokens: dO ≈ 1e-5..1e-6, E5M2's smallest
    normal 2^-14 ≈ 6e-5) an unscaled dO underflows and the attention learns little (the first
    H200 run, loss scale 1: every FP8 backward 0.27 nats behind float32 after 550 steps). The
    default 2^12 puts dO in E5M2's normal range."""

    lr: float = 1e-3
    warmup_steps: int = 50
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1
    clip_norm: float = 1.0
    loss_scale: float = 4096.0

    def __post_init__(self) -> None:
        own = "OptimConfig"
        _positive_float(own, "lr", self.lr)
        _positive_int(own, "warmup_steps", self.warmup_steps)
        for name in ("b1", "b2"):
            v = getattr(self, name)
            if not (isinstance(v, float) and 0.0 <= v < 1.0):
                raise ValueError(f"{own}.{name}={v!r} must be a float in [0, 1)")
        _positive_float(own, "eps", self.eps)
        _positive_float(own, "weight_decay", self.weight_decay, zero_ok=True)
        _positive_float(own, "clip_norm", self.clip_norm)
        _positive_float(own, "loss_scale", self.loss_scale)
        if math.frexp(self.loss_scale)[0] != 0.5:
            raise ValueError(
                f"{own}.loss_scale={self.loss_scale!r} must be a power of two "
                f"(exact scaling of float32 gradients)"
            )


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class StudyConfig:
    """One run of the study (:func:`fp4sim.train.study.run_study`).

    ``batch`` sequences per seed and step; ``seeds`` train side by side (``vmap`` inside one
    jit: the same initialization and data order per seed for every recipe); ``steps`` the most
    steps per recipe (a time budget may allow fewer: every recipe then runs the same smaller
    number); ``chunk`` steps per dispatch (one ``lax.scan``, one host synchronization; the
    budget is checked between chunks); ``accumulation`` the emulated backward's float32 products
    (:class:`~fp4sim.attention.backward.BackwardAccumulation`: ``BACKEND`` = XLA's dot, fast;
    ``SEQUENTIAL`` = the bit-exact ordered sums); ``time_budget_s`` the wall-clock limit of the
    whole run including compilation (None: no limit, ``steps`` steps); ``eval_batches``
    validation sequences = ``eval_batches · batch``; ``divergence_margin`` (nats): a seed
    diverges at the first step whose loss is not finite or exceeds the running minimum of its
    ``smooth``-step moving average by more than the margin; ``leak_target`` the first perturbed
    position of the causal-leak check (None: ``77·context // 128``, inside a 32-token group as
    in :func:`fp4sim.attention.leak.leak_probe`)."""

    model: ModelConfig = ModelConfig()
    optim: OptimConfig = OptimConfig()
    batch: int = 4
    seeds: tuple[int, ...] = (0, 1, 2)
    steps: int = 300
    chunk: int = 10
    accumulation: BackwardAccumulation = BackwardAccumulation.BACKEND
    time_budget_s: float | None = None
    eval_batches: int = 2
    divergence_margin: float = 1.0
    smooth: int = 20
    leak_target: int | None = None
    device: Device = Device.CPU

    def __post_init__(self) -> None:
        own = "StudyConfig"
        if not isinstance(self.model, ModelConfig):
            raise TypeError(f"{own}.model={self.model!r} must be a ModelConfig")
        if not isinstance(self.optim, OptimConfig):
            raise TypeError(f"{own}.optim={self.optim!r} must be an OptimConfig")
        for name in ("batch", "steps", "chunk", "eval_batches", "smooth"):
            _positive_int(own, name, getattr(self, name))
        if (
            not isinstance(self.seeds, tuple)
            or not self.seeds
            or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in self.seeds)
        ):
            raise ValueError(
                f"{own}.seeds={self.seeds!r} must be a non-empty tuple of non-negative ints"
            )
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"{own}.seeds={self.seeds!r} must not repeat a seed")
        if self.steps % self.chunk:
            raise ValueError(f"{own}.steps={self.steps} must be a multiple of chunk={self.chunk}")
        if not isinstance(self.accumulation, BackwardAccumulation):
            raise TypeError(
                f"{own}.accumulation={self.accumulation!r} must be a "
                f"BackwardAccumulation; allowed: "
                f"{[m.name for m in BackwardAccumulation]}"
            )
        if self.time_budget_s is not None:
            _positive_float(own, "time_budget_s", self.time_budget_s)
        _positive_float(own, "divergence_margin", self.divergence_margin)
        if self.leak_target is not None and not (
            isinstance(self.leak_target, int) and 0 < self.leak_target < self.model.context
        ):
            raise ValueError(
                f"{own}.leak_target={self.leak_target!r} must be an int in "
                f"1..{self.model.context - 1}"
            )
        if not isinstance(self.device, Device):
            raise TypeError(
                f"{own}.device={self.device!r} must be a Device; allowed: "
                f"{[d.name for d in Device]}"
            )

    @property
    def target(self) -> int:
        """The first perturbed position of the causal-leak check."""
        return (77 * self.model.context) // 128 if self.leak_target is None else self.leak_target

    def replace(self, **changes: Any) -> StudyConfig:
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: enums by name, nested configs as dicts."""

        def conv(v: Any) -> Any:
            if isinstance(v, enum.Enum):
                return v.name
            if dataclasses.is_dataclass(v):
                return {f.name: conv(getattr(v, f.name)) for f in dataclasses.fields(v)}
            if isinstance(v, tuple):
                return [conv(x) for x in v]
            return v

        return conv(self)


SIZES: dict[str, StudyConfig] = {
    "smoke": StudyConfig(
        model=ModelConfig(layers=1, width=64, heads=2, context=64),
        batch=2,
        seeds=(0, 1),
        steps=4,
        chunk=2,
        eval_batches=1,
        optim=OptimConfig(warmup_steps=2),
    ),
    "cpu": StudyConfig(
        model=ModelConfig(layers=2, width=128, heads=2, context=128),
        batch=4,
        seeds=(0, 1, 2),
        steps=300,
        chunk=10,
    ),
    "h200": StudyConfig(
        model=ModelConfig(layers=4, width=256, heads=4, context=512),
        batch=8,
        seeds=(0, 1, 2),
        steps=3000,
        chunk=25,
        time_budget_s=250.0,
        device=Device.GPU,
    ),
}
"""Named sizes: ``smoke`` (CI: seconds; checks the machinery, not the findings), ``cpu`` (a
study on two CPU cores in tens of minutes), ``h200`` (4 layers, width 256, context 512, 3 seeds;
as many steps as a 250 s budget allows after the compilations, at most 3000)."""


def size(name: str) -> StudyConfig:
    """The :data:`SIZES` entry called ``name``."""
    if name not in SIZES:
        raise ValueError(f"size={name!r} is unknown; allowed: {sorted(SIZES)}")
    return SIZES[name]
