"""Data: the text a model learns from, and the batches of token ids it is trained on.

    --data ─▶ load_corpus ─▶ Corpus.text ─▶ tokenizer ─▶ token ids ─▶ TokenBatches ─▶ (x, y) batches

- :func:`load_corpus`: the built-in corpus (Python's own documentation, no download), a text file, a
  folder of ``.txt`` files, or a known public corpus by name (``"tinyshakespeare"``, fetched and cached).
- :func:`fetch` / :data:`KNOWN_CORPORA`: checksum-verified downloads into ``$QKV_CACHE`` or
  ``~/.cache/qkv/data``.
- :class:`TokenBatches`: random windows ``x`` and targets ``y`` (``x`` shifted by one token) from the first
  90% of the ids, fixed validation windows from the last 10%.

>>> from qkv.data import load_corpus, TokenBatches
>>> from qkv.tokenizers import train_tokenizer
>>> corpus = load_corpus(None)                       # the built-in corpus
>>> tok = train_tokenizer("char", corpus.text)
>>> data = TokenBatches.from_text(corpus.text, tok, context_length=64)
>>> x, y = data.train_batch(8)
>>> x.shape, bool((x[:, 1:] == y[:, :-1]).all())
(torch.Size([8, 64]), True)
"""

from qkv.data.builtin import BUILTIN_NAME, builtin_corpus
from qkv.data.corpus import Corpus, load_corpus
from qkv.data.download import KNOWN_CORPORA, Source, default_cache_dir, fetch
from qkv.data.lm import EVAL_SEED, TokenBatches, encode_corpus

__all__ = [
    "BUILTIN_NAME",
    "EVAL_SEED",
    "KNOWN_CORPORA",
    "Corpus",
    "Source",
    "TokenBatches",
    "builtin_corpus",
    "default_cache_dir",
    "encode_corpus",
    "fetch",
    "load_corpus",
]
