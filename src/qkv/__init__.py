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

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType
from typing import TYPE_CHECKING

from qkv.errors import QkvError
from qkv.version import __version__

if TYPE_CHECKING:
    from qkv.decoding.replies import chat, chat_stream, complete, complete_stream
    from qkv.decoding.sampling_params import SamplingParams
    from qkv.inspect.views import views
    from qkv.layers import MultiHeadAttention, capture, softmax
    from qkv.loading import load
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

LAYERS = ("MultiHeadAttention", "capture", "softmax")
MODELS = ("GPT", "PRESETS", "Encoder", "EncoderConfig", "GPTConfig", "RNNSearch", "RNNSearchConfig", "Transformer",
          "TransformerConfig", "make_config", "next_token_distribution")  # fmt: skip
REPLIES = ("chat", "chat_stream", "complete", "complete_stream")


def _home(name: str) -> ModuleType | None:
    """The module holding ``name``, imported now. The package's names are imported on first use (PEP 562), so that
    ``import qkv`` (and ``qkv --help``, ``qkv --version``) imports no torch; ``from qkv import GPT`` still works."""
    home: ModuleType  # each branch imports its module under this name
    if name in LAYERS:
        import qkv.layers as home
    elif name in MODELS:
        import qkv.models as home
    elif name in REPLIES:
        import qkv.decoding.replies as home
    elif name == "load":
        import qkv.loading as home
    elif name == "views":
        import qkv.inspect.views as home
    elif name == "SamplingParams":
        import qkv.decoding.sampling_params as home
    else:
        return None
    return home


def __getattr__(name: str):
    """A name of the package from its module, or a subpackage (``qkv.models``), imported on first use."""
    home = _home(name)
    if home is not None:
        value = globals()[name] = getattr(home, name)
        return value
    if not name.startswith("_") and importlib.util.find_spec(f"qkv.{name}") is not None:
        return importlib.import_module(f"qkv.{name}")
    raise AttributeError(f"module 'qkv' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *LAYERS, *MODELS, *REPLIES, "load", "views", "SamplingParams"})


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
