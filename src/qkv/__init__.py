"""qkv: the Transformer, completely and for real.

    from qkv import GPT, GPTConfig
    model = GPT(GPTConfig(vocab_size=100, d_model=64, n_heads=4, n_layers=2, context_length=32))
    logits = model(token_ids)                       # (B, T, vocab_size)

    import qkv
    bundle = qkv.load("runs/shakespeare")           # or a quantized folder, a Hugging Face folder, a .gguf, "gpt2"
    m = qkv.views("runs/shakespeare")               # the same, with every view as a method (docs/python.md)
    qkv.complete(bundle, "To be", temperature=0).text                       # text in, text out
    qkv.chat(chat_bundle, [{"role": "user", "content": "Hi!"}]).text        # a chat model's answer

See README.md for a tour and docs/ for one page per task.
"""

from typing import TYPE_CHECKING

from qkv.errors import QkvError
from qkv.layers import MultiHeadAttention, capture, softmax
from qkv.models import (
    GPT,
    PRESETS,
    Encoder,
    EncoderConfig,
    GPTConfig,
    RNNSearch,
    RNNSearchConfig,
    Transformer,
    TransformerConfig,
    make_config,
    next_token_distribution,
)
from qkv.version import __version__

if TYPE_CHECKING:
    from qkv.decoding.replies import chat, chat_stream, complete, complete_stream
    from qkv.decoding.sampling_params import SamplingParams
    from qkv.inspect.views import views
    from qkv.loading import load


def __getattr__(name: str):
    """``qkv.load`` (:func:`qkv.loading.load`), ``qkv.views`` (:func:`qkv.inspect.views.views`), ``qkv.chat`` and
    ``qkv.complete`` (:mod:`qkv.decoding.replies`) and ``qkv.SamplingParams``, imported on first use: ``import
    qkv`` stays light."""
    if name == "load":
        from qkv.loading import load

        return load
    if name == "views":
        from qkv.inspect.views import views

        return views
    if name == "SamplingParams":
        from qkv.decoding.sampling_params import SamplingParams

        return SamplingParams
    if name in ("chat", "chat_stream", "complete", "complete_stream"):
        from qkv.decoding import replies

        return getattr(replies, name)
    raise AttributeError(f"module 'qkv' has no attribute {name!r}")


__all__ = [
    "GPT",
    "PRESETS",
    "Encoder",
    "EncoderConfig",
    "GPTConfig",
    "MultiHeadAttention",
    "QkvError",
    "RNNSearch",
    "RNNSearchConfig",
    "SamplingParams",
    "Transformer",
    "TransformerConfig",
    "__version__",
    "capture",
    "chat",
    "chat_stream",
    "complete",
    "complete_stream",
    "load",
    "make_config",
    "next_token_distribution",
    "softmax",
    "views",
]
