"""The battery's cases, continued (bench/bad_inputs.py): GGUF files, chat templates and qkv chat's stdin, quantized
folders, the older verbs, and what a new user trips on."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

from bad_inputs_cases import GEN, GEN_RUN, _load, cli, py
from bad_inputs_cases_more import TRAIN
from bad_inputs_spoil import DROP, copy, gguf, gguf_bytes, json_file, write

# ---------------------------------------------------------------------------------- GGUF files
GGUF = [
    cli("gguf cut in half", GEN, ("truncated",), setup=gguf_bytes(lambda b: b[: len(b) // 2])),
    cli("gguf cut in its header", GEN, ("truncated",), setup=gguf_bytes(lambda b: b[:100])),
    cli("gguf of zero bytes", GEN, ("empty", "GGUF", "file"), setup=gguf_bytes(lambda b: b"")),
    cli("gguf wrong magic", GEN, ("GGUF", "file"), setup=gguf_bytes(lambda b: b"GGUX" + b[4:])),
    cli("gguf version 9", GEN, ("version",), setup=gguf_bytes(lambda b: b[:4] + bytes([9, 0, 0, 0]) + b[8:])),
    cli(
        "gguf a folder named .gguf",
        "generate --model {tmp}/in/dir.gguf",
        ("folder", "file", "directory", "config"),
        setup=lambda p, w: ((w / "in" / "dir.gguf").mkdir(parents=True), {})[1],
    ),  # fmt: skip
    cli("gguf block_count 0", GEN, "block_count", setup=gguf(meta={"llama.block_count": 0})),
    cli("gguf block_count a string", GEN, "block_count", setup=gguf(meta={"llama.block_count": "2"})),
    cli("gguf head_count 0", GEN, "head_count", setup=gguf(meta={"llama.attention.head_count": 0})),
    cli("gguf head_count_kv 3", GEN, "head_count", setup=gguf(meta={"llama.attention.head_count_kv": 3})),
    cli("gguf context_length 0", GEN, "context_length", setup=gguf(meta={"llama.context_length": 0})),
    cli(
        "gguf embedding_length 20",
        GEN,
        ("embedding_length", "dimension_count", "shape"),
        setup=gguf(meta={"llama.embedding_length": 20}),
    ),  # fmt: skip
    cli(
        "gguf feed_forward_length missing",
        GEN,
        "feed_forward_length",
        setup=gguf(meta={"llama.feed_forward_length": DROP}),
    ),  # fmt: skip
    cli("gguf rms epsilon 0", GEN, "epsilon", setup=gguf(meta={"llama.attention.layer_norm_rms_epsilon": 0.0})),
    cli("gguf rope freq_base 0", GEN, "freq_base", setup=gguf(meta={"llama.rope.freq_base": 0.0})),
    cli("gguf rope freq_base nan", GEN, "freq_base", setup=gguf(meta={"llama.rope.freq_base": math.nan})),
    cli("gguf tokens missing", GEN, ("token", "tokenizer"), setup=gguf(meta={"tokenizer.ggml.tokens": DROP})),
    cli("gguf tokenizer model unknown", GEN, ("tokenizer",), setup=gguf(meta={"tokenizer.ggml.model": "bert"})),
    cli("gguf eos id out of range", GEN, ("eos", "token"), setup=gguf(meta={"tokenizer.ggml.eos_token_id": 99999})),
    cli(
        "gguf chat_template a number",
        "chat {bad}",
        ("template",),
        setup=gguf(meta={"tokenizer.chat_template": 5}),
        stdin="hi\n",
    ),  # fmt: skip
    cli(
        "gguf chat_template bad Jinja",
        "chat {bad}",
        ("template",),
        setup=gguf(meta={"tokenizer.chat_template": "{% for %}"}),
        stdin="hi\n",
    ),  # fmt: skip
    cli("gguf token_embd missing", GEN, ("token_embd", "lacks"), setup=gguf(tensors={"token_embd.weight": DROP})),
    cli(
        "gguf an extra tensor",
        GEN,
        ("foo", "tensor"),
        setup=gguf(tensors={"foo.weight": __import__("numpy").zeros((4, 4), "float32")}),
    ),  # fmt: skip
    cli(
        "gguf a tensor of the wrong shape",
        GEN,
        ("shape", "attn_q"),
        setup=gguf(tensors={"blk.0.attn_q.weight": __import__("numpy").zeros((8, 16), "float32")}),
    ),  # fmt: skip
    py("gguf cut in half, qkv.load", _load, ("truncated",), setup=gguf_bytes(lambda b: b[: len(b) // 2])),
    py("gguf block_count 0, qkv.load", _load, "block_count", setup=gguf(meta={"llama.block_count": 0})),
    cli(
        "gguf export of a translator",
        "export {translator} --gguf {tmp}/t.gguf",
        ("GGUF", "translator", "decoder"),
        refused_leaves=("t.gguf",),
    ),  # fmt: skip
    cli("gguf export over an existing file", "export {llama} --gguf {text_txt}", ("exists", "--force")),
]

# ---------------------------------------------------------------------------------- chat templates and qkv chat
CHAT = "chat {llama_gguf} --max-new-tokens 3"
CHATS = [
    cli("chat --chat-template missing file", CHAT + " --chat-template {tmp}/none.jinja", ("does not exist", "none")),
    cli(
        "chat --chat-template empty file",
        CHAT + " --chat-template {bad}",
        ("empty", "template"),
        setup=write("t.jinja", ""),
    ),  # fmt: skip
    cli(
        "chat --chat-template syntax error",
        CHAT + " --chat-template {bad}",
        ("template", "Jinja"),
        setup=write("t.jinja", "{% for m in messages %}"),
    ),  # fmt: skip
    cli(
        "chat --chat-template raising",
        CHAT + " --chat-template {bad}",
        ("template", "no system"),
        setup=write("t.jinja", "{{ raise_exception('no system') }}"),
        stdin="hi\n",
    ),  # fmt: skip
    cli(
        "chat --chat-template rendering nothing",
        CHAT + " --chat-template {bad}",
        ("template", "empty", "nothing"),
        setup=write("t.jinja", "{# nothing #}"),
        stdin="hi\n",
    ),  # fmt: skip
    cli(
        "chat --chat-template an undefined name",
        CHAT + " --chat-template {bad}",
        ("template", "undefined", "foo"),
        setup=write("t.jinja", "{{ foo.bar.baz }}"),
        stdin="hi\n",
    ),  # fmt: skip
    cli(
        "chat --chat-template binary",
        CHAT + " --chat-template {bad}",
        ("UTF-8", "template", "binary"),
        setup=write("t.jinja", b"\xff\xfe\x00\x00"),
    ),  # fmt: skip
    cli("chat on a run without a template", "chat {gpt} --max-new-tokens 3", "template", stdin="hi\n"),
    cli("chat on a translator", "chat {translator}", ("translator", "language model"), stdin="hi\n"),
    cli("chat on word2vec", "chat {word2vec}", ("Word2Vec", "language model", "word vectors"), stdin="hi\n"),
    cli("chat stdin empty", CHAT, ("nothing", "no input", "empty", "no line"), expect="note", stdin=""),
    cli("chat stdin only blank lines", CHAT, ("no input", "no line", "blank"), expect="note", stdin="\n\n  \n"),
    cli("chat stdin invalid UTF-8", CHAT, ("UTF-8", "utf-8"), expect="note", stdin=b"caf\xe9\n"),
    cli("chat stdin longer than the context", CHAT, ("context", "longer"), expect="note", stdin="hello " * 400 + "\n"),
    cli(
        "chat stdin an unknown /command",
        CHAT,
        ("command", "/help", "/frobnicate"),
        expect="note",
        stdin="/frobnicate\n",
    ),  # fmt: skip
    cli("chat --max-new-tokens 0", CHAT.replace("3", "0"), ("max-new-tokens", "max_new_tokens"), stdin="hi\n"),
    cli(
        "chat --system without a system role",
        "chat {llama_gguf} --system hi --chat-template {bad}",
        ("system", "template"),
        setup=write(
            "t.jinja",
            "{% for m in messages %}{% if m.role == 'system' %}"
            "{{ raise_exception('System role not supported') }}{% endif %}"
            "{{ m.content }}{% endfor %}",
        ),
        stdin="hi\n",
    ),  # fmt: skip
]

# ---------------------------------------------------------------------------------- quantized folders
QUANTIZED = [
    cli(
        "int4 quantization.json garbled",
        GEN_RUN,
        "quantization.json",
        setup=json_file("int4", "quantization.json", "{bad"),
    ),  # fmt: skip
    cli(
        "int4 quantization.json missing",
        GEN_RUN,
        "quantization.json",
        setup=lambda p, w: ((copy(p, w, "int4") / "quantization.json").unlink(), {"bad": str(w / "in" / "int4")})[1],
    ),  # fmt: skip
    cli(
        "int4 quantization.json bits 3",
        GEN_RUN,
        ("scheme", "bits", "quantization.json"),
        setup=json_file("int4", "quantization.json", scheme="int3"),
    ),  # fmt: skip
    cli(
        "int4 quantization.json group_size 7",
        GEN_RUN,
        ("group", "quantization.json"),
        setup=json_file("int4", "quantization.json", group_size=7),
    ),  # fmt: skip
    cli(
        "int4 weights with int8's quantization.json",
        GEN_RUN,
        ("int8", "int4", "quantization"),
        setup=lambda p, w: (
            shutil.copy(Path(p["int8"]) / "quantization.json", copy(p, w, "int4")),
            {"bad": str(w / "in" / "int4")},
        )[1],
    ),  # fmt: skip
    cli(
        "w8a8 activations int16",
        GEN_RUN,
        ("activations", "quantization.json"),
        setup=json_file("w8a8", "quantization.json", activations="int16"),
    ),  # fmt: skip
    cli(
        "int4 folder quantized again", "quantize {int4} --out {tmp}/q", ("quantized already",), refused_leaves=("q",)
    ),  # fmt: skip
    cli(
        "int4 folder exported to gguf",
        "export {int4} --gguf {tmp}/m.gguf --gguf-approximate-gelu",
        ("int4",),
        refused_leaves=("m.gguf",),
    ),  # fmt: skip
    cli(
        "int4 folder exported to onnx",
        "export {int4} --out {tmp}/m.onnx",
        ("int4", "quantized", "float"),
        refused_leaves=("m.onnx",),
    ),  # fmt: skip
    cli("quantize --bits 3", "quantize {gpt} --out {tmp}/q --bits 3", ("bits", "int"), refused_leaves=("q",)),
    cli(
        "quantize --group-size 7",
        "quantize {gpt} --out {tmp}/q --bits 4 --group-size 7",
        ("group",),
        refused_leaves=("q",),
    ),  # fmt: skip
    cli(
        "quantize --bits 4 --activations int8 (W4A8)",
        "quantize {gpt} --out {tmp}/q --bits 4 --activations int8",
        (),
        expect="ok",
    ),  # fmt: skip
    cli("quantize of a GGUF file", "quantize --model {llama_gguf} --out {tmp}/q", (), expect="ok"),
    cli("int4 folder served, attention view", "attention {int4} 'to be' --out {tmp}/a.png", (), expect="ok"),
]

# ---------------------------------------------------------------------------------- the older verbs
OLD = [
    cli("generate --device banana", GEN_RUN.replace("{bad}", "{gpt}") + " --device banana", "banana"),
    cli("generate --threads 0", GEN_RUN.replace("{bad}", "{gpt}") + " --threads 0", "--threads"),
    cli("generate --top-k -1", "generate {gpt} --top-k -1", ("top-k", "top_k")),
    cli("generate --top-p 2", "generate {gpt} --top-p 2", ("top-p", "top_p")),
    cli("generate --max-new-tokens -1", "generate {gpt} --max-new-tokens -1", ("max-new-tokens", "max_new_tokens")),
    cli("generate --num-samples 0", "generate {gpt} --num-samples 0", "--num-samples"),
    cli("generate --prompt-lookup -1", "generate {gpt} --prompt-lookup -1", ("prompt-lookup", "prompt_lookup")),
    cli("generate --prompt-lookup sampled", "generate {gpt} --prompt-lookup 5 --temperature 0.8", ("--temperature",)),
    cli("chat --prompt-lookup penalized", "chat {gpt} --prompt-lookup 5 --repetition-penalty 1.3", ("penalty",)),
    cli("serve --prompt-lookup -1", "serve {gpt} --prompt-lookup -1", "--prompt-lookup"),
    cli("generate --prompt-lookup --no-cache", "generate {gpt} --prompt-lookup 5 --no-cache", ("--no-cache",)),
    cli("generate a translator", "generate {translator}", ("translator", "translate")),
    cli("translate a GPT", "translate {gpt} 'to be'", ("language model", "generate")),
    cli("translate an empty sentence", "translate {translator} ''", ("empty",), expect="note"),
    cli("translate an empty --file", "translate {translator} --file {bad}", ("empty",), setup=write("e.txt", "")),
    cli("translate --beam 0", "translate {translator} 'one' --beam 0", "beam"),
    cli("embed a GPT", "embed {gpt} hello", ("encoder", "language model")),
    cli("eval a translator without --src", "eval {translator}", "--src"),
    cli("eval an empty text", "eval {gpt} {bad}", ("empty",), setup=write("e.txt", "")),
    cli("attention of an empty text", "attention {gpt} '' --out {tmp}/a.png", ("empty", "text")),
    cli("next of an empty text", "next {gpt} ''", ("empty",), expect="note"),
    cli("lens of an empty text", "lens {gpt} '' --out {tmp}/l.png", ("empty", "text")),
    cli("explain an empty text", "explain ''", ("empty", "text")),
    cli("embeddings --neighbours unknown", "embeddings {word2vec} --neighbours zzzz", ("zzzz", "vocabulary")),
    cli("plot a missing run", "plot {tmp}/none", "does not exist"),
    cli("train a missing data file", TRAIN.replace("{text_txt}", "{tmp}/none.txt"), "does not exist"),
    cli("train binary data", TRAIN.replace("{text_txt}", "{bad}"), "binary", setup=write("b.txt", b"\x00\x01" * 999)),
    cli("serve --port 70000", "serve {gpt} --port 70000", "--port"),
    cli("serve --queue-timeout soon", "serve {gpt} --queue-timeout soon", "soon"),
    cli(
        "serve --chat-template missing",
        "serve {llama_gguf} --port 0 --chat-template {tmp}/x.jinja",
        ("does not exist",),
    ),  # fmt: skip
    cli("serve --max-tokens 0", "serve {gpt} --port 0 --max-tokens 0", "max-tokens", serves=True),
    cli(
        "serve --max-prompt-tokens -1", "serve {gpt} --port 0 --max-prompt-tokens -1", "max-prompt-tokens", serves=True
    ),
    cli("unknown verb", "genrate {gpt}", "genrate"),
    cli("next --top 0", "next {gpt} 'to' --top 0", "--top"),
]

# ---------------------------------------------------------------------------------- what a new user trips on
NEW_USER = [
    cli(
        "embeddings --analogy king man woman on a character model",
        "embeddings {gpt} --analogy king man woman",
        ("character", "one token", "vocabulary"),
    ),  # fmt: skip
    cli(
        "export --out over an existing file names --out",
        "export {gpt} --out {bad}",
        ("--out", "--force"),
        setup=write("m.onnx", "x"),
    ),  # fmt: skip
    cli(
        "a second attention over attention.png",
        "attention {bad} 'to be'",
        ("already exists", "replac", "overwr"),
        expect="note",
        setup=lambda p, w: (lambda d: ((d / "attention.png").write_bytes(b"x"), {"bad": str(d)})[1])(copy(p, w, "gpt")),
    ),  # fmt: skip
    cli(
        "translate on a character model: two lines",
        "translate {translator} --file {bad}",
        (),
        expect="ok",
        forbid=("unknown", "<unk>"),
        setup=write("two.txt", "one two\nthree four\n"),
    ),  # fmt: skip
]

ALL = [*GGUF, *CHATS, *QUANTIZED, *OLD, *NEW_USER]
