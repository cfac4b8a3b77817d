"""Writing a qkv tokenizer as GGUF tokenizer metadata (``tokenizer.ggml.*``), or refusing in one line.

The inverse of :mod:`qkv.gguf.tokenizer`, for the tokenizers that llama.cpp's models encode exactly:

- byte-level BPE (qkv's ``bpe`` tokenizer, GPT-2's, SmolLM's, Llama 3's, Qwen2's, or one read from a GGUF)
  -> model ``gpt2`` with its merges and the ``pre`` whose regular expressions its pre-tokenizer uses
  (recognised by comparing it with :func:`~qkv.gguf.tokenizer.byte_level_pre_tokenizer` of each name, and
  with Hugging Face's spellings of the same split);
- SentencePiece-style BPE (a "▁" for the space, byte fallback) -> model ``llama``, with scores that rank the
  merges as the tokenizer does (the piece made by the first merge scores highest);
- qkv's ``char`` tokenizer -> model ``llama`` with one token per character and no merges: SentencePiece's
  tokenizer then cuts text into characters and looks each up, as qkv's does (the space is stored as "▁").
  A character outside the vocabulary is <unk> in qkv; llama.cpp has no <unk> for it (see docs/deploy.md).

qkv's ``word`` tokenizer has no counterpart (no GGUF model splits text into qkv's words and joins them back
with its spacing rules) and is refused, as is any other tokenizers.json model or normalizer.
"""

from __future__ import annotations

import json
import re
from typing import Any

from tokenizers import pre_tokenizers

from qkv.errors import QkvError
from qkv.gguf.tokenizer import (
    BYTE,
    CONTROL,
    NORMAL,
    PRE_TOKENIZERS,
    SPACE,
    USER_DEFINED,
    WHOLE_WORDS,
    byte_level_pre_tokenizer,
)
from qkv.tokenizers import CharTokenizer, HFTokenizer, Tokenizer

_BYTE_TOKEN = re.compile(r"<0x[0-9A-F]{2}>")
# Hugging Face's tokenizer.json spellings of llama.cpp's pre-tokenizers
_HF_SPELLINGS: dict[str, list[pre_tokenizers.PreTokenizer]] = {
    "gpt-2": [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)],
    "smollm": [
        pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
        )
    ],
}


def _plain(data: Any) -> Any:
    """A pre-tokenizer's JSON without trim_offsets (which changes offsets, not tokens)."""
    if isinstance(data, dict):
        return {k: _plain(v) for k, v in data.items() if k != "trim_offsets"}
    if isinstance(data, list):
        return [_plain(v) for v in data]
    return data


def pre_tokenizer_name(pre: dict[str, Any] | None) -> str:
    """llama.cpp's name (tokenizer.ggml.pre) for a byte-level pre-tokenizer's JSON; QkvError when none fits."""
    wanted = _plain(pre)
    for name in PRE_TOKENIZERS:
        forms = [byte_level_pre_tokenizer(name), *_HF_SPELLINGS.get(name, [])]
        if any(_plain(json.loads(form.__getstate__())) == wanted for form in forms):
            return name
    raise QkvError(
        f"the tokenizer's pre-tokenizer ({json.dumps(pre)[:120]}...) is none of llama.cpp's "
        f"({', '.join(PRE_TOKENIZERS)}): GGUF cannot express this tokenizer"
    )


def _roles(tokenizer: Tokenizer) -> dict[str, Any]:
    keys = {"bos": "bos_token_id", "eos": "eos_token_id", "unk": "unknown_token_id", "pad": "padding_token_id"}
    ids = {role: getattr(tokenizer, f"{role}_id") for role in keys}
    return {f"tokenizer.ggml.{key}": ids[role] for role, key in keys.items() if ids[role] is not None}


def char_metadata(tokenizer: CharTokenizer) -> dict[str, Any]:
    """qkv's character tokenizer as a SentencePiece vocabulary of single characters (no merges)."""
    if SPACE in tokenizer.vocab:
        raise QkvError(
            f"the character vocabulary holds {SPACE!r}, which GGUF's SentencePiece model reads as the space: "
            "GGUF cannot express this tokenizer"
        )
    n_special = 4
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": [SPACE if t == " " else t for t in tokenizer.vocab],
        "tokenizer.ggml.scores": [0.0] * tokenizer.vocab_size,
        "tokenizer.ggml.token_type": [CONTROL] * n_special + [NORMAL] * (tokenizer.vocab_size - n_special),
        "tokenizer.ggml.add_space_prefix": False,
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.ggml.add_eos_token": False,
        **_roles(tokenizer),
    }


def _vocabulary(data: dict[str, Any], size: int) -> tuple[list[str], list[int]]:
    """Every token by id, and its GGUF type (special added tokens: control; other added tokens: user-defined)."""
    tokens: list[str | None] = [None] * size
    types = [NORMAL] * size
    for token, index in data["model"]["vocab"].items():
        if index < size:
            tokens[index] = token
    for added in data.get("added_tokens", []):
        tokens[added["id"]] = added["content"]
        types[added["id"]] = CONTROL if added.get("special") else USER_DEFINED
    if None in tokens:
        raise QkvError(f"the tokenizer has no token with id {tokens.index(None)}: GGUF needs ids 0..{size - 1}")
    return [token for token in tokens if token is not None], types  # every id has its token (checked above)


def _merges(model: dict[str, Any]) -> list[str]:
    return [" ".join(m) if isinstance(m, list) else m for m in model.get("merges", [])]


def _adds(data: dict[str, Any], tokenizer: Tokenizer) -> dict[str, bool]:
    """add_bos_token / add_eos_token from a TemplateProcessing post-processor (see qkv.gguf.tokenizer)."""
    post = data.get("post_processor") or {}
    single = post.get("single", []) if post.get("type") == "TemplateProcessing" else []
    ends = [item.get("SpecialToken", {}).get("id") for item in single[:1] + single[-1:]]
    bos, eos = tokenizer.special_tokens.get("bos"), tokenizer.special_tokens.get("eos")
    return {
        "tokenizer.ggml.add_bos_token": bool(ends) and bos is not None and ends[0] == bos,
        "tokenizer.ggml.add_eos_token": bool(ends) and eos is not None and ends[-1] == eos,
    }


def _spm_scores(tokens: list[str], merges: list[str]) -> list[float]:
    """A score per token that ranks the merges: the piece made by merge r scores -r; others score below all."""
    rank: dict[str, int] = {}
    for r, merge in enumerate(merges):
        rank.setdefault(merge.replace(" ", ""), r)
    return [-float(rank.get(t, len(merges) + i)) for i, t in enumerate(tokens)]


def _sentencepiece(data: dict[str, Any], tokens: list[str], types: list[int]) -> dict[str, Any]:
    pre, normalizer = data.get("pre_tokenizer") or {}, data.get("normalizer") or {}
    if pre.get("type") == "Metaspace" and not normalizer and not pre.get("split", False):
        prefix = pre.get("prepend_scheme", "always") != "never"
    elif not pre and [n.get("type") for n in normalizer.get("normalizers", [])] == ["Prepend", "Replace"]:
        prefix = True  # Llama 2's tokenizer.json: prepend "▁", replace " " by "▁"
    else:
        raise QkvError("the tokenizer's SentencePiece-style splitting is not llama.cpp's: GGUF cannot express it")
    if data["model"].get("byte_fallback"):
        types = [BYTE if _BYTE_TOKEN.fullmatch(t) and k == NORMAL else k for t, k in zip(tokens, types, strict=True)]
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": _spm_scores(tokens, _merges(data["model"])),
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.add_space_prefix": prefix,
    }


def _byte_level(data: dict[str, Any], tokens: list[str], types: list[int]) -> dict[str, Any]:
    if data.get("normalizer"):
        raise QkvError("the tokenizer normalizes text first, which llama.cpp's byte-level BPE does not")
    pre = pre_tokenizer_name(data.get("pre_tokenizer"))
    model = data["model"]
    if model.get("byte_fallback") or model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        raise QkvError("the tokenizer's BPE has options llama.cpp's byte-level BPE lacks: GGUF cannot express it")
    if bool(model.get("ignore_merges")) != (pre in WHOLE_WORDS):
        raise QkvError(f"the tokenizer's ignore_merges does not match llama.cpp's pre-tokenizer {pre!r}")
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": _merges(model),
    }


def tokenizer_metadata(tokenizer: Tokenizer) -> dict[str, Any]:
    """The GGUF metadata that describes ``tokenizer``; QkvError naming what GGUF cannot express."""
    if isinstance(tokenizer, CharTokenizer):
        return char_metadata(tokenizer)
    if not isinstance(tokenizer, HFTokenizer):
        raise QkvError(
            f"a {tokenizer.kind!r} tokenizer has no GGUF counterpart (llama.cpp's tokenizers cannot split text "
            "into its tokens and join them back as it does): train the model with --tokenizer bpe or char"
        )
    data = json.loads(tokenizer.hf.to_str())
    if data["model"].get("type") != "BPE":
        raise QkvError(f"the tokenizer is a {data['model'].get('type')} model, and GGUF holds BPE ones here")
    tokens, types = _vocabulary(data, tokenizer.vocab_size)
    byte_level = (data.get("decoder") or {}).get("type") == "ByteLevel"
    fields = _byte_level(data, tokens, types) if byte_level else _sentencepiece(data, tokens, types)
    return {**fields, **_adds(data, tokenizer), **_roles(tokenizer)}
