"""Attention emulation: exact reference, recipes, probability converters, tiled forward/backward."""

__all__: list[str] = []

# --- forward emulator (recipes, reference, exp2, converters, normalization, forward, metrics) ---
from fp4sim.attention import recipe as _recipe  # noqa: E402
from fp4sim.attention.recipe import *  # noqa: E402,F401,F403
from fp4sim.attention.reference import (  # noqa: E402
    ReferenceResult,
    attention_mask,
    attention_reference,
)
from fp4sim.attention.exp2 import (  # noqa: E402
    POLY_EX2,
    exp2_fa4,
    exp2_model,
    exp2_rn,
    exp2_rn_e4m3,
    fa4_emulated_mask,
    log2_f32,
)
from fp4sim.attention.converters import (  # noqa: E402
    PTile,
    convert_tile,
    direct_p_coordinate,
    direct_p_payload,
    mitchell_exp2,
)
from fp4sim.formats.codec import bf16_round  # noqa: E402  (its home: formats.codec)
from fp4sim.attention.normalization import (  # noqa: E402
    Normalized,
    NormalizerOrder,
    block_denominator,
    normalize,
    represented_output,
)
from fp4sim.attention.forward import (  # noqa: E402
    ForwardIntermediates,
    ForwardResult,
    Operand,
    attention_forward,
    converter_unit,
    hadamard,
    log2_scores,
    quantize_qk,
    quantize_v,
    score_scale,
    scores,
)
from fp4sim.attention.metrics import (  # noqa: E402
    ErrorSummary,
    code_match_rate,
    error_summary,
    uniform_grid,
)

__all__ += list(_recipe.__all__) + [
    "ReferenceResult",
    "attention_mask",
    "attention_reference",
    "POLY_EX2",
    "exp2_fa4",
    "exp2_model",
    "exp2_rn",
    "exp2_rn_e4m3",
    "fa4_emulated_mask",
    "log2_f32",
    "PTile",
    "bf16_round",
    "convert_tile",
    "direct_p_coordinate",
    "direct_p_payload",
    "mitchell_exp2",
    "Normalized",
    "NormalizerOrder",
    "block_denominator",
    "normalize",
    "represented_output",
    "ForwardIntermediates",
    "ForwardResult",
    "Operand",
    "attention_forward",
    "converter_unit",
    "hadamard",
    "log2_scores",
    "quantize_qk",
    "quantize_v",
    "score_scale",
    "scores",
    "ErrorSummary",
    "code_match_rate",
    "error_summary",
    "uniform_grid",
]

# --- training path (backward, autodiff, operand scalings, causal safety, leak probe, consistency)
# (TrainingRecipe, its enums, TRAINING_PRESETS, LEAK_TABLE, training_preset: from recipe above)
from fp4sim.attention.autodiff import (  # noqa: E402
    emulated_attention,
    rebuild_p,
    training_backward,
    training_forward,
)
from fp4sim.attention.backward import (  # noqa: E402
    Gradients,
    attention_grad_reference,
    emulated_backward,
    softmax_grad,
)
from fp4sim.attention.operands import (  # noqa: E402
    OperandScaling,
    fake_quantize,
    quantize_operand,
)
from fp4sim.attention.causal import (  # noqa: E402
    LeakClass,
    fake_quantize_segmented,
    leak_class,
)
from fp4sim.attention.consistency import (  # noqa: E402
    ConsistencyReport,
    Mismatch,
    check_consistency,
    with_mismatch,
)
from fp4sim.attention.leak import LeakReport, leak_probe  # noqa: E402

__all__ += [
    "emulated_attention",
    "rebuild_p",
    "training_backward",
    "training_forward",
    "Gradients",
    "attention_grad_reference",
    "emulated_backward",
    "softmax_grad",
    "LeakClass",
    "OperandScaling",
    "fake_quantize",
    "quantize_operand",
    "fake_quantize_segmented",
    "leak_class",
    "ConsistencyReport",
    "Mismatch",
    "check_consistency",
    "with_mismatch",
    "LeakReport",
    "leak_probe",
]
