"""RNNSearch (Bahdanau et al. 2015), the recurrent translator attention was invented for, in one folder.

- ``config.py``: :class:`RNNSearchConfig` (the paper's m, n, n', l);
- ``model.py``: :class:`RNNSearch`: a bidirectional GRU encoder, a GRU decoder with additive attention, a
  maxout output layer;
- ``presets.py``: rnnsearch-small and the paper's rnnsearch-50;
- ``family.py``: its description, the row of :mod:`qkv.models.family` (no Hugging Face import, no fast step).
"""

from qkv.models.rnnsearch.config import RNNSearchConfig
from qkv.models.rnnsearch.model import RNNSearch, RNNSearchCache

__all__ = ["RNNSearch", "RNNSearchCache", "RNNSearchConfig"]
