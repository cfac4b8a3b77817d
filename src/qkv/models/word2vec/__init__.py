"""Word2Vec (Mikolov et al. 2013), the word vectors before attention, in one folder.

- ``config.py``: :class:`Word2VecConfig` (vocabulary and width of the vectors);
- ``model.py``: :class:`Word2Vec` (skip-gram and CBOW with negative sampling) and its :class:`Word2VecBatch`;
- ``presets.py``: word2vec;
- ``family.py``: its description, the row of :mod:`qkv.models.family`.
"""

from qkv.models.word2vec.config import Word2VecConfig
from qkv.models.word2vec.model import Word2Vec, Word2VecBatch

__all__ = ["Word2Vec", "Word2VecBatch", "Word2VecConfig"]
