"""The tokenizer interface shared by every qkv tokenizer, and saving/loading them as JSON.

A Transformer never sees text. The GPT notes ("Tokens are little pieces of information") start by
breaking the input into little chunks called tokens; the model has a fixed vocabulary, and each token's
id picks one row of the embedding matrix W_E. A tokenizer is exactly that map, in both directions:

    text ─▶ tokens ("The", " quick", ...) ─▶ ids (464, 2068, ...) ─▶ rows of W_E
    ids  ─▶ text                                            (decode, after the model has predicted ids)

Four special tokens have fixed roles: ``<pad>`` fills batches to equal length, ``<bos>`` marks the start of a
sequence (the decoder's start token in the encoder-decoder study notes), ``<eos>`` marks its end, and ``<unk>``
stands for anything the vocabulary cannot express. qkv's own tokenizers give them ids 0, 1, 2, 3.

Every tokenizer saves itself as one JSON file, ``{"kind": ..., "format_version": 1, ...}``, and
:func:`load_tokenizer` reads any of them back.
"""

from __future__ import annotations

import operator
import os
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, cast

import numpy as np

from qkv.errors import QkvError
from qkv.io import atomic_write_json, read_json
from qkv.tokenizers.special import encode_around_specials, split_special

if TYPE_CHECKING:
    import torch

SPECIAL_TOKENS: tuple[str, ...] = ("<pad>", "<bos>", "<eos>", "<unk>")
"""qkv's special tokens, in id order: ``<pad>`` = 0, ``<bos>`` = 1, ``<eos>`` = 2, ``<unk>`` = 3."""

ROLES: tuple[str, ...] = ("pad", "bos", "eos", "unk")
"""The roles a special token can play; ``SPECIAL_TOKENS[i]`` plays ``ROLES[i]``."""

FORMAT_VERSION = 1

MAX_VOCAB_SIZE = 1 << 20
"""The largest vocabulary qkv trains (1,048,576 ids; GPT-2 has 50,257, the largest published ones about
256,000): far larger sizes made the BPE library abort the process instead of raising."""

_KINDS: dict[str, type[Tokenizer]] = {}  # "char" -> CharTokenizer, ...; filled by __init_subclass__


class Tokenizer(ABC):
    """Turns text into token ids and back. Subclasses set ``kind`` and implement the abstract methods.

    ``special_tokens`` maps each role ("pad", "bos", "eos", "unk") to its token string, or to None when
    the tokenizer has no token for that role (GPT-2, for instance, has no pad and no unk).
    """

    kind: ClassVar[str]
    special_tokens: dict[str, str | None]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "kind" in cls.__dict__:
            _KINDS[cls.kind] = cls

    # ----------------------------------------------------------------------------------- vocabulary

    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """Number of token ids; ids run from 0 to vocab_size - 1 (the rows of W_E)."""

    @abstractmethod
    def id_to_token(self, i: int) -> str:
        """The vocabulary entry with id ``i``, as stored (byte-level BPE entries look like "Ġquick")."""

    @abstractmethod
    def token_to_id(self, token: str) -> int | None:
        """The id of vocabulary entry ``token``, or None if it is not in the vocabulary."""

    def _role_id(self, role: str) -> int | None:
        token = self.special_tokens.get(role)
        return None if token is None else self.token_to_id(token)

    @property
    def pad_id(self) -> int | None:
        return self._role_id("pad")

    @property
    def bos_id(self) -> int | None:
        return self._role_id("bos")

    @property
    def eos_id(self) -> int | None:
        return self._role_id("eos")

    @property
    def unk_id(self) -> int | None:
        return self._role_id("unk")

    # ------------------------------------------------------------------------------------- encoding

    @abstractmethod
    def _encode_ids(self, text: str) -> list[int]:
        """The ids of ``text`` alone, without <bos>/<eos>."""

    @abstractmethod
    def _decode_ids(self, ids: list[int]) -> str:
        """The text of ``ids``, all of them valid ids; special tokens already removed if asked."""

    def special_token_ids(self) -> dict[str, int]:
        """The strings that ``encode(text, special=True)`` turns into one id each: here the tokens of the roles
        (``<pad>``, ``<bos>``, ``<eos>``, ``<unk>`` for qkv's own tokenizers)."""
        found = {token: self.token_to_id(token) for token in self.special_tokens.values() if token is not None}
        return {token: i for token, i in found.items() if i is not None}

    def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False, special: bool = False) -> list[int]:
        """Token ids of ``text``; ``add_bos``/``add_eos`` put the <bos>/<eos> id before/after them.

        By default a special token's string typed in ``text`` ("<eos>", "<|im_start|>") is text, spelled from
        ordinary pieces. ``special=True`` makes each string of :meth:`special_token_ids` its single id: what a
        rendered chat template needs, whose markers must reach the model as the tokens it was trained on.
        """
        if not isinstance(text, str):
            raise QkvError(f"encode takes a str, got {type(text).__name__}: pass the text itself")
        ids = self._encode_special(text) if special else self._encode_ids(text)
        if add_bos:
            ids.insert(0, self._required_id("bos"))
        if add_eos:
            ids.append(self._required_id("eos"))
        return ids

    def encode_with_offsets(self, text: str, *, special: bool = False) -> tuple[list[int], list[tuple[int, int]]]:
        """``encode(text, special=special)`` and, for each id, the characters ``text[start:end]`` it stands for
        (how a span of the text, such as an assistant's turn in a rendered chat, is found among the tokens)."""
        if not isinstance(text, str):
            raise QkvError(f"encode takes a str, got {type(text).__name__}: pass the text itself")
        return encode_around_specials(text, self.special_token_ids() if special else {}, self._encode_offsets)

    def _encode_special(self, text: str) -> list[int]:
        """The ids of ``text`` with each string of :meth:`special_token_ids` as its one id."""
        ids: list[int] = []
        for _, piece, special_id in split_special(text, self.special_token_ids()):
            ids += [special_id] if special_id is not None else self._encode_ids(piece)
        return ids

    def _encode_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """The ids of ``text`` alone and each one's (start, end) characters; a tokenizer that can tell overrides it."""
        raise QkvError(
            f"the {self.kind} tokenizer cannot tell which characters each token covers: use a char, word, bpe or "
            "Hugging Face tokenizer"
        )

    def encode_array(self, text: str) -> np.ndarray:
        """``encode(text)`` as a 1-D int64 numpy array, for corpora; a subclass may compute it faster."""
        return np.asarray(self._encode_ids(text), dtype=np.int64)

    def encode_batch(
        self, texts: list[str], *, add_bos: bool = False, add_eos: bool = False, special: bool = False
    ) -> list[list[int]]:
        """``encode`` of each text; takes the same keyword arguments."""
        return [self.encode(text, add_bos=add_bos, add_eos=add_eos, special=special) for text in texts]

    def decode(self, ids: Sequence[int] | torch.Tensor, *, skip_special: bool = True) -> str:
        """Text of ``ids`` (a list or a 1-D tensor). ``skip_special`` drops <pad>, <bos> and <eos>;
        <unk> is always shown, as its token string."""
        id_list = self._check_ids(ids)
        if skip_special:
            skipped = {self._role_id(role) for role in ("pad", "bos", "eos")} - {None}
            id_list = [i for i in id_list if i not in skipped]
        return self._decode_ids(id_list)

    def decode_batch(self, batch: Sequence[Sequence[int]] | torch.Tensor, **kw: bool) -> list[str]:
        """``decode`` of each row of a list of id lists or of a 2-D tensor."""
        return [self.decode(ids, **kw) for ids in batch]

    def tokens(self, text: str, *, special: bool = False) -> list[str]:
        """The tokens of ``encode(text, special=special)`` as readable strings, one per id (for display)."""
        return [self.id_to_token(i) for i in self.encode(text, special=special)]

    def _required_id(self, role: str) -> int:
        i = self._role_id(role)
        if i is None:
            raise QkvError(
                f"this {self.kind} tokenizer has no {role} token: give it one in special_tokens "
                f"or call encode without add_{role}"
            )
        return i

    def _check_ids(self, ids: Sequence[int] | torch.Tensor) -> list[int]:
        """``ids`` as a list of Python ints, each a valid id, or a QkvError saying what is wrong."""
        if hasattr(ids, "tolist"):  # a torch tensor or a numpy array
            if getattr(ids, "ndim", 1) != 1:
                shape = tuple(cast("torch.Tensor", ids).shape)  # or a numpy array's
                raise QkvError(
                    f"decode takes one sequence of ids, got an array of shape {shape}: "
                    "pass a 1-D tensor, or use decode_batch for a 2-D one"
                )
            ids = ids.tolist()
        n = self.vocab_size
        out = []
        for item in ids:
            try:
                if isinstance(item, bool):
                    raise TypeError
                i = operator.index(item)  # ints, numpy integers, 0-d integer tensors
            except TypeError:
                raise QkvError(
                    f"token ids must be integers, got {item!r}: pass a list of ints or a 1-D tensor"
                ) from None
            if not 0 <= i < n:
                raise QkvError(
                    f"token id {i} is outside this tokenizer's vocabulary (0..{n - 1}): "
                    "decode ids produced by the same tokenizer the model was trained with"
                )
            out.append(i)
        return out

    # ---------------------------------------------------------------------------------- save / load

    @abstractmethod
    def to_dict(self) -> dict[str, Any]:
        """Everything needed to rebuild this tokenizer, as JSON-ready data with "kind" and "format_version"."""

    @classmethod
    @abstractmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Tokenizer:
        """Rebuild a tokenizer of this class from ``to_dict()`` output."""

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write ``to_dict()`` as JSON to ``path`` atomically (a temp file in the same folder, then rename),
        so a crash never leaves a half-written tokenizer behind."""
        atomic_write_json(Path(path), self.to_dict())

    @classmethod
    def load(cls, path_or_dict: str | os.PathLike[str] | Mapping[str, Any]) -> Tokenizer:
        """Load a saved tokenizer; on a subclass, also check that the file holds that kind."""
        tok = load_tokenizer(path_or_dict)
        if not isinstance(tok, cls):
            raise QkvError(
                f"the saved tokenizer is a {tok.kind!r} tokenizer, not {cls.__name__}: "
                "load it with load_tokenizer() or Tokenizer.load()"
            )
        return tok

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]  # mutable-looking value type: equal by content

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab_size={self.vocab_size})"


class ListVocabTokenizer(Tokenizer):
    """A tokenizer whose vocabulary is a plain list: the four SPECIAL_TOKENS, then the learned tokens.

    The id of a token is its position in the list, so ``vocab[i]`` is the token behind row i of W_E.
    CharTokenizer and WordTokenizer differ only in how they split text and join tokens back.
    """

    def __init__(self, vocab: Sequence[str]) -> None:
        vocab = list(vocab)
        if tuple(vocab[: len(SPECIAL_TOKENS)]) != SPECIAL_TOKENS:
            raise QkvError(
                f"a {self.kind} vocabulary must start with the special tokens {list(SPECIAL_TOKENS)}, "
                f"got {vocab[:4]}: build it with {type(self).__name__}.train()"
            )
        self.vocab: list[str] = vocab
        self.stoi: dict[str, int] = {token: i for i, token in enumerate(vocab)}
        if len(self.stoi) != len(vocab):
            raise QkvError(f"the {self.kind} vocabulary lists a token twice: remove the duplicates or retrain")
        self.special_tokens = dict(zip(ROLES, SPECIAL_TOKENS, strict=True))

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def id_to_token(self, i: int) -> str:
        if not 0 <= i < len(self.vocab):
            raise QkvError(f"token id {i} is outside the vocabulary (0..{len(self.vocab) - 1}): check the id")
        return self.vocab[i]

    def token_to_id(self, token: str) -> int | None:
        return self.stoi.get(token)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "format_version": FORMAT_VERSION, "vocab": list(self.vocab)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Tokenizer:
        check_header(d, cls.kind)
        vocab = d.get("vocab")
        if not isinstance(vocab, list) or not all(isinstance(t, str) for t in vocab):
            raise QkvError(f"the saved {cls.kind} tokenizer has no list of strings under 'vocab': retrain it")
        return cls(vocab)


# --------------------------------------------------------------------------------------- helpers


def check_header(d: Mapping[str, Any], kind: str) -> None:
    """Raise QkvError unless ``d`` is a saved tokenizer of ``kind`` in a format this qkv reads."""
    if not isinstance(d, Mapping):
        raise QkvError(f"a saved tokenizer must be a JSON object, got {type(d).__name__}: re-save it")
    if d.get("kind") != kind:
        raise QkvError(f"expected a {kind!r} tokenizer, got kind {d.get('kind')!r}: use load_tokenizer()")
    version = d.get("format_version")
    if version != FORMAT_VERSION:
        raise QkvError(
            f"tokenizer format_version {version!r} is not supported (this qkv reads {FORMAT_VERSION}): "
            "re-save the tokenizer with this version of qkv or retrain it"
        )


def iter_texts(texts: str | Iterable[str]) -> Iterator[str]:
    """Yield the texts of a training corpus given as one string or as an iterable of strings."""
    if isinstance(texts, str):
        yield texts
        return
    for text in texts:
        if not isinstance(text, str):
            raise QkvError(f"training texts must be strings, got {type(text).__name__}: read files first")
        yield text


def empty_corpus_error() -> QkvError:
    return QkvError("the training text is empty: give a non-empty text to train the tokenizer on")


def load_tokenizer(path_or_dict: str | os.PathLike[str] | Mapping[str, Any]) -> Tokenizer:
    """Load any saved qkv tokenizer from a JSON file (or a folder holding tokenizer.json), or a dict.

    The "kind" field says which class rebuilds it. A missing file, broken JSON or unknown kind raises
    QkvError with the fix.
    """
    where = "the tokenizer data"
    if isinstance(path_or_dict, Mapping):
        d: Any = path_or_dict
    else:
        path = Path(path_or_dict)
        if path.is_dir():
            path = path / "tokenizer.json"
        where = f"tokenizer file {path}"
        d = read_json(path, what="tokenizer file")
    if not isinstance(d, Mapping):
        raise QkvError(f"{where} is not a JSON object: re-save it with Tokenizer.save() or retrain")
    kind = d.get("kind")
    if kind not in _KINDS:
        raise QkvError(
            f"{where} has unknown tokenizer kind {kind!r}: expected one of {sorted(_KINDS)}; "
            "re-save it with Tokenizer.save()"
        )
    try:
        return _KINDS[kind].from_dict(d)
    except QkvError:
        raise
    except Exception as e:  # KeyError, TypeError, ...; the HF library raises bare Exceptions
        raise QkvError(f"{where} is damaged ({type(e).__name__}: {e}): re-save it or retrain") from None


def train_tokenizer(kind: str, texts: str | Iterable[str], vocab_size: int | None = None, **kw: Any) -> Tokenizer:
    """Train a qkv tokenizer of ``kind`` ("char", "word" or "bpe") on ``texts``.

    ``vocab_size`` counts every id, special tokens included; None means the kind's default (every
    character or word for char/word, 1000 for bpe). Other keyword arguments go to ``<Kind>.train``.
    """
    trainable = {k: c for k, c in _KINDS.items() if hasattr(c, "train")}
    if kind not in trainable:
        hint = "; wrap an existing tokenizer.json with HFTokenizer.from_file()" if kind == "hf" else ""
        raise QkvError(f"cannot train a tokenizer of kind {kind!r}: choose one of {sorted(trainable)}{hint}")
    if vocab_size is not None:
        check_vocab_size(vocab_size)
        kw["vocab_size"] = vocab_size
    return trainable[kind].train(texts, **kw)


def check_vocab_size(vocab_size: int) -> None:
    """QkvError unless ``vocab_size`` is a whole number up to :data:`MAX_VOCAB_SIZE`."""
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or not 1 <= vocab_size <= MAX_VOCAB_SIZE:
        raise QkvError(
            f"vocab_size must be a whole number between 1 and {MAX_VOCAB_SIZE:,}, got {vocab_size!r}: GPT-2 uses "
            "50,257; try e.g. 8000"
        )
