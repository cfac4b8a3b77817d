"""The battery's command-line and Python cases (bench/bad_inputs.py): what each gives qkv, what a careful tool does
with it, and the words its message must hold. {name} in a command is a fixture's path (gpt, llama, translator,
word2vec, hf_llama, hf_gpt2, llama_gguf, int8, int4, w8a8, text_txt, pairs_tsv), {bad} the case's spoilt copy and
{tmp} the case's folder."""

from __future__ import annotations

import math
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bad_inputs_spoil import (
    config,
    copy,
    gguf,
    json_file,
    remove,
    tensor,
)

NAN = ("NaN", "infinite", "non-finite", "not finite")
MEMORY = ("does not fit", "memory", "GiB", "at most", "too large", "too big", "must be")


@dataclass
class Case:
    surface: str  # cli | python
    name: str
    what: Any  # argv (cli) or a function of the paths (python)
    words: tuple[str, ...]
    expect: str = "refuse"  # refuse | note | ok
    setup: Callable | None = None
    stdin: str | bytes | None = None
    timeout: float = 90.0
    user: bool = False  # run as nobody (permission cases: root reads anything)
    serves: bool = False  # a server that keeps running is an acceptance, not a hang
    refused_leaves: tuple[str, ...] = ()  # paths (under the case folder) a refusal must not leave
    forbid: tuple[str, ...] = ()  # words a note about a good input must not hold


def cli(name: str, argv: str, words: tuple[str, ...] | str, expect: str = "refuse", **kw) -> Case:
    return Case("cli", name, shlex.split(argv), (words,) if isinstance(words, str) else words, expect, **kw)


def py(name: str, fn: Callable[[dict], Any], words: tuple[str, ...] | str, expect: str = "refuse", **kw) -> Case:
    return Case("python", name, fn, (words,) if isinstance(words, str) else words, expect, **kw)


def _load(p: dict, key: str = "bad", **kw):
    import qkv

    return qkv.load(p[key], **kw)


def _views(key: str, **kw):
    import qkv

    return lambda p: qkv.views(p[key], **kw)


def _view(key: str, method: str, *args, **kw):
    import qkv

    return lambda p: getattr(qkv.views(p[key]), method)(*args, **kw)


GEN = "generate --model {bad} --prompt hi --max-new-tokens 3 --temperature 0"
GEN_RUN = "generate {bad} --prompt to --max-new-tokens 3 --temperature 0"

# ---------------------------------------------------------------------------------- 1. weights that are not finite
WEIGHTS = [
    cli("nan: HF Llama folder, generate", GEN, NAN, setup=tensor("hf_llama")),
    cli("nan: HF Llama folder, next", "next --model {bad} hi", NAN, setup=tensor("hf_llama")),
    cli("nan: HF Llama folder, lens", "lens --model {bad} hi --out {tmp}/l.png", NAN, setup=tensor("hf_llama")),
    cli(
        "nan: HF Llama folder, quantize",
        "quantize --model {bad} --out {tmp}/q",
        NAN,
        setup=tensor("hf_llama"),
        refused_leaves=("q",),
    ),  # fmt: skip
    cli(
        "nan: HF Llama folder, export gguf",
        "export --model {bad} --gguf {tmp}/m.gguf",
        NAN,
        setup=tensor("hf_llama"),
        refused_leaves=("m.gguf",),
    ),  # fmt: skip
    cli("nan: HF Llama folder, eval", "eval --model {bad} {text_txt}", NAN, setup=tensor("hf_llama")),
    cli("nan: HF Llama folder, chat", "chat --model {bad}", NAN, setup=tensor("hf_llama"), stdin="hi\n"),
    cli(
        "nan: HF Llama folder, serve",
        "serve --model {bad} --port 0",
        NAN,
        setup=tensor("hf_llama"),
        serves=True,
        timeout=60,
    ),  # fmt: skip
    cli("inf: HF GPT-2 folder, generate", GEN, NAN, setup=tensor("hf_gpt2", math.inf)),
    cli(
        "inf: HF GPT-2 folder, attention",
        "attention --model {bad} hi --out {tmp}/a.png",
        NAN,
        setup=tensor("hf_gpt2", -math.inf),
    ),  # fmt: skip
    cli("nan: HF GPT-2 norm gain, generate", GEN, NAN, setup=tensor("hf_gpt2", which="ln_f")),
    cli("nan: gguf tensor, generate", GEN, NAN, setup=gguf(tensors={"blk.0.ffn_up.weight": math.nan})),
    cli("inf: gguf tensor, chat", "chat {bad}", NAN, setup=gguf(tensors={"token_embd.weight": math.inf}), stdin="hi\n"),
    cli("nan: int8 folder scale, generate", GEN_RUN, NAN, setup=tensor("int8", which="scale")),
    cli("nan: int4 folder scale, generate", GEN_RUN, NAN, setup=tensor("int4", which="scale")),
    cli("nan: w8a8 folder scale, generate", GEN_RUN, NAN, setup=tensor("w8a8", which="scale")),
    cli("nan: run folder, generate", GEN_RUN, NAN, setup=tensor("gpt")),
    cli("nan: llama run folder, serve", "serve {bad} --port 0", NAN, setup=tensor("llama"), serves=True, timeout=60),
    py("nan: qkv.load of an HF folder", _load, NAN, setup=tensor("hf_llama")),
    py("nan: qkv.load of a gguf file", _load, NAN, setup=gguf(tensors={"output_norm.weight": math.nan})),
    py("nan: qkv.views of an HF GPT-2 folder", lambda p: _load(p), NAN, setup=tensor("hf_gpt2", math.nan)),
    py(
        "nan: qkv.load(quantize='int8') of an HF folder",
        lambda p: _load(p, quantize="int8"),
        NAN,
        setup=tensor("hf_llama"),
    ),  # fmt: skip
]

# ---------------------------------------------------------------------------------- 1. Hugging Face config values


def _small_vocab(paths, work) -> dict:
    """hf-llama whose config.json and W_E say 200 tokens while tokenizer.json holds 300."""
    from safetensors.torch import load_file, save_file

    folder = copy(paths, work, "hf_llama")
    state = load_file(str(folder / "model.safetensors"))
    for name in [n for n in state if "embed_tokens" in n or "lm_head" in n]:
        state[name] = state[name][:200].contiguous()
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    from bad_inputs_spoil import edit_json

    edit_json(folder / "config.json", {"vocab_size": 200})
    return {"bad": str(folder)}


HF_CONFIG = [
    cli(
        "hf tokenizer larger than vocab_size, lens",
        "lens --model {bad} hello --out {tmp}/l.png",
        ("vocab", "tokens"),
        setup=_small_vocab,
    ),  # fmt: skip
    cli("hf tokenizer larger than vocab_size, generate", GEN, ("vocab", "tokens"), setup=_small_vocab),
    py(
        "hf tokenizer larger than vocab_size, qkv.complete",
        lambda p: __import__("qkv").complete(_load(p), "hello there", max_new_tokens=2),
        ("vocab", "tokens"),
        setup=_small_vocab,
    ),  # fmt: skip
]
for _key, _value, _words in [
    ("num_attention_heads", 0, "num_attention_heads"),
    ("num_attention_heads", "2", "num_attention_heads"),
    ("hidden_size", "16", "hidden_size"),
    ("hidden_size", 0, "hidden_size"),
    ("hidden_size", -16, "hidden_size"),
    ("num_hidden_layers", 0, "num_hidden_layers"),
    ("num_hidden_layers", -1, "num_hidden_layers"),
    ("num_hidden_layers", None, "num_hidden_layers"),
    ("vocab_size", 0, "vocab_size"),
    ("max_position_embeddings", 0, "max_position_embeddings"),
    ("max_position_embeddings", "64", "max_position_embeddings"),
    ("intermediate_size", 0, "intermediate_size"),
    ("num_key_value_heads", 0, "num_key_value_heads"),
    ("num_key_value_heads", -2, "num_key_value_heads"),
    ("rms_norm_eps", 0, "rms_norm_eps"),
    ("rms_norm_eps", "tiny", "rms_norm_eps"),
    ("rope_theta", 0, "rope_theta"),
    ("rope_theta", -5, "rope_theta"),
    ("rope_theta", "abc", "rope_theta"),
    ("tie_word_embeddings", "yes", "tie_word_embeddings"),
    ("attention_dropout", 5, "attention_dropout"),
]:  # (a Mistral's sliding_window is checked: the case below)
    HF_CONFIG.append(cli(f"hf llama config {_key}={_value!r}, generate", GEN, (_key, _words),
                         setup=config("hf_llama", **{_key: _value})))  # fmt: skip
for _key, _value in [("n_embd", "16"), ("n_head", 0), ("n_layer", -1), ("n_positions", 0),
                     ("layer_norm_epsilon", "x"), ("n_inner", -5), ("vocab_size", "300")]:  # fmt: skip
    HF_CONFIG.append(cli(f"hf gpt2 config {_key}={_value!r}, generate", GEN, _key,
                         setup=config("hf_gpt2", **{_key: _value})))  # fmt: skip
HF_CONFIG += [
    cli(
        "hf mistral config sliding_window='wide', generate",
        GEN,
        "sliding_window",
        setup=config("hf_llama", model_type="mistral", sliding_window="wide"),
    ),  # fmt: skip
    py(
        "hf llama config num_attention_heads=0, qkv.load",
        _load,
        "num_attention_heads",
        setup=config("hf_llama", num_attention_heads=0),
    ),  # fmt: skip
    py("hf llama config hidden_size='16', qkv.load", _load, "hidden_size", setup=config("hf_llama", hidden_size="16")),
    py("hf gpt2 config n_head=0, qkv.load", _load, "n_head", setup=config("hf_gpt2", n_head=0)),
    cli("hf config.json a list", GEN, ("config.json",), setup=json_file("hf_llama", "config.json", "[1, 2]")),
    cli("hf config.json not JSON", GEN, ("config.json",), setup=json_file("hf_llama", "config.json", "{oops")),
    cli(
        "hf config model_type unknown",
        GEN,
        ("model_type", "cannot import"),
        setup=config("hf_llama", model_type="mamba"),
    ),
    cli("hf tokenizer.json missing", GEN, "tokenizer.json", setup=remove("hf_llama", "tokenizer.json")),
    cli("hf tokenizer.json garbled", GEN, "tokenizer.json", setup=json_file("hf_llama", "tokenizer.json", "{bad")),
    cli(
        "hf tokenizer_config.json chat_template a number",
        "chat --model {bad}",
        ("chat_template", "template"),
        setup=json_file("hf_llama", "tokenizer_config.json", chat_template=5),
        stdin="hi\n",
    ),  # fmt: skip
    cli("hf weights missing", GEN, "weights", setup=remove("hf_llama", "model.safetensors")),
    cli(
        "hf weights truncated",
        GEN,
        ("truncated", "damaged"),
        setup=lambda p, w: _truncate(copy(p, w, "hf_llama") / "model.safetensors"),
    ),  # fmt: skip
]


def _truncate(path, keep: float = 0.5) -> dict:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    return {"bad": str(path.parent)}


ALL = [*WEIGHTS, *HF_CONFIG]
