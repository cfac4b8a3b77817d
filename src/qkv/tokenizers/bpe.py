"""Subword tokenizers backed by the Hugging Face ``tokenizers`` library: qkv's byte-level BPE, and a
wrapper for any ``tokenizer.json`` (GPT-2's byte-level BPE, BERT's WordPiece, ...).

Between characters and words sit subwords, the "little pieces" (the GPT notes) real GPTs use: frequent words
are one token (" quick"), rare ones are spelled from a few pieces (" jump" + "s"). Byte-pair encoding
(BPE) learns them by starting from the 256 possible bytes and repeatedly merging the most frequent
adjacent pair into a new token, until the vocabulary has ``vocab_size`` entries. Each id indexes a row of
the embedding matrix W_E, like every other tokenizer.

Because the starting alphabet is all 256 bytes, nothing is ever unknown: any text, emoji and newlines
included, encodes and decodes back exactly. Vocabulary entries are stored "byte-level mangled" (a space
is shown as "Ġ", so " quick" is stored as "Ġquick"); :meth:`HFTokenizer.tokens` gives the readable form.

Text is treated as text by default: a literal "<eos>" typed in the input is spelled out from ordinary
pieces, never turned into the special id; special tokens enter through ``add_bos``/``add_eos``, or through
``encode(text, special=True)``, which matches the library's special added tokens (a rendered chat template's
"<|im_start|>") as Hugging Face does.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

from qkv.errors import QkvError
from qkv.io import check_readable
from qkv.tokenizers.base import (
    FORMAT_VERSION,
    ROLES,
    SPECIAL_TOKENS,
    Tokenizer,
    check_header,
    check_vocab_size,
    empty_corpus_error,
    iter_texts,
)

BYTE_ALPHABET_SIZE = 256
MIN_BPE_VOCAB_SIZE = BYTE_ALPHABET_SIZE + len(SPECIAL_TOKENS)  # 260: every byte, plus the specials


def _without_surrogates(text: str) -> str:
    """Replace lone surrogate code points (which the HF library cannot take) with U+FFFD."""
    try:
        text.encode("utf-8")  # fast check: only lone surrogates fail
        return text
    except UnicodeEncodeError:
        return "".join("\ufffd" if "\ud800" <= c <= "\udfff" else c for c in text)


class HFTokenizer(Tokenizer):
    """Wraps a ``tokenizers.Tokenizer`` with qkv's interface.

    ``special_tokens`` maps the roles "pad", "bos", "eos", "unk" to token strings of this tokenizer, in
    its own names, e.g. ``{"bos": "<|endoftext|>", "eos": "<|endoftext|>"}`` for GPT-2 or
    ``{"pad": "[PAD]", "bos": "[CLS]", "eos": "[SEP]", "unk": "[UNK]"}`` for BERT. Missing roles are None.

    ``split_special_tokens=True`` (the default) makes special-token strings in the input text encode
    as ordinary text; set it to False to have the library match them, as Hugging Face does by default.
    The wrapper takes ownership of ``hf_tokenizer`` and sets that option on it.
    """

    kind = "hf"

    def __init__(
        self,
        hf_tokenizer: tokenizers.Tokenizer,
        special_tokens: Mapping[str, str | None] | None = None,
        *,
        split_special_tokens: bool = True,
    ) -> None:
        special_tokens = dict(special_tokens or {})
        unknown_roles = set(special_tokens) - set(ROLES)
        if unknown_roles:
            raise QkvError(f"unknown special-token roles {sorted(unknown_roles)}: use only {list(ROLES)} as keys")
        for role, token in special_tokens.items():
            if token is not None and hf_tokenizer.token_to_id(token) is None:
                raise QkvError(
                    f"special token {token!r} (role {role!r}) is not in the tokenizer's vocabulary: "
                    "use a token the tokenizer has, or None"
                )
        self.hf = hf_tokenizer
        self.hf.encode_special_tokens = split_special_tokens
        self.split_special_tokens = split_special_tokens
        self.special_tokens = {role: special_tokens.get(role) for role in ROLES}

    @classmethod
    def from_file(
        cls,
        tokenizer_json_path: str | os.PathLike[str],
        special_tokens: Mapping[str, str | None] | None = None,
        *,
        split_special_tokens: bool = True,
    ) -> HFTokenizer:
        """Wrap a Hugging Face ``tokenizer.json`` file (the library's own format, not qkv's)."""
        path = Path(tokenizer_json_path)
        check_readable(path, "tokenizer file")
        if not path.is_file():
            raise QkvError(f"tokenizer file {path} does not exist: check the path to tokenizer.json")
        try:
            hf = tokenizers.Tokenizer.from_file(str(path))
        except Exception as e:  # the HF library raises bare Exceptions
            raise QkvError(
                f"{path} is not a Hugging Face tokenizer.json ({e}): pass the tokenizer.json of the model"
            ) from None
        return cls(hf, special_tokens, split_special_tokens=split_special_tokens)

    # ----------------------------------------------------------------------------------- vocabulary

    @property
    def vocab_size(self) -> int:
        return self.hf.get_vocab_size(with_added_tokens=True)

    def id_to_token(self, i: int) -> str:
        token = self.hf.id_to_token(i) if i >= 0 else None
        if token is None:
            raise QkvError(f"token id {i} is outside the vocabulary (0..{self.vocab_size - 1}): check the id")
        return token

    def token_to_id(self, token: str) -> int | None:
        return self.hf.token_to_id(token)

    # ------------------------------------------------------------------------------------- encoding

    def special_token_ids(self) -> dict[str, int]:
        """The library's added tokens marked special (``<|endoftext|>``, ``<|im_start|>``, ...) and the tokens of
        the roles, by string: the tokens transformers registers as special and matches in a chat."""
        added = {t.content: i for i, t in self.hf.get_added_tokens_decoder().items() if t.special}
        return {**super().special_token_ids(), **added}

    def _matching(self) -> tokenizers.Tokenizer:
        """The library tokenizer matching :meth:`special_token_ids` in the text: ``self.hf`` when it already does,
        else a copy with the roles' tokens registered as special (made once, and again if tokens are added), so
        that ``self.hf`` never changes under a concurrent ``encode``."""
        added = self.hf.get_added_tokens_decoder()
        missing = sorted(set(super().special_token_ids()) - {t.content for t in added.values()})
        if not self.split_special_tokens and not missing:
            return self.hf
        key = (self.hf.get_vocab_size(with_added_tokens=True), len(added))
        cached = getattr(self, "_matcher", None)
        if cached is None or cached[0] != key:
            copy = tokenizers.Tokenizer.from_str(self.hf.to_str())
            copy.encode_special_tokens = False
            copy.add_special_tokens([tokenizers.AddedToken(t, special=True, normalized=False) for t in missing])
            self._matcher = cached = (key, copy)
        return cached[1]

    def _encoding(self, text: str, special: bool) -> tokenizers.Encoding:
        hf = self._matching() if special else self.hf
        try:
            return hf.encode(text, add_special_tokens=False)
        except TypeError:  # lone surrogates, e.g. from text decoded with errors="surrogateescape"
            return hf.encode(_without_surrogates(text), add_special_tokens=False)  # same length: offsets hold

    def _encode_ids(self, text: str) -> list[int]:
        return self._encoding(text, False).ids

    def _encode_special(self, text: str) -> list[int]:
        return self._encoding(text, True).ids

    def encode_with_offsets(self, text: str, *, special: bool = False) -> tuple[list[int], list[tuple[int, int]]]:
        if not isinstance(text, str):
            raise QkvError(f"encode takes a str, got {type(text).__name__}: pass the text itself")
        encoding = self._encoding(text, special)
        return encoding.ids, [tuple(o) for o in encoding.offsets]  # type: ignore[misc]

    def encode_batch(
        self, texts: list[str], *, add_bos: bool = False, add_eos: bool = False, special: bool = False
    ) -> list[list[int]]:
        """``encode`` of each text, using the library's parallel batch encoder."""
        texts = list(texts)
        if not all(isinstance(t, str) for t in texts):
            raise QkvError("encode_batch takes a list of str: pass the texts themselves")
        try:
            hf = self._matching() if special else self.hf
            batch = [e.ids for e in hf.encode_batch(texts, add_special_tokens=False)]
        except TypeError:
            batch = [self._encoding(t, special).ids for t in texts]
        before = [self._required_id("bos")] if add_bos else []
        after = [self._required_id("eos")] if add_eos else []
        return [before + ids + after for ids in batch]

    def _decode_ids(self, ids: list[int]) -> str:
        return self.hf.decode(ids, skip_special_tokens=False)

    def tokens(self, text: str, *, special: bool = False) -> list[str]:
        """Each token of ``encode(text, special=special)`` decoded on its own, e.g. ["The", " quick"]. A character
        that spans several byte-level tokens (an emoji, say) shows as U+FFFD in each of them."""
        ids = self._encoding(text, special).ids
        return self.hf.decode_batch([[i] for i in ids], skip_special_tokens=False)

    # ---------------------------------------------------------------------------------- save / load

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "format_version": FORMAT_VERSION,
            "special_tokens": dict(self.special_tokens),
            "split_special_tokens": self.split_special_tokens,
            "tokenizer": json.loads(self.hf.to_str()),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> HFTokenizer:
        check_header(d, cls.kind)
        hf = _hf_from_json(d.get("tokenizer"), cls.kind)
        return cls(hf, d.get("special_tokens"), split_special_tokens=d.get("split_special_tokens", True))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model={type(self.hf.model).__name__}, vocab_size={self.vocab_size})"


def _hf_from_json(data: Any, kind: str) -> tokenizers.Tokenizer:
    if not isinstance(data, dict):
        raise QkvError(f"the saved {kind} tokenizer has no 'tokenizer' object: re-save it or retrain")
    try:
        return tokenizers.Tokenizer.from_str(json.dumps(data))
    except Exception as e:  # the HF library raises bare Exceptions
        raise QkvError(f"the saved {kind} tokenizer's 'tokenizer' object is damaged ({e}): retrain it") from None


class BPETokenizer(HFTokenizer):
    """Byte-level BPE trained by qkv: specials ``<pad>``, ``<bos>``, ``<eos>``, ``<unk>`` are ids 0..3."""

    kind = "bpe"

    def __init__(self, hf_tokenizer: tokenizers.Tokenizer) -> None:
        ids = [hf_tokenizer.token_to_id(t) for t in SPECIAL_TOKENS]
        if ids != list(range(len(SPECIAL_TOKENS))):
            raise QkvError(
                f"a bpe tokenizer needs {list(SPECIAL_TOKENS)} as ids 0..3, got ids {ids}: "
                "train it with BPETokenizer.train(), or wrap it with HFTokenizer instead"
            )
        super().__init__(hf_tokenizer, dict(zip(ROLES, SPECIAL_TOKENS, strict=True)))

    @classmethod
    def train(cls, texts: str | Iterable[str], vocab_size: int = 1000, min_freq: int = 2) -> BPETokenizer:
        """Learn byte-level BPE merges from ``texts`` (one string or several) until the vocabulary has
        ``vocab_size`` entries (fewer if the text runs out of pairs seen ``min_freq`` times)."""
        check_vocab_size(vocab_size)
        if vocab_size < MIN_BPE_VOCAB_SIZE:
            raise QkvError(
                f"vocab_size {vocab_size} is too small for byte-level BPE: use at least {MIN_BPE_VOCAB_SIZE} "
                f"({BYTE_ALPHABET_SIZE} bytes + {len(SPECIAL_TOKENS)} special tokens)"
            )
        hf = tokenizers.Tokenizer(models.BPE(unk_token="<unk>"))
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # GPT-2's split, keep spaces
        hf.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            min_frequency=min_freq,
            special_tokens=list(SPECIAL_TOKENS),  # first, so they get ids 0..3
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes: nothing is unknown
            show_progress=False,
        )
        n_chars = 0

        def counted(texts: Iterable[str]) -> Iterator[str]:
            nonlocal n_chars
            for text in iter_texts(texts):
                text = _without_surrogates(text)
                n_chars += len(text)
                # Feed lines (not one huge string) so the library can work on them in parallel.
                yield from text.splitlines(keepends=True)

        hf.train_from_iterator(counted(texts), trainer=trainer)
        if n_chars == 0:
            raise empty_corpus_error()
        return cls(hf)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> BPETokenizer:
        check_header(d, cls.kind)
        return cls(_hf_from_json(d.get("tokenizer"), cls.kind))
