"""Training study: a small decoder-only transformer trained with emulated low-precision attention.

An application of :mod:`fp4sim.attention` (it imports the attention and formats layers, never the
other way round). It asks whether the training claims of the low-precision attention papers hold
on a model small enough to train in minutes: that MXFP4 P/V in the backward diverges while the
FP8 P/V route trains, that a forward and a backward that disagree (normalization, dO
representation, P bits) go wrong, and that scales shared across the causal boundary leak the
future into past positions.

Submodules (import them explicitly; importing this package loads nothing heavy):

* :mod:`fp4sim.train.config` — frozen configurations (model, optimizer, study) and named sizes.
* :mod:`fp4sim.train.recipes` — the study's attention choices (:class:`StudyRecipe`): plain jnp
  float32/bfloat16 attention and :func:`fp4sim.attention.autodiff.emulated_attention` with a
  :class:`~fp4sim.attention.backward.TrainingRecipe`.
* :mod:`fp4sim.train.data` — the corpus (byte-level Python documentation text) and batches.
* :mod:`fp4sim.train.model` — the transformer (parameters, forward, per-position losses).
* :mod:`fp4sim.train.loop` — optimizer, the jitted multi-step training chunk (vmapped over seeds),
  evaluation and the causal-leak check.
* :mod:`fp4sim.train.study` — the study runner: compile, time, budget, train, check, record.
* :mod:`fp4sim.train.report` — figure and table from the JSON record.
* :mod:`fp4sim.train.cli` — ``python -m fp4sim train``.
"""

__all__: list[str] = []
