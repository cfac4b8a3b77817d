"""The Llama family (Llama, Qwen2, SmolLM, Mistral) in one folder, and the worked example of adding a family.

Llama is written as GPT plus its differences, as Hugging Face's modular files write a new family as an old
one plus what changed: each file below holds only what is new.

To add a family:

1. ``config.py``: its config class, derived from :class:`~qkv.models.config.ModelConfig`,
   :class:`~qkv.models.config.BaseConfig` or another family's config. Set ``kind``: the name saved in
   config.json (defining the class registers it, so ``ModelConfig.from_dict`` finds it). Add the fields the
   new layers read and validate them. Llama: :class:`LlamaConfig` is a ``GPTConfig`` with other defaults
   (RMSNorm, SwiGLU, RoPE, no biases), plus ``sliding_window``.
2. Layers qkv lacks go in :mod:`qkv.layers`, chosen by config fields, so that any family can use them.
   Llama brought RMSNorm, the gated feed-forward, grouped-query attention, Llama 3's RoPE scaling and the
   sliding window of :func:`qkv.layers.attention.attention_mask`. Layers never import models: a block reads
   its fields through ``BlockConfig``.
3. ``model.py``: the ``nn.Module`` the config builds. Llama: ``class Llama(GPT)``, which hands GPT its window.
4. ``huggingface.py``, where checkpoints exist: ``config_from_hf`` (config.json -> the config, refusing in
   one line what the model cannot run), ``convert`` (one table of rows from Hugging Face names to qkv names,
   applied by :mod:`qkv.models.hf_tables`) and ``load_tokenizers``.
5. ``gguf.py``, where llama.cpp runs it: ``ARCHITECTURES`` (the ``general.architecture`` names it reads and
   writes), ``IGNORED``, ``config_from_gguf``, ``rows`` (its name table: ``blk.{i}.attn_q`` -> W_q, ...),
   ``metadata`` and ``export`` (what a model becomes in a file), read by :mod:`qkv.pretrained.gguf` and
   written by :mod:`qkv.export.gguf`. Llama: ``llama`` and ``qwen2``, W_q and W_k rows permuted for llama.cpp.
6. ``presets.py``: its named sizes, ``PRESETS``.
7. ``family.py``: its description, ``FAMILY``, a :class:`~qkv.models.description.Family`: role,
   capabilities the views may use, streams, ``decode_step`` (the fast step of :mod:`qkv.decoding` that may
   run it, or None), presets, ``train_defaults``, the Hugging Face architectures and model types and the
   conversion module, its ``gguf`` module, and how a config says its context, positions and block norm
   (``context``, ``positional``, ``input_norm``). Llama: ``replace(GPT's FAMILY, ...)`` with what differs.
8. One line in :data:`qkv.models.family.ROOMS` (the one place that lists the families) and the re-exports
   in :mod:`qkv.models`.
9. Tests in ``tests/models/<family>/``: the config, the model against a reference we did not write
   (transformers), the conversion.

Nothing in the command line, the server, :mod:`qkv.inspect`, decoding or training changes: they ask the
description (``family_of(model)``), never the kind.
"""

from qkv.models.llama.config import LlamaConfig
from qkv.models.llama.model import Llama

__all__ = ["Llama", "LlamaConfig"]
