"""The battery's cases, continued (bench/bad_inputs.py): sizes beyond memory, sharded weights, and a temperature
that rounds to 0 in float32."""

from __future__ import annotations

from bad_inputs_cases import GEN, GEN_RUN, MEMORY, _load, _view, cli, py
from bad_inputs_spoil import DROP, both, config, copy, gguf, shards

# ---------------------------------------------------------------------------------- 2. sizes beyond memory
MEMORY_CASES = [
    cli(
        "memory: hf num_hidden_layers=100000000",
        GEN,
        MEMORY,
        setup=config("hf_llama", num_hidden_layers=100000000),
        timeout=120,
    ),  # fmt: skip
    cli(
        "memory: hf num_hidden_layers=1e8 (a float)",
        GEN,
        MEMORY + ("num_hidden_layers",),
        setup=config("hf_llama", num_hidden_layers=1e8),
        timeout=120,
    ),  # fmt: skip
    cli(
        "memory: hf hidden_size=2**20",
        GEN,
        MEMORY,
        setup=config("hf_llama", hidden_size=2**20, head_dim=DROP),
        timeout=120,
    ),  # fmt: skip
    cli(
        "memory: hf vocab_size=10**11",
        GEN,
        MEMORY + ("vocab",),
        setup=config("hf_llama", vocab_size=10**11),
        timeout=120,
    ),  # fmt: skip
    cli(
        "memory: hf max_position_embeddings=10**12",
        GEN,
        MEMORY + ("max_position_embeddings",),
        setup=config("hf_llama", max_position_embeddings=10**12),
        timeout=120,
    ),  # fmt: skip
    cli("memory: hf gpt2 n_positions=10**11", GEN, MEMORY, setup=config("hf_gpt2", n_positions=10**11), timeout=120),
    cli("memory: gguf block_count=10**8", GEN, MEMORY, setup=gguf(meta={"llama.block_count": 10**8}), timeout=120),
    cli(
        "memory: gguf context_length=10**12",
        GEN,
        MEMORY + ("context_length",),
        setup=gguf(meta={"llama.context_length": 10**12}),
        timeout=120,
    ),  # fmt: skip
    cli(
        "memory: run config context_length=10**11",
        GEN_RUN,
        MEMORY,
        setup=config("gpt", context_length=10**11),
        timeout=120,
    ),  # fmt: skip
    cli(
        "memory: generate --max-new-tokens 10**12 (llama run)",
        "generate {llama} --max-new-tokens 1000000000000",
        MEMORY + ("max-new-tokens",),
        timeout=120,
    ),  # fmt: skip
    cli(
        "memory: generate --max-new-tokens 10**12 (HF llama)",
        "generate --model {hf_llama} --max-new-tokens 1000000000000",
        MEMORY + ("max-new-tokens",),
        timeout=120,
    ),
    cli(
        "memory: chat --max-new-tokens 10**12",
        "chat {llama_gguf} --max-new-tokens 1000000000000",
        MEMORY + ("max-new-tokens",),
        stdin="hi\n",
        timeout=120,
    ),  # fmt: skip
    cli(
        "memory: translate --max-len-b 10**12",
        "translate {translator} 'one two' --max-len-b 1000000000000",
        ("--max-len-b",),
        expect="note",
        timeout=120,
    ),  # fmt: skip
    cli(
        "memory: translate --beam 10**6",
        "translate {translator} 'one two' --beam 1000000",
        MEMORY + ("beam",),
        timeout=120,
    ),  # fmt: skip
    cli(
        "memory: translate --n-best 10**6",
        "translate {translator} 'one two' --n-best 1000000",
        ("n-best", "beam"),
        timeout=120,
    ),  # fmt: skip
    cli(
        "memory: translate --batch-size 10**9 (a bound)",
        "translate {translator} 'one two' --batch-size 1000000000",
        (),
        expect="ok",
        timeout=120,
    ),  # fmt: skip
    cli(
        "memory: lens --position 10**9", "lens {gpt} 'to be' --position 1000000000 --out {tmp}/l.png", ("position",)
    ),  # fmt: skip
    cli("memory: heads --length 10**9", "heads {gpt} --length 1000000000", MEMORY + ("length",), timeout=120),
    cli(
        "memory: serve --max-batch 100000000",
        "serve {gpt} --port 0 --max-batch 100000000",
        MEMORY + ("max-batch",),
        serves=True,
        timeout=120,
    ),  # fmt: skip
    cli(
        "memory: serve --kv-tokens 10**12 (a bound)",
        "serve {gpt} --port 0 --kv-tokens 1000000000000",
        (),
        expect="ok",
        serves=True,
        timeout=60,
    ),  # fmt: skip
    cli(
        "memory: serve --kv-memory 1e12 (a bound)",
        "serve {gpt} --port 0 --kv-memory 1e12",
        (),
        expect="ok",
        serves=True,
        timeout=60,
    ),  # fmt: skip
    cli("memory: serve --max-batch 0", "serve {gpt} --port 0 --max-batch 0", "max-batch", serves=True),
    cli("memory: serve --max-n 0", "serve {gpt} --port 0 --max-n 0", "max-n", serves=True),
    py(
        "memory: decoding.generate(max_new_tokens=10**12)",
        lambda p: __import__("qkv.decoding").decoding.generate(
            _load(p, "llama").model, [1, 2], max_new_tokens=10**12, temperature=0
        ),
        MEMORY + ("max_new_tokens",),
        timeout=120,
    ),  # fmt: skip
    py(
        "memory: qkv.complete(max_new_tokens=10**15)",
        lambda p: __import__("qkv").complete(_load(p, "hf_llama"), "hi", max_new_tokens=10**15),
        MEMORY + ("max_new_tokens",),
        timeout=120,
    ),  # fmt: skip
    py(
        "memory: Translator.translate(beam=10**6)",
        lambda p: (
            __import__("qkv.decoding.translator")
            .decoding.translator.Translator.load(p["translator"])
            .translate(["one two"], beam=10**6)
        ),
        MEMORY + ("beam",),
        timeout=120,
    ),
    py("memory: views.heads(length=10**9)", _view("gpt", "heads", length=10**9), MEMORY + ("length",), timeout=120),
    py(
        "memory: qkv.load of hf num_hidden_layers=10**8",
        _load,
        MEMORY,
        setup=config("hf_llama", num_hidden_layers=10**8),
        timeout=120,
    ),  # fmt: skip
]

# ---------------------------------------------------------------------------------- 3. sharded weights
_outside = lambda p, w: (copy(p, w, "hf_llama", "outside"), {})[1]  # noqa: E731
SHARDS = [
    cli("shards: good index", GEN, (), expect="ok", setup=shards()),
    cli(
        "shards: a shard name leaving the folder (../)",
        GEN,
        ("outside", "folder", "shard"),
        setup=both(_outside, shards(names=("../outside/model.safetensors", "b.safetensors"))),
    ),  # fmt: skip
    cli(
        "shards: an absolute shard path",
        GEN,
        ("outside", "folder", "shard"),
        setup=shards(names=("/etc/passwd", "b.safetensors")),
    ),  # fmt: skip
    cli("shards: weight_map a list", GEN, ("weight_map", "index"), setup=shards(index=["a.safetensors"])),
    cli("shards: weight_map a string", GEN, ("weight_map", "index"), setup=shards(index="a.safetensors")),
    cli("shards: weight_map values numbers", GEN, ("weight_map", "index", "shard"), setup=shards(index={"x": 5})),
    cli("shards: index not JSON", GEN, ("index", "damaged"), setup=shards(index="{oops")),
    cli("shards: index a list", GEN, ("index", "damaged"), setup=shards(index="[]")),
    cli(
        "shards: a shard missing",
        GEN,
        ("shard", "lacks"),
        setup=both(shards(), lambda p, w: ((w / "in" / "hf-llama" / "b.safetensors").unlink(), {})[1]),
    ),  # fmt: skip
    cli(
        "shards: weight_map naming a tensor in the wrong shard",
        GEN,
        (),
        expect="ok",
        setup=shards(names=("b.safetensors", "a.safetensors")),
    ),  # fmt: skip
]

# ---------------------------------------------------------------------------------- 4. temperature 1e-300
TINY_T = [
    cli("T=1e-300: generate", "generate {gpt} --prompt to --max-new-tokens 5 --temperature 1e-300", (), expect="ok"),
    cli("T=1e-300: chat", "chat {llama_gguf} --max-new-tokens 5 --temperature 1e-300", (), expect="ok", stdin="hi\n"),
    cli("T=5e-324: generate", "generate {llama} --max-new-tokens 5 --temperature 5e-324", (), expect="ok"),
    py(
        "T=1e-300: qkv.complete",
        lambda p: __import__("qkv").complete(_load(p, "gpt"), "to", max_new_tokens=5, temperature=1e-300).text,
        (),
        expect="ok",
    ),  # fmt: skip
    py(
        "T=1e-300: decoding.generate",
        lambda p: __import__("qkv.decoding").decoding.generate(
            _load(p, "gpt").model, [1, 2], max_new_tokens=5, temperature=1e-300
        ),
        (),
        expect="ok",
    ),  # fmt: skip
    py(
        "T=1e-300: qkv.chat",
        lambda p: (
            __import__("qkv")
            .chat(_load(p, "llama_gguf"), [{"role": "user", "content": "hi"}], max_new_tokens=5, temperature=1e-300)
            .text
        ),
        (),
        expect="ok",
    ),  # fmt: skip
    py("T=1e-300: views.generate", _view("gpt", "generate", "to", max_new_tokens=5, temperature=1e-300), (), "ok"),
    py("T=1e-300: views.next_token", _view("gpt", "next_token", "to", temperatures=(1e-300, 1.0)), (), "ok"),
]

ALL = [*MEMORY_CASES, *SHARDS, *TINY_T]
