"""GPT, the decoder-only language model, in one folder.

- ``config.py``: :class:`GPTConfig`, its fields (vocab_size, n_layers) on top of :class:`~qkv.models.config.BaseConfig`;
- ``model.py``: :class:`GPT`, token ids -> W_E + positions -> N causal blocks -> final norm -> W_U -> logits;
- ``huggingface.py``: GPT-2 checkpoints (GPT2LMHeadModel) as a qkv GPT, one table of names;
- ``presets.py``: its named sizes (gpt-nano ... gpt-small-cpu, gpt2-small ... gpt2-xl);
- ``family.py``: its description (:class:`~qkv.models.description.Family`), the row of :mod:`qkv.models.family`.
"""

from qkv.models.gpt.config import GPTConfig
from qkv.models.gpt.model import GPT

__all__ = ["GPT", "GPTConfig"]
