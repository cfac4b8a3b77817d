"""The encoder-only model (the BERT family), in one folder.

- ``config.py``: :class:`EncoderConfig` (segment embeddings, the LayerNorm over the embeddings, padding id);
- ``model.py``: :class:`Encoder`, token ids -> W_E + positions -> N bidirectional blocks -> one vector per
  token, and :func:`mean_pool` for a sentence vector;
- ``huggingface.py``: BERT and MiniLM checkpoints (BertModel, BertForMaskedLM) as a qkv Encoder;
- ``presets.py``: bert-base, minilm-l6, encoder-mini;
- ``family.py``: its description, the row of :mod:`qkv.models.family`.

Sentence-transformers' pooling of the token vectors is :mod:`qkv.pretrained.sentences`.
"""

from qkv.models.encoder.config import EncoderConfig
from qkv.models.encoder.model import Encoder, mean_pool

__all__ = ["Encoder", "EncoderConfig", "mean_pool"]
