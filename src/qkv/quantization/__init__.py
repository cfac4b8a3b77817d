"""Weight-only int8 and int4: the layers, GPTQ rounding, quantizing a whole model, and the quantized folder.

    from qkv.quantization import quantize_model
    quantize_model(bundle.model, "int8")        # every linear layer and W_U become Int8Linear, in place
    quantize_model(bundle.model, "int4")        # the linear layers become Int4Linear (groups of 32), W_U int8

- :mod:`~qkv.quantization.int8_linear`, :mod:`~qkv.quantization.int8_embedding`: the layers (int8 matrix Q,
  one scale per output channel or per group of weights, ``group_size``; a token embedding reading its rows from
  the tied W_U).
- :mod:`~qkv.quantization.int4_linear`: the int4 layer (groups of 32 to 256 weights with a scale and a minimum)
  on torch's packed int4 CPU kernel; :mod:`~qkv.quantization.gguf_blocks`: GGUF's Q4_0, Q4_1 and Q8_0 blocks
  read into it and into the int8 layer.
- :mod:`~qkv.quantization.gptq`: calibrated rounding (GPTQ) from the inputs a layer sees.
- :mod:`~qkv.quantization.model`: :func:`quantize_model` and the questions about a model (is it int8? how
  many bytes do its weights take?).
- :mod:`~qkv.quantization.format`: ``quantization.json``, which says which layers of a saved model are int8 or int4
  so that :mod:`qkv.model_dir` can rebuild them before loading the weights.
- :mod:`~qkv.quantization.save`: ``qkv quantize`` in Python (:func:`~qkv.quantization.save.save_quantized`,
  calibration on text). It runs the models' forwards through training and pretrained code, so it sits above
  them and is imported from its own module, not from here.
"""

from qkv.quantization.format import FORMAT, FORMAT_VERSION, apply_quantization, quantization_info
from qkv.quantization.gptq import gptq_round, gptq_round_groups, input_hessians
from qkv.quantization.int4_linear import Int4Linear
from qkv.quantization.int8_embedding import Int8TokenEmbedding
from qkv.quantization.int8_linear import Int8Linear
from qkv.quantization.model import (
    DESCRIPTIONS,
    SCHEMES,
    check_scheme,
    is_quantized,
    quantization_scheme,
    quantize_model,
    scheme_for_bits,
    set_activations,
    weight_bytes,
)

__all__ = [
    "DESCRIPTIONS",
    "FORMAT",
    "FORMAT_VERSION",
    "SCHEMES",
    "Int4Linear",
    "Int8Linear",
    "Int8TokenEmbedding",
    "apply_quantization",
    "check_scheme",
    "gptq_round",
    "gptq_round_groups",
    "input_hessians",
    "is_quantized",
    "quantization_info",
    "quantization_scheme",
    "quantize_model",
    "scheme_for_bits",
    "set_activations",
    "weight_bytes",
]
