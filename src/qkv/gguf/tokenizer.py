"""The tokenizer a GGUF file describes (``tokenizer.ggml.*``), built as a ``tokenizers.Tokenizer`` in qkv's
:class:`~qkv.tokenizers.HFTokenizer`.

A GGUF carries no tokenizer.json: it lists the vocabulary (``tokens``, one string per id, ``token_type`` per
id: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte), the special ids (``bos_token_id``,
...), and one of llama.cpp's tokenizer models (``tokenizer.ggml.model``):

- ``gpt2``: byte-level BPE (GPT-2, SmolLM, Llama 3, Qwen2): ``merges`` ("Ġ t" = merge "Ġ" and "t"), and
  ``tokenizer.ggml.pre`` naming the regular expressions that cut text into words before merging
  (:data:`PRE_TOKENIZERS`: llama.cpp's, from llama-vocab.cpp);
- ``llama``: SentencePiece-style BPE (Llama 2, Mistral): ``scores`` rank the merges (the pair whose joined
  piece scores highest merges first; :func:`sentencepiece_merges`), a space is written "▁" (prepended to
  the text when ``add_space_prefix``), and characters outside the vocabulary fall back to byte tokens
  ``<0x41>`` when the vocabulary has them.

Control tokens become special added tokens (qkv writes them only through add_bos/add_eos; typed in text
they are spelled out, as llama.cpp does unless told to parse specials); user-defined tokens become plain
added tokens, matched whole in text as llama.cpp does. ``add_bos_token`` / ``add_eos_token`` become the
tokenizer's post-processor: ``tokenizer.hf.encode(text)`` adds them as llama.cpp and transformers do, while
qkv's own ``encode`` adds them only when asked (``encode(text, add_bos=True)``).
"""

from __future__ import annotations

from typing import Any

import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors

from qkv.errors import QkvError
from qkv.tokenizers import HFTokenizer

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
SPACE = "\u2581"  # SentencePiece's "▁"

GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)"
    r"|\s+"
)
PRE_TOKENIZERS: dict[str, tuple[str, ...]] = {
    "gpt-2": (GPT2_SPLIT,),
    "smollm": (r"\p{N}", GPT2_SPLIT),  # each digit alone, then GPT-2's words
    "starcoder": (r"\p{N}", GPT2_SPLIT),
    "refact": (r"\p{N}", GPT2_SPLIT),
    "llama-bpe": (LLAMA3_SPLIT,),
    "llama3": (LLAMA3_SPLIT,),
    "llama-v3": (LLAMA3_SPLIT,),
    "qwen2": (QWEN2_SPLIT,),
    "deepseek-r1-qwen": (QWEN2_SPLIT,),
}
"""tokenizer.ggml.pre -> the regular expressions llama.cpp splits text with, one after the other."""

WHOLE_WORDS = {"llama-bpe", "llama3", "llama-v3"}
"""Pre-tokenizers after which llama.cpp takes a word found whole in the vocabulary before merging (Llama 3's
``ignore_merges``)."""


def byte_level_pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    """llama.cpp's pre-tokenizer ``pre``: its regular expressions, each isolating its matches, then bytes
    mapped to GPT-2's printable alphabet (a space becomes "Ġ")."""
    if pre not in PRE_TOKENIZERS:
        raise QkvError(
            f"the file's tokenizer splits text with llama.cpp's pre-tokenizer {pre!r} (tokenizer.ggml.pre), "
            f"which qkv does not know: qkv reads {', '.join(PRE_TOKENIZERS)}"
        )
    splits = [pre_tokenizers.Split(Regex(pattern), behavior="isolated") for pattern in PRE_TOKENIZERS[pre]]
    return pre_tokenizers.Sequence([*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def _byte_level(meta: dict[str, Any], vocab: dict[str, int]) -> tokenizers.Tokenizer:
    merges = meta.get("tokenizer.ggml.merges")
    if not isinstance(merges, list):
        raise QkvError("the file's byte-level BPE tokenizer has no merges (tokenizer.ggml.merges): convert it again")
    pairs = [tuple(merge.split(" ", 1)) for merge in merges]
    if any(len(pair) != 2 for pair in pairs):
        raise QkvError("tokenizer.ggml.merges holds an entry without a space between its two pieces: file damaged")
    pre = meta.get("tokenizer.ggml.pre", "gpt-2")
    hf = tokenizers.Tokenizer(models.BPE(vocab, pairs, ignore_merges=pre in WHOLE_WORDS))
    hf.pre_tokenizer = byte_level_pre_tokenizer(pre)
    hf.decoder = decoders.ByteLevel()
    return hf


def sentencepiece_merges(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
    """Merges that reproduce SentencePiece's BPE: every split of a token into two tokens is a merge, ranked by
    the joined token's score (highest first), then longer left pieces first, then by id."""
    ids = {token: i for i, token in enumerate(tokens)}
    found = []
    for i, token in enumerate(tokens):
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in ids and right in ids:
                found.append((-scores[i], -len(left), -len(right), i, ids[left], ids[right], left, right))
    return [(left, right) for *_, left, right in sorted(found)]


def _sentencepiece(meta: dict[str, Any], vocab: dict[str, int], tokens: list[str], types: list[int]) -> Any:
    scores = meta.get("tokenizer.ggml.scores")
    if not isinstance(scores, list) or len(scores) != len(tokens):
        raise QkvError("the file's SentencePiece tokenizer has no score per token (tokenizer.ggml.scores)")
    unk = _token(meta, "unknown_token_id", tokens)
    model = models.BPE(vocab, sentencepiece_merges(tokens, scores), unk_token=unk, fuse_unk=True,
                       byte_fallback=BYTE in types)  # fmt: skip
    hf = tokenizers.Tokenizer(model)
    prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
    scheme = "first" if prefix else "never"
    hf.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme=scheme, split=False)
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    hf.decoder = decoders.Sequence(steps + ([decoders.Strip(" ", 1, 0)] if prefix else []))
    return hf


def _token(meta: dict[str, Any], key: str, tokens: list[str]) -> str | None:
    """The token of tokenizer.ggml.``key`` (an id), None when absent; an id outside the vocabulary is refused."""
    index = meta.get(f"tokenizer.ggml.{key}")
    if index is None:
        return None
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(tokens):
        raise QkvError(
            f"tokenizer.ggml.{key}={index!r} is not an id of the file's {len(tokens)} tokens: the file is damaged"
        )
    return tokens[index]


def _vocabulary(meta: dict[str, Any]) -> tuple[list[str], list[int], dict[str, int]]:
    tokens = meta.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens:
        raise QkvError("the file has no vocabulary (tokenizer.ggml.tokens): qkv needs the tokenizer in the GGUF")
    types = meta.get("tokenizer.ggml.token_type") or [NORMAL] * len(tokens)
    if len(types) != len(tokens):
        raise QkvError("tokenizer.ggml.token_type does not give one type per token: the file is damaged")
    vocab = {token: i for i, token in enumerate(tokens)}
    if len(vocab) != len(tokens):
        twice = next(t for i, t in enumerate(tokens) if vocab[t] != i)
        raise QkvError(f"the file's vocabulary lists the token {twice!r} twice: qkv needs each token once")
    return tokens, types, vocab


def _add_specials(hf: tokenizers.Tokenizer, tokens: list[str], types: list[int]) -> None:
    pairs = list(zip(tokens, types, strict=True))
    hf.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, k in pairs if k == CONTROL])
    hf.add_tokens([AddedToken(t, special=False, normalized=False) for t, k in pairs if k == USER_DEFINED])


def _post_processor(meta: dict[str, Any], roles: dict[str, str | None], hf: tokenizers.Tokenizer) -> None:
    """add_bos_token / add_eos_token as a TemplateProcessing post-processor (none when neither is set)."""
    before = roles["bos"] if meta.get("tokenizer.ggml.add_bos_token") and roles["bos"] else None
    after = roles["eos"] if meta.get("tokenizer.ggml.add_eos_token") and roles["eos"] else None
    if before is None and after is None:
        return
    head, tail = ([before] if before else []), ([after] if after else [])
    single = " ".join([*head, "$A", *tail])
    pair = " ".join([*head, "$A", *tail, *head, "$B:1", *tail])
    specials = [(t, hf.token_to_id(t)) for t in dict.fromkeys(head + tail)]
    hf.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=specials)


BYTE_LEVEL_BPE, SENTENCEPIECE_BPE = "gpt2", "llama"
"""llama.cpp's names (tokenizer.ggml.model) for the two tokenizer models qkv reads: byte-level BPE (named after
GPT-2, which introduced it) and SentencePiece-style BPE (named after Llama 1 and 2)."""


def tokenizer_from_gguf(meta: dict[str, Any]) -> HFTokenizer:
    """The tokenizer of a GGUF file's metadata, with bos/eos/unk/pad from its special ids."""
    tokens, types, vocab = _vocabulary(meta)
    kind = meta.get("tokenizer.ggml.model")
    if kind == BYTE_LEVEL_BPE:
        hf = _byte_level(meta, vocab)
    elif kind == SENTENCEPIECE_BPE:
        hf = _sentencepiece(meta, vocab, tokens, types)
    else:
        raise QkvError(
            f"the file's tokenizer is llama.cpp's {kind!r} model (tokenizer.ggml.model), and qkv reads 'gpt2' "
            "(byte-level BPE) and 'llama' (SentencePiece BPE)"
        )
    _add_specials(hf, tokens, types)
    keys = {"bos": "bos_token_id", "eos": "eos_token_id", "unk": "unknown_token_id", "pad": "padding_token_id"}
    roles = {role: _token(meta, key, tokens) for role, key in keys.items()}
    _post_processor(meta, roles, hf)
    return HFTokenizer(hf, roles)
