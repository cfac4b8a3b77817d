"""The battery's cases, continued (bench/bad_inputs.py): training and resuming, permissions, killed writers, the
Python API, GGUF files, chat templates and qkv chat's stdin, quantized folders, the older verbs, and what a new
user trips on."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

from bad_inputs_cases import GEN, GEN_RUN, _load, _view, _views, cli, py
from bad_inputs_spoil import DROP, chmod, copy, gguf, gguf_bytes, json_file, killed, pickle_bin, write

TRAIN = "train --data {text_txt} --out {tmp}/run --preset gpt-nano --steps 4 --warmup-steps 1 --eval-interval 2 " \
        "--eval-batches 1 --quiet --no-samples"  # fmt: skip
LLAMA = TRAIN.replace("--preset gpt-nano", "--arch llama")


def _run_copy(paths: dict, work: Path) -> dict:
    """The gpt run with its checkpoints, to resume."""
    target = work / "in" / "gpt"
    shutil.copytree(paths["gpt"], target)
    return {"bad": str(target)}


RESUME = "train --resume {bad} --steps 20 --quiet --no-samples"
TRAINING = [
    cli("resume with another --arch", RESUME + " --arch llama", "--arch", setup=_run_copy),
    cli("resume with another --preset", RESUME + " --preset gpt-micro", "--preset", setup=_run_copy),
    cli("resume with another --tokenizer", RESUME + " --tokenizer word", "--tokenizer", setup=_run_copy),
    cli("resume with another --task", RESUME + " --task translate", "--task", setup=_run_copy),
    cli("resume with another --vocab-size", RESUME + " --vocab-size 500", ("--vocab-size", "vocab"), setup=_run_copy),
    cli("resume with the same --preset", RESUME + " --preset gpt-nano", (), expect="ok", setup=_run_copy, timeout=180),
    cli("train --rope-base 0", LLAMA + " --rope-base 0", ("--rope-base", "rope_base"), refused_leaves=("run",)),
    cli("train --rope-base -1", LLAMA + " --rope-base -1", ("--rope-base", "rope_base")),
    cli("train --rope-base nan", LLAMA + " --rope-base nan", ("--rope-base", "rope_base")),
    cli("train --rope-base inf", LLAMA + " --rope-base inf", ("--rope-base", "rope_base"), refused_leaves=("run",)),
    cli("train --dropout nan", TRAIN + " --dropout nan", "dropout"),
    cli("train --lr nan", TRAIN + " --lr nan", ("--lr", "lr = nan")),
    cli("train --lr inf", TRAIN + " --lr inf", ("--lr", "lr = inf")),
    cli("train --label-smoothing nan", TRAIN + " --label-smoothing nan", "label"),
    cli("train --grad-clip inf", TRAIN + " --grad-clip inf", ("grad-clip", "grad_clip")),
    cli("train --weight-decay -1", TRAIN + " --weight-decay -1", ("weight-decay", "weight_decay")),
    cli("train --val-fraction 1.5", TRAIN + " --val-fraction 1.5", ("val-fraction", "val_fraction")),
    cli("train --context-length 0", TRAIN + " --context-length 0", "context"),
    cli("train --n-kv-heads 3 (llama)", LLAMA + " --n-kv-heads 3", ("n_kv_heads", "n-kv-heads")),
    cli("train --positional banana", TRAIN + " --positional banana", "positional"),
    cli("train llama --max-time 0", LLAMA + " --max-time 0", "--max-time"),
    cli(
        "train translate --precision bf16",
        "train --task translate --data {pairs_tsv} --out {tmp}/run --steps 3 "
        "--eval-interval 3 --eval-batches 1 --bleu-sentences 2 --warmup-steps 1 --quiet --no-samples --precision bf16 "
        "--preset transformer-tiny",
        (),
        expect="ok",
        timeout=240,
    ),  # fmt: skip
    cli(
        "killed train, then resume",
        RESUME,
        (),
        expect="ok",
        timeout=240,
        setup=killed(
            [
                "train",
                "--data",
                "{text_txt}",
                "--out",
                "{tmp}/in/r",
                "--preset",
                "gpt-nano",
                "--steps",
                "400",
                "--eval-interval",
                "2",
                "--eval-batches",
                "1",
                "--quiet",
                "--no-samples",
            ],
            0,
            when_exists="{tmp}/in/r/checkpoints/latest.json",
        ),  # fmt: skip
    ),
]
TRAINING[-1].what = ["train", "--resume", "{tmp}/in/r", "--steps", "6", "--quiet", "--no-samples"]

# ---------------------------------------------------------------------------------- 6. permissions (as nobody)
UNREADABLE = ("permission", "cannot read", "not readable")


def _locked(setup, file: str | None = None, mode: int = 0):
    """``setup``'s {bad} (or ``file`` inside it) given ``mode``."""

    def locked(paths: dict, work: Path) -> dict:
        out = setup(paths, work)
        target = Path(out["bad"]) / file if file else Path(out["bad"])
        target.chmod(mode)
        return out

    return locked


def _fixture(name: str):
    return lambda paths, work: {"bad": str(copy(paths, work, name))}


def _read_only_folder(paths: dict, work: Path) -> dict:
    folder = work / "in" / "ro"
    folder.mkdir(parents=True)
    folder.chmod(0o555)
    return {"bad": str(folder)}


PERMISSIONS = [
    cli("chmod 000 run folder, generate", GEN_RUN, UNREADABLE, setup=chmod("gpt", None, 0), user=True),
    cli("chmod 000 HF folder, generate", GEN, UNREADABLE, setup=chmod("hf_llama", None, 0), user=True),
    cli(
        "chmod 000 model.safetensors (run), generate",
        GEN_RUN,
        UNREADABLE,
        setup=chmod("gpt", "model.safetensors", 0),
        user=True,
    ),  # fmt: skip
    cli(
        "chmod 000 model.safetensors (HF), generate",
        GEN,
        UNREADABLE,
        setup=chmod("hf_llama", "model.safetensors", 0),
        user=True,
    ),  # fmt: skip
    cli("chmod 000 config.json (HF), generate", GEN, UNREADABLE, setup=chmod("hf_llama", "config.json", 0), user=True),
    cli(
        "chmod 000 tokenizer.json (run), generate",
        GEN_RUN,
        UNREADABLE,
        setup=chmod("gpt", "tokenizer.json", 0),
        user=True,
    ),  # fmt: skip
    cli(
        "chmod 000 tokenizer.json (HF), generate",
        GEN,
        UNREADABLE,
        setup=chmod("hf_llama", "tokenizer.json", 0),
        user=True,
    ),  # fmt: skip
    cli("chmod 000 gguf file, generate", GEN, UNREADABLE, setup=_locked(_fixture("llama_gguf")), user=True),
    cli(
        "chmod 000 data file, train",
        TRAIN.replace("{text_txt}", "{bad}"),
        UNREADABLE,
        setup=_locked(_fixture("text_txt")),
        user=True,
    ),  # fmt: skip
    cli("chmod 000 eval text, eval", "eval {gpt} {bad}", UNREADABLE, setup=_locked(_fixture("text_txt")), user=True),
    cli(
        "chmod 000 chat template, chat",
        "chat {llama_gguf} --chat-template {bad}",
        UNREADABLE,
        setup=_locked(write("t.jinja", "{{ 1 }}")),
        stdin="hi\n",
        user=True,
    ),  # fmt: skip
    cli(
        "read-only output folder, quantize",
        "quantize {gpt} --out {bad}/q",
        ("cannot write", "permission"),
        setup=_read_only_folder,
        user=True,
    ),  # fmt: skip
    cli(
        "chmod 000 checkpoints, resume",
        "train --resume {bad} --steps 20 --quiet --no-samples",
        UNREADABLE,
        setup=_locked(_run_copy, "checkpoints"),
        user=True,
    ),  # fmt: skip
    cli("pytorch_model.bin with a pickled object", GEN, "pytorch_model.bin", setup=pickle_bin("object")),
    cli("pytorch_model.bin of plain tensors", GEN, (), expect="ok", setup=pickle_bin("tensors")),
]

# ---------------------------------------------------------------------------------- 7. killed writers
QUANTIZE = "quantize {gpt} --out {tmp}/cwd/q"


def _half_quantized(paths: dict, work: Path) -> dict:
    """A finished int8 copy whose config.json has not landed: killed right after the weights."""
    from qkv.cli import main

    out = work / "cwd" / "q"
    out.parent.mkdir(parents=True, exist_ok=True)
    main(["quantize", paths["gpt"], "--out", str(out)])
    (out / "config.json").unlink()
    return {}


KILLED = [
    cli("quantize killed after its weights landed, run again", QUANTIZE, (), expect="ok", setup=_half_quantized),
    cli(
        "quantize kill -9 while writing, run again",
        QUANTIZE,
        (),
        expect="ok",
        setup=killed(["quantize", "{gpt}", "--out", "{tmp}/cwd/q"], 0, when_exists="{tmp}/cwd/q"),
    ),  # fmt: skip
    cli(
        "export gguf kill -9, run again",
        "export {llama} --gguf {tmp}/cwd/m.gguf",
        (),
        expect="ok",
        setup=killed(["export", "{llama}", "--gguf", "{tmp}/cwd/m.gguf"], 3.0),
    ),  # fmt: skip
]

# ---------------------------------------------------------------------------------- 9. the Python API
_qkv = __import__("importlib").import_module


def _complete(key: str, prompt, **kw):
    return lambda p: _qkv("qkv").complete(_load(p, key), prompt, **kw)


def _chat(key: str, messages, **kw):
    return lambda p: _qkv("qkv").chat(_load(p, key), messages, **kw)


PYTHON = [
    py("views(device='banana')", _views("gpt", device="banana"), ("banana", "device")),
    py("views(device='cuda') without a GPU", _views("gpt", device="cuda"), ("cuda", "GPU")),
    py("load(device='banana')", lambda p: _load(p, "gpt", device="banana"), ("banana", "device")),
    py("load(quantize='int3')", lambda p: _load(p, "gpt", quantize="int3"), ("int3", "scheme")),
    py("load('')", lambda p: _qkv("qkv").load(""), ("path", "empty", "model")),
    py("load(123)", lambda p: _qkv("qkv").load(123), ("path", "123")),
    py("load of a text file", lambda p: _load(p, "text_txt"), ("file", "GGUF")),
    py("views(translator).translate('')", _view("translator", "translate", ""), ("empty", "nothing", "no text")),
    py("views(translator).translate([])", _view("translator", "translate", []), ("empty", "nothing", "no ")),
    py(
        "views(translator).translate(['', 'one'])",
        _view("translator", "translate", ["", "one two"]),
        ("empty",),
        expect="note",
    ),  # fmt: skip
    py("views(translator).translate(beam=0)", _view("translator", "translate", "one two", beam=0), "beam"),
    py("views(gpt).translate('hi')", _view("gpt", "translate", "to be"), ("translator", "GPT")),
    py("views(translator).generate('hi')", _view("translator", "generate", "one"), ("translator", "language model")),
    py(
        "views(gpt).attention(target=) ignored",
        _view("gpt", "attention", "to be", target="x"),
        ("target", "translator"),
    ),
    py("views(gpt).lens(target=) ignored", _view("gpt", "lens", "to be", target="x"), ("target", "translator")),
    py("views(gpt).neighbours(target=True)", _view("gpt", "neighbours", "t", target=True), ("target", "translator")),
    py("views(gpt).attention('')", _view("gpt", "attention", ""), ("empty", "text")),
    py("views(gpt).lens('')", _view("gpt", "lens", ""), ("empty", "text")),
    py("views(gpt).explain('')", _view("gpt", "explain", ""), ("empty", "text")),
    py("views(gpt).walkthrough('')", _view("gpt", "walkthrough", ""), ("empty", "text")),
    py("views(gpt).attribute('')", _view("gpt", "attribute", ""), ("empty", "text")),
    py("views(gpt).patch('', '')", _view("gpt", "patch", "", ""), ("empty", "text")),
    py("views(gpt).tokens('')", _view("gpt", "tokens", ""), (), expect="ok"),
    py("views(gpt).next_token('') (after <bos>)", _view("gpt", "next_token", ""), (), expect="ok"),
    py("views(gpt).lens(top=0)", _view("gpt", "lens", "to be", top=0), "top"),
    py("views(gpt).lens(top=-3)", _view("gpt", "lens", "to be", top=-3), "top"),
    py("views(gpt).heads(batch=10**8)", _view("gpt", "heads", batch=10**8), ("batch",)),
    py(
        "views(gpt).next_token(temperatures=(0,))",
        _view("gpt", "next_token", "to", temperatures=(-1.0,)),
        "temperature",
    ),  # fmt: skip
    py("views(gpt).neighbours('not-a-token-zz')", _view("gpt", "neighbours", "not-a-token-zz"), ("token", "vocab")),
    py("views(gpt).explain(layer=99)", _view("gpt", "explain", "to be", layer=99), "layer"),
    py("views(gpt).explain(head=-1)", _view("gpt", "explain", "to be", head=-1), "head"),
    py("views(word2vec).lens", _view("word2vec", "lens", "the"), ("Word2Vec", "lens")),
    py("views(gpt).generate(max_new_tokens=-1)", _view("gpt", "generate", "to", max_new_tokens=-1), "max_new_tokens"),
    py("complete(gpt, '') (from <bos>)", _complete("gpt", ""), (), expect="ok"),
    py("complete(translator, 'x')", _complete("translator", "one"), ("translator", "language model")),
    py("complete(gpt, prompt=[999999])", _complete("gpt", [999999]), ("vocabulary", "ids")),
    py("complete(gpt, temperature=nan)", _complete("gpt", "to", temperature=math.nan), "temperature"),
    py("complete(gpt, top_k=1.5)", _complete("gpt", "to", top_k=1.5), "top_k"),
    py("complete(gpt, banana=1)", _complete("gpt", "to", banana=1), "banana"),
    py("complete(gpt, stop=[''])", _complete("gpt", "to", stop=[""]), "stop"),
    py("complete(gpt, seed=-1)", _complete("gpt", "to", seed=-1), "seed"),
    py("complete(gpt, step='banana')", _complete("gpt", "to", step="banana"), ("step", "banana")),
    py("chat(hf_llama, [])", _chat("hf_llama", []), ("messages", "empty", "no message")),
    py("chat(hf_llama, role robot)", _chat("hf_llama", [{"role": "robot", "content": "hi"}]), ("role", "robot")),
    py("chat(hf_llama, no role)", _chat("hf_llama", [{"content": "hi"}]), "role"),
    py("chat(hf_llama, content 5)", _chat("hf_llama", [{"role": "user", "content": 5}]), "content"),
    py("chat(hf_llama, a string)", _chat("hf_llama", "hello"), ("messages", "list")),
    py("chat(gpt run without a template)", _chat("gpt", [{"role": "user", "content": "hi"}]), ("template",)),
    py(
        "chat(hf_llama, template='{{ oops')",
        _chat("hf_llama", [{"role": "user", "content": "hi"}], template="{{ oops"),
        ("template",),
    ),  # fmt: skip
    py(
        "generate(model, [], no bos)",
        lambda p: _qkv("qkv.decoding").generate(_load(p, "gpt").model, [], max_new_tokens=2),
        ("empty", "bos"),
    ),  # fmt: skip
    py(
        "stream(model, [[1], [2, 3]]) ragged",
        lambda p: list(_qkv("qkv.decoding").stream(_load(p, "gpt").model, [[1], [2, 3]], max_new_tokens=2)),
        ("prompt", "length", "list"),
    ),  # fmt: skip
    py(
        "Translator.load(gpt run)",
        lambda p: _qkv("qkv.decoding.translator").Translator.load(p["gpt"]),
        ("translator", "GPT"),
    ),  # fmt: skip
    py(
        "Translator.translate([''])",
        lambda p: _qkv("qkv.decoding.translator").Translator.load(p["translator"]).translate([""]),
        (),
        expect="ok",
    ),  # fmt: skip  (an empty translation, counted in .empty)
    py("SamplingParams(temperature=inf)", lambda p: _qkv("qkv").SamplingParams(temperature=math.inf), "temperature"),
    py("SamplingParams(temperature='0.5')", lambda p: _qkv("qkv").SamplingParams(temperature="0.5"), "temperature"),
    py(
        "SamplingParams(max_new_tokens=True)",
        lambda p: _qkv("qkv").SamplingParams(max_new_tokens=True),
        "max_new_tokens",
    ),  # fmt: skip
    py("SamplingParams(top_p=0)", lambda p: _qkv("qkv").SamplingParams(top_p=0), "top_p"),
    py("SamplingParams(logprobs=-1)", lambda p: _qkv("qkv").SamplingParams(logprobs=-1), "logprobs"),
    py("SamplingParams(stop=5)", lambda p: _qkv("qkv").SamplingParams(stop=5), "stop"),
    py(
        "SamplingParams(repetition_penalty=0)",
        lambda p: _qkv("qkv").SamplingParams(repetition_penalty=0),
        "repetition_penalty",
    ),  # fmt: skip
    py(
        "TrainConfig(rope via model={'rope_base': 0})",
        lambda p: _qkv("qkv.training").TrainConfig.create(arch="llama", model={"rope_base": 0.0}),
        "rope_base",
    ),  # fmt: skip
    py(
        "TrainConfig(model={'rope_base': inf})",
        lambda p: _qkv("qkv.training").TrainConfig.create(arch="llama", model={"rope_base": math.inf}),
        "rope_base",
    ),  # fmt: skip
    py(
        "LlamaConfig(rope_base=nan)",
        lambda p: _qkv("qkv.models.llama").LlamaConfig(vocab_size=10, rope_base=math.nan),
        "rope_base",
    ),  # fmt: skip
    py("GPTConfig(n_heads=0)", lambda p: _qkv("qkv").GPTConfig(vocab_size=10, n_heads=0), "n_heads"),
    py("GPTConfig(d_model='64')", lambda p: _qkv("qkv").GPTConfig(vocab_size=10, d_model="64"), "d_model"),
    py("GPTConfig(n_layers=1e8)", lambda p: _qkv("qkv").GPTConfig(vocab_size=10, n_layers=1e8), "n_layers"),
]

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
        "quantize --bits 4 --activations int8",
        "quantize {gpt} --out {tmp}/q --bits 4 --activations int8",
        ("activations", "int4", "int8"),
        refused_leaves=("q",),
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

ALL = [*TRAINING, *PERMISSIONS, *KILLED, *PYTHON, *GGUF, *CHATS, *QUANTIZED, *OLD, *NEW_USER]
