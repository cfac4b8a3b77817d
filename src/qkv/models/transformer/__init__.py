"""The paper's encoder-decoder Transformer (the translator), in one folder.

- ``config.py``: :class:`TransformerConfig` (two vocabularies, encoder and decoder depths, shared embeddings);
- ``model.py``: :class:`Transformer`: ``encode`` the source once, ``decode`` the target against it;
- ``huggingface.py``: Marian / OPUS-MT checkpoints (MarianMTModel) and their SentencePiece tokenizers;
- ``presets.py``: transformer-base and -big (the paper's Table 3), transformer-mini and -tiny;
- ``family.py``: its description, the row of :mod:`qkv.models.family`.
"""

from qkv.models.transformer.config import TransformerConfig
from qkv.models.transformer.model import Transformer

__all__ = ["Transformer", "TransformerConfig"]
