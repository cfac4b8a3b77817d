"""Data: the text a model learns from, and the batches of token ids it is trained on.

    --data ─▶ open_source ─▶ pieces ─▶ prepare (tokenizer, every core) ─▶ token shards on disk
          ─▶ TokenShards (read-only memory maps) ─▶ TokenBatches ─▶ (x, y) batches

- :func:`open_source`: every input kind (text, JSON lines, Parquet, compressed, folders, globs,
  ``hf:DATASET``, the built-in corpus) as one stream of text, never held whole.
- :func:`qkv.data.prepare.prepare`: tokenize a corpus once into shards with a manifest (``qkv prepare``);
  :func:`prepared_for_training` does it through a cache for ``qkv train --data FILE``.
- :class:`TokenShards`: the shards as one read-only sequence of ids, gathered window by window.
- :func:`load_corpus`: a small corpus whole in memory, from anything :func:`open_source` takes.
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
from qkv.data.cache import prepared_for_training
from qkv.data.corpus import Corpus, load_corpus
from qkv.data.download import KNOWN_CORPORA, Source, default_cache_dir, fetch
from qkv.data.lm import EVAL_SEED, TokenBatches, encode_corpus
from qkv.data.prepared_folder import PreparedData
from qkv.data.shards import TokenShards
from qkv.data.sources import TextSource, open_source

__all__ = [
    "BUILTIN_NAME",
    "EVAL_SEED",
    "KNOWN_CORPORA",
    "Corpus",
    "PreparedData",
    "Source",
    "TextSource",
    "TokenBatches",
    "TokenShards",
    "builtin_corpus",
    "default_cache_dir",
    "encode_corpus",
    "fetch",
    "load_corpus",
    "open_source",
    "prepared_for_training",
]
