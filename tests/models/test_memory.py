"""The memory estimate: parameters counted without allocating equal PyTorch's count of the built model."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from qkv.errors import QkvError
from qkv.model_dir import build_model
from qkv.models import make_config
from qkv.models.memory import available_memory, check_fits, parameter_count


@pytest.mark.parametrize(
    ("preset", "changes"),
    [
        ("gpt-nano", {"vocab_size": 50, "n_layers": 5}),
        ("transformer-tiny", {"src_vocab_size": 40, "tgt_vocab_size": 40, "n_encoder_layers": 3}),
        ("rnnsearch-small", {"src_vocab_size": 30, "tgt_vocab_size": 30}),
        ("encoder-mini", {"vocab_size": 50, "n_layers": 3}),
        ("llama-micro", {"vocab_size": 50, "n_layers": 4, "n_kv_heads": 2}),
        ("word2vec", {"vocab_size": 50}),
    ],
)
def test_parameter_count_equals_the_built_models(preset, changes) -> None:
    config = make_config(preset, **changes)
    assert parameter_count(config) == sum(p.numel() for p in build_model(config).parameters())


def test_every_familys_layer_fields_are_its_configs_block_counts() -> None:
    """The fields the memory estimates scale by (each stack's blocks, the cached decoder's) are whole-number fields
    of the family's config, and a model built with one more block of each has more parameters."""
    import dataclasses

    from qkv.models.family import families

    for family in families().values():
        config = make_config(next(iter(family.presets)))
        own = {f.name: f for f in dataclasses.fields(config)}
        for name in family.layer_fields:
            assert name in own and isinstance(getattr(config, name), int), (family.name, name)
            small = dataclasses.replace(config, **{name: 1}, **({"vocab_size": 50} if "vocab_size" in own else {}))
            assert parameter_count(dataclasses.replace(small, **{name: 2})) > parameter_count(small)
        assert family.cached_layers in (*family.layer_fields, None)
        assert (family.cached_layers is not None) == (family.decode_step in ("causal", "cross")), family.name


def test_available_memory_is_positive_and_below_total() -> None:
    free = available_memory("cpu")
    assert free is not None and 0 < free
    with open("/proc/meminfo") as meminfo:
        total = int(meminfo.readline().split()[1]) * 1024
    assert free <= total


def test_check_fits_refuses_with_the_figure() -> None:
    config = make_config("gpt-nano", vocab_size=50, n_layers=10**7)
    with pytest.raises(QkvError, match=r"does not fit: its [\d,]+ parameters need [\d.]+ GiB, but cpu has"):
        check_fits(config, torch.device("cpu"))
    check_fits(make_config("gpt-nano", vocab_size=50), torch.device("cpu"), batch_size=4)  # fits: no error


def test_kv_cache_bytes_per_token_is_two_vectors_of_kv_dim_per_decoder_layer() -> None:
    from qkv.models import EncoderConfig, LlamaConfig, TransformerConfig
    from qkv.models.memory import kv_cache_bytes_per_token

    llama = LlamaConfig(d_model=64, n_heads=8, n_kv_heads=2, n_layers=3)
    assert kv_cache_bytes_per_token(llama) == 2 * 3 * (2 * 8) * 4  # a key and a value of h_kv d_k, float32
    assert kv_cache_bytes_per_token(llama.replace(n_kv_heads=8), torch.bfloat16) == 2 * 3 * 64 * 2
    assert kv_cache_bytes_per_token(TransformerConfig(d_model=32, n_heads=4, n_decoder_layers=5)) == 2 * 5 * 32 * 4
    assert kv_cache_bytes_per_token(EncoderConfig()) == 0


def test_the_activation_estimate_counts_grouped_keys_and_the_gates_tensors() -> None:
    from qkv.models import GPTConfig
    from qkv.models.memory import activation_numbers

    base = GPTConfig(vocab_size=10, d_model=64, n_heads=8, n_layers=1, d_ff=100, context_length=4)

    def per_token(config: GPTConfig) -> int:
        return activation_numbers(config, 1) // 4  # one sequence of 4 tokens

    assert per_token(base) == 16 * 64 + 2 * 100 + 3 * 8 * 4 + 3 * 10
    assert per_token(base.replace(n_kv_heads=2)) == per_token(base) - 2 * (64 - 16)
    assert per_token(base.replace(feed_forward="glu")) == per_token(base) + 2 * 100


def test_buffers_count_too_rope_tables_of_a_huge_context() -> None:
    from qkv.models.memory import model_numbers

    for config in (  # RoPE's cos and sin tables; the paper's sinusoidal table in encoder and decoder
        make_config("llama-micro", vocab_size=50, n_layers=3, context_length=96),
        make_config("transformer-tiny", src_vocab_size=40, tgt_vocab_size=40, n_encoder_layers=3),
    ):
        model = build_model(config)
        assert model_numbers(config) == (
            sum(p.numel() for p in model.parameters()),
            sum(b.numel() for b in model.buffers()),
        )
    huge = make_config("llama-micro", vocab_size=50, context_length=10**12)  # few parameters, TBs of cos/sin tables
    with pytest.raises(QkvError, match=r"and its tables of [\d,]+ numbers \(positions x head size\)"):
        check_fits(huge, torch.device("cpu"))


def test_the_kv_pool_and_the_generated_tokens_are_checked_against_memory() -> None:
    from qkv.models.memory import check_kv_pool, kv_cache_bytes_per_token, new_tokens_error

    config = make_config("gpt-nano", vocab_size=50)
    per_token = kv_cache_bytes_per_token(config)
    assert per_token == 2 * config.n_layers * config.d_model * 4
    check_kv_pool(config, 16, 64, torch.float32, "cpu")
    free = available_memory("cpu")
    rows = free // (64 * per_token) + 1
    with pytest.raises(QkvError, match=rf"the KV cache for {rows:,} sequences of 64 positions needs .* lower it"):
        check_kv_pool(config, rows, 64, torch.float32, "cpu", fix="lower it")
    assert new_tokens_error(1000) is None
    assert "max_new_tokens=1,000,000,000,000 is more tokens than memory holds" in str(new_tokens_error(10**12))


def test_counting_does_not_import_dynamo() -> None:
    """Counting builds models on the meta device, where PyTorch runs factories and initializations through Python
    references whose first call imports Dynamo: seconds added to every command that opens a model. qkv's tables
    and the memory check keep off them (and importing qkv's layers keeps off Dynamo too)."""
    code = (
        "import sys\n"
        "from qkv.models import make_config\n"
        "from qkv.models.memory import model_numbers\n"
        "import qkv.layers\n"
        "model_numbers(make_config('llama-micro', vocab_size=50, rope_scaling={'rope_type': 'llama3', 'factor': 8.0,"
        " 'low_freq_factor': 1.0, 'high_freq_factor': 4.0, 'original_max_position_embeddings': 64}))\n"
        "model_numbers(make_config('transformer-tiny', src_vocab_size=40, tgt_vocab_size=40))\n"
        "model_numbers(make_config('gpt-nano', vocab_size=50))\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False", done.stdout
