"""The battery's Python cases (bench/bad_inputs.py): what the Python API refuses, as the command line does."""

from __future__ import annotations

import importlib
import math

from bad_inputs_cases import _load, _view, _views, py

# ---------------------------------------------------------------------------------- 9. the Python API
_qkv = importlib.import_module


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

ALL = PYTHON
