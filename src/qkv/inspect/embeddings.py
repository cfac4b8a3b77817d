"""Token embeddings as geometry: nearest neighbours, analogies, a 2-D map, and the positional table.

The GPT notes: every token is a row of the embedding matrix W_E; "words with similar meanings tend to land near
each other", the dot product "is a measure of how well they align", and differences carry meaning:
E(king) - E(man) + E(woman) lands near E(queen).

- :func:`nearest_neighbours`: the rows with the highest cosine similarity cos(a, b) = a . b / (|a| |b|),
  the dot product of the two directions (lengths removed).
- :func:`analogy`: a - b + c, then its nearest neighbours, **excluding a, b and c themselves** (as word2vec
  and gensim's ``most_similar`` do: the nearest row to king - man + woman is usually king itself). Like
  word2vec, each of the three vectors is first scaled to length 1 ("3CosAdd"), so one long vector does not
  outweigh the others; ``normalize=False`` uses the raw rows.
- :func:`pca_2d`: the rows centred and projected on their first two principal components (an SVD), so a
  picture can show which tokens sit together.
- :func:`positional_table`: the table of positional encodings the model adds to the embeddings (the notes on the
mathematics of attention:
  sines and cosines of geometrically spaced frequencies), or a learned one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import cast

import numpy as np
from torch import Tensor, nn

from qkv.errors import QkvError
from qkv.inspect.tokens import token_label
from qkv.layers.positional import sinusoidal_table
from qkv.model_dir import ModelBundle
from qkv.models.family import family_of
from qkv.tokenizers import Tokenizer


def _unit(matrix: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(matrix, axis=-1, keepdims=True)
    return matrix / np.where(norms == 0, 1.0, norms)


def cosine_similarities(table: np.ndarray, vector: np.ndarray) -> np.ndarray:
    """cos(row, vector) for every row of ``table`` (V, d): (V,). A zero row or vector gives 0."""
    return _unit(np.asarray(table, dtype=np.float64)) @ _unit(np.asarray(vector, dtype=np.float64))


def nearest_neighbours(
    table: np.ndarray, vector: np.ndarray, *, k: int = 5, exclude: Iterable[int] = ()
) -> list[tuple[int, float]]:
    """The ``k`` rows most similar to ``vector`` by cosine, as (row index, similarity), most similar first."""
    similarities = cosine_similarities(table, vector)
    banned = set(exclude)
    order = np.argsort(-similarities, kind="stable")
    return [(int(i), float(similarities[i])) for i in order if int(i) not in banned][:k]


def analogy(
    table: np.ndarray, a: int, b: int, c: int, *, k: int = 1, normalize: bool = True, exclude: Iterable[int] = ()
) -> list[tuple[int, float]]:
    """Rows nearest to E[a] - E[b] + E[c] (king - man + woman), never a, b or c themselves.

    With ``normalize`` each of the three rows is scaled to unit length first (word2vec's rule).
    """
    rows = np.asarray(table, dtype=np.float64)
    va, vb, vc = (_unit(rows[i]) if normalize else rows[i] for i in (a, b, c))
    return nearest_neighbours(rows, va - vb + vc, k=k, exclude={a, b, c, *exclude})


def pca_2d(rows: np.ndarray) -> tuple[np.ndarray, tuple[float, float]]:
    """(N, d) rows -> (N, 2) coordinates on the first two principal components, and the fraction of the
    variance each keeps. Centre, then SVD: X - mean = U S V^T; coordinates = U S (first two columns)."""
    x = np.asarray(rows, dtype=np.float64)
    if x.shape[0] < 2:
        raise QkvError("a 2-D map needs at least two tokens: give more tokens")
    centred = x - x.mean(axis=0)
    u, s, _ = np.linalg.svd(centred, full_matrices=False)
    points = u[:, :2] * s[:2]  # (N, 2)
    if points.shape[1] < 2:
        points = np.pad(points, ((0, 0), (0, 2 - points.shape[1])))
    variance = s**2
    total = float(variance.sum()) or 1.0
    explained = [float(v / total) for v in variance[:2]] + [0.0] * (2 - min(2, len(variance)))
    return points, (explained[0], explained[1])


# --------------------------------------------------------------------------------- on a model's W_E


def embedding_matrix(bundle: ModelBundle, *, target: bool = False) -> tuple[np.ndarray, Tokenizer]:
    """W_E (vocab, d_model) as float64 and the tokenizer whose ids index its rows.

    A translator has a source and a target embedding; ``target`` picks the target one. The family names the
    module (for Word2Vec, W_E is its input vectors: the word vectors).
    """
    family = family_of(bundle.model)
    family.require("embeddings", "the embedding view")
    if target and family.target_embedding is None:
        raise QkvError("--target is for translators, which have a source and a target embedding")
    module = family.target_embedding if target else family.embedding
    assert module is not None
    tokenizer = (bundle.target_tokenizer or bundle.tokenizer) if target else bundle.tokenizer
    weight = cast(Tensor, bundle.model.get_submodule(module).weight).detach().double().cpu().numpy()  # (vocab, d)
    return weight, tokenizer


def special_ids(tokenizer: Tokenizer) -> set[int]:
    """The ids of <pad>, <bos>, <eos>, <unk> (those the tokenizer has)."""
    return {i for i in (tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id, tokenizer.unk_id) if i is not None}


def token_id(tokenizer: Tokenizer, token: str) -> int:
    """The id of ``token``: a vocabulary entry, or text that encodes to exactly one token (tried as given and
    with a leading space, for GPT-2-style vocabularies where " king" is one token). QkvError otherwise."""
    direct = tokenizer.token_to_id(token)
    if direct is not None:
        return direct
    for text in (token, " " + token):
        ids = tokenizer.encode(text)
        if len(ids) == 1 and ids[0] != tokenizer.unk_id:
            return ids[0]
    ids = tokenizer.encode(token)
    if ids and all(i == tokenizer.unk_id for i in ids):
        raise QkvError(
            f"{token!r} is not in this model's vocabulary of {tokenizer.vocab_size:,} tokens: check the spelling "
            "or choose another word (a word model keeps only the words its training text had often enough)"
        )
    pieces = [token_label(tokenizer, i) for i in ids]
    if len(ids) == len(token):  # a token per character: a character model has no token for a word at all
        raise QkvError(
            f"{token!r} is not one token of this vocabulary, a character model's (it splits into {pieces}): give "
            "one character, or use a word-level model for words (qkv train --task word2vec, or --tokenizer word)"
        )
    raise QkvError(
        f"{token!r} is not one token of this vocabulary (it splits into {pieces}): give a single token, "
        "e.g. one character for a character model"
    )


def neighbours_of(bundle: ModelBundle, token: str, *, k: int = 5, target: bool = False) -> list[tuple[str, float]]:
    """The ``k`` tokens whose embeddings are nearest to ``token``'s by cosine (not the token itself, nor
    special tokens), with their similarities."""
    table, tokenizer = embedding_matrix(bundle, target=target)
    i = token_id(tokenizer, token)
    found = nearest_neighbours(table, table[i], k=k, exclude={i, *special_ids(tokenizer)})
    return [(token_label(tokenizer, j), s) for j, s in found]


ALIKE = 0.99
"""Neighbours all this close (cosine) say the vectors have not separated yet, not that the words mean the same."""


def alike_note(found: list[list[tuple[str, float]]]) -> str | None:
    """A note when every neighbour listed (of every token asked about) is at cosine :data:`ALIKE` or more: early in
    training the vectors share one direction (Word2Vec after one epoch on a small text), so the lists say nothing
    yet. None otherwise."""
    sims = [s for rows in found for _, s in rows]
    if len(sims) < 2 or min(sims) < ALIKE:
        return None
    return (
        f"every neighbour listed is at cosine {ALIKE} or more: the vectors still point almost the same way (too "
        "little training to separate them), so these lists mean little yet: train longer (e.g. more --epochs)"
    )


def analogy_of(
    bundle: ModelBundle, a: str, b: str, c: str, *, k: int = 5, target: bool = False
) -> list[tuple[str, float]]:
    """a - b + c on the model's W_E (the sources' E(king) - E(man) + E(woman)): the nearest tokens, excluding
    a, b, c and special tokens, with their cosine similarities."""
    table, tokenizer = embedding_matrix(bundle, target=target)
    ids = [token_id(tokenizer, t) for t in (a, b, c)]
    found = analogy(table, *ids, k=k, exclude=special_ids(tokenizer))
    return [(token_label(tokenizer, j), s) for j, s in found]


def tokens_to_plot(tokenizer: Tokenizer, *, tokens: Sequence[str] | None = None, top: int | None = None) -> list[int]:
    """Which rows to draw: the given ``tokens``, or the first ``top`` non-special ids (default: every
    character of a character model, otherwise 100). qkv's word vocabularies are ordered by frequency and BPE
    ids follow merge order, so for them the first ids are the most frequent tokens."""
    if tokens:
        return list(dict.fromkeys(token_id(tokenizer, t) for t in tokens))
    if top is None:
        top = tokenizer.vocab_size if tokenizer.kind == "char" else 100
    specials = special_ids(tokenizer)
    return [i for i in range(tokenizer.vocab_size) if i not in specials][:top]


def positional_table(bundle: ModelBundle | None, *, length: int = 64, d_model: int = 64) -> tuple[np.ndarray, str]:
    """The (length, d_model) positional encodings a model adds to its embeddings, and a title.

    Sinusoidal models give their own fixed table, learned ones their trained rows; a model with rotary or
    no added positions (and no model at all) gives the paper's sinusoidal table for its width.
    """
    if bundle is None:
        title = f"sinusoidal positional encoding (d_model = {d_model})"
        return sinusoidal_table(length, d_model).double().numpy(), title
    family, model = family_of(bundle.model), bundle.model
    if not family.has("positions"):  # Word2Vec, RNNSearch (its GRUs read the tokens in order)
        assert family.embedding is not None
        width = cast(Tensor, model.get_submodule(family.embedding).weight).shape[1]
        title = f"the paper's sinusoidal table for d_model = {width}: {family.title} adds no positions"
        return sinusoidal_table(length, width).double().numpy(), title
    module = model.get_submodule(next(iter(family.streams.values()))[0])  # the first stack's input embedding
    encoding = cast(nn.Module, module.positional_encoding)
    limit = getattr(encoding, "max_len", None) or length
    length = min(length, limit)
    positional = family.positions(bundle.config)
    width = cast(nn.Embedding, module.token_embedding).embedding_dim  # d_model
    if positional == "sinusoidal":
        table = cast(Tensor, encoding.table)[:length]
        title = f"the model's sinusoidal positional encoding (d_model = {width})"
    elif positional == "learned":
        table = cast(Tensor, encoding.weight)[:length]
        title = f"the model's learned positional embeddings (d_model = {width})"
    else:
        table = sinusoidal_table(length, width)
        title = (
            f"the paper's sinusoidal table for d_model = {width} "
            f"(this model adds none: its positions are '{positional}')"
        )
    return table.detach().double().cpu().numpy(), title
