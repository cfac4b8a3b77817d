"""Llama, Qwen2 and Mistral imported into qkv's Llama family: logits and greedy generations equal Hugging Face's.

Each shape is a tiny random *ForCausalLM saved by transformers: full multi-head attention (4 key/value
heads), grouped-query (2) and multi-query (1), tied and untied W_U, RoPE bases 10000, 500000 and 1e6.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from qkv.decoding import generate
from qkv.loading import load
from qkv.model_dir import load_model_dir
from qkv.models.llama.huggingface import config_from_hf, convert_llama
from qkv.pretrained import load_pretrained, read_hf_config, read_hf_weights, save_as_qkv
from tests.pretrained.conftest import save_llama

transformers = pytest.importorskip("transformers")

# Llama 3.1's RoPE scaling, trained at 32 positions here so that the 128 tested positions are stretched.
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 32}  # fmt: skip
SHAPES = {
    "llama-mha": ("llama", dict(num_key_value_heads=4)),
    "llama-gqa-tied-theta5e5": ("llama", dict(num_key_value_heads=2, tie_word_embeddings=True, rope_theta=5e5)),
    "llama-mqa": ("llama", dict(num_key_value_heads=1)),
    "qwen2-gqa-tied-theta1e6": ("qwen2", dict(num_key_value_heads=2, tie_word_embeddings=True, rope_theta=1e6)),
    "qwen2-mqa-theta1e6": ("qwen2", dict(num_key_value_heads=1, rope_theta=1e6)),
    "mistral-gqa": ("mistral", dict(num_key_value_heads=2)),
    "llama3-rope-scaling": ("llama", dict(num_key_value_heads=2, rope_parameters=LLAMA3_ROPE)),
}
PROMPTS = ["The quick brown", "A man is", "Tokens are little pieces of"]


@pytest.fixture(scope="module", params=list(SHAPES))
def llama(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    """(folder, Hugging Face model) of one shape."""
    model_type, overrides = SHAPES[request.param]
    folder = tmp_path_factory.mktemp(request.param)
    return folder, save_llama(folder, model_type, seed=len(request.param), **overrides)


def _batch(vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    ids = torch.randint(0, vocab, (3, 24))
    mask = torch.ones_like(ids)
    mask[1, 17:] = 0  # right padding
    mask[2, 6:] = 0
    return ids, mask


def _assert_logits_match(model: torch.nn.Module, hf: torch.nn.Module) -> None:
    ids, mask = _batch(hf.config.vocab_size)
    with torch.no_grad():
        reference = hf(ids, attention_mask=mask).logits
        ours = model(ids, key_padding_mask=mask == 0)
    real = mask.bool()
    torch.testing.assert_close(ours[real], reference[real], atol=1e-4, rtol=0)


def test_config_maps_every_field(llama: tuple[Path, torch.nn.Module]) -> None:
    folder, hf = llama
    config = config_from_hf(read_hf_config(folder))
    c = hf.config
    assert config.kind == "llama"
    assert (config.vocab_size, config.d_model, config.n_heads, config.n_kv_heads, config.n_layers, config.d_ff) == (
        c.vocab_size, c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.num_hidden_layers,
        c.intermediate_size,
    )  # fmt: skip
    assert config.context_length == c.max_position_embeddings and config.layer_norm_eps == c.rms_norm_eps
    assert config.rope_base == c.rope_parameters["rope_theta"]
    assert config.tie_embeddings == c.tie_word_embeddings
    assert config.qkv_bias == (c.model_type == "qwen2") and not config.bias
    assert (config.norm, config.feed_forward, config.activation) == ("rmsnorm", "glu", "silu")
    assert config.positional == "rope"


def test_logits_match_transformers_with_padding(llama: tuple[Path, torch.nn.Module]) -> None:
    folder, hf = llama
    bundle = load_pretrained(folder)
    assert not bundle.model.training
    _assert_logits_match(bundle.model, hf)
    tied = bundle.model.unembedding.weight is bundle.model.embedding.token_embedding.weight
    assert tied == hf.config.tie_word_embeddings


def test_greedy_generation_matches_transformers(llama: tuple[Path, torch.nn.Module]) -> None:
    folder, hf = llama
    bundle = load_pretrained(folder)
    tokenizer = bundle.tokenizer
    for text in PROMPTS:
        prompt = torch.tensor([([tokenizer.bos_id] if tokenizer.bos_id is not None else []) + tokenizer.encode(text)])
        reference = hf.generate(
            prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=20,
            eos_token_id=tokenizer.eos_id, pad_token_id=tokenizer.eos_id,
        )  # fmt: skip
        ours = generate(bundle.model, prompt, max_new_tokens=20, temperature=0.0, eos_id=tokenizer.eos_id)
        assert ours.tolist() == reference.tolist()


def test_command_line_loader_gives_the_same_model(llama: tuple[Path, torch.nn.Module]) -> None:
    folder, hf = llama
    bundle = load(str(folder))
    assert bundle.config.kind == "llama"
    _assert_logits_match(bundle.model, hf)


def test_tokenizer_roles(llama: tuple[Path, torch.nn.Module]) -> None:
    """Llama: bos <s>, eos </s>, unk <unk> (tokenizer_config.json); Qwen2: no bos, eos = pad = <|endoftext|>."""
    from tokenizers import Tokenizer

    folder, hf = llama
    tokenizer = load_pretrained(folder).tokenizer
    if hf.config.model_type == "qwen2":
        assert tokenizer.bos_id is None and tokenizer.eos_id == tokenizer.pad_id == 0 and tokenizer.unk_id is None
    else:
        assert (tokenizer.unk_id, tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id) == (0, 1, 2, None)
    reference = Tokenizer.from_file(str(folder / "tokenizer.json"))
    for text in PROMPTS:
        assert tokenizer.encode(text) == reference.encode(text, add_special_tokens=False).ids
        assert tokenizer.decode(tokenizer.encode(text)) == text


def test_roles_from_config_json_without_tokenizer_config(tmp_path: Path) -> None:
    hf = save_llama(tmp_path, "llama", seed=3)
    (tmp_path / "tokenizer_config.json").unlink()
    tokenizer = load_pretrained(tmp_path).tokenizer
    assert (tokenizer.bos_id, tokenizer.eos_id) == (hf.config.bos_token_id, hf.config.eos_token_id) == (1, 2)


def test_sharded_safetensors(tmp_path: Path) -> None:
    hf = save_llama(tmp_path / "one", "qwen2", seed=4, num_key_value_heads=2, rope_theta=1e6)
    hf.save_pretrained(tmp_path / "sharded", max_shard_size="50KB")
    shards = json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())["weight_map"]
    assert len(set(shards.values())) > 1
    model = convert_llama(read_hf_weights(tmp_path / "sharded"), read_hf_config(tmp_path / "sharded")).eval()
    _assert_logits_match(model, hf)


def test_transformers_4_config_form(tmp_path: Path) -> None:
    """config.json as transformers 4 writes it (and as the Hub's Llama / Qwen2 files are): rope_theta at the
    top level and rope_scaling null, instead of transformers 5's rope_parameters."""
    save_llama(tmp_path, "llama", seed=5, num_key_value_heads=2, rope_theta=5e5)
    config = json.loads((tmp_path / "config.json").read_text())
    config["rope_theta"] = config.pop("rope_parameters")["rope_theta"]
    config["rope_scaling"] = None
    (tmp_path / "config.json").write_text(json.dumps(config))
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    bundle = load_pretrained(tmp_path)
    assert bundle.config.rope_base == 5e5 == hf.config.rope_parameters["rope_theta"]
    _assert_logits_match(bundle.model, hf)


def test_rope_base_matters(tmp_path: Path) -> None:
    """The parity tests can fail: the same weights read with the default RoPE base give other logits."""
    hf = save_llama(tmp_path, "qwen2", seed=6, num_key_value_heads=2, rope_theta=1e6)
    config = read_hf_config(tmp_path)
    config["rope_parameters"]["rope_theta"] = 10000.0
    model = convert_llama(read_hf_weights(tmp_path), config).eval()
    with pytest.raises(AssertionError):
        _assert_logits_match(model, hf)


def test_save_as_qkv_reloads(tmp_path: Path) -> None:
    save_llama(tmp_path / "hf", "qwen2", seed=7, num_key_value_heads=1, tie_word_embeddings=True, rope_theta=1e6)
    bundle = load_pretrained(tmp_path / "hf")
    save_as_qkv(bundle, tmp_path / "qkv")
    again = load_model_dir(tmp_path / "qkv")
    assert again.config == bundle.config and again.tokenizer.eos_id == bundle.tokenizer.eos_id
    ids, _ = _batch(bundle.config.vocab_size)
    with torch.no_grad():
        torch.testing.assert_close(again.model(ids), bundle.model(ids))


def test_old_checkpoint_with_inv_freq_buffers(tmp_path: Path) -> None:
    """Checkpoints from older transformers store RoPE's inv_freq per layer; it is recomputed, not read."""
    hf = save_llama(tmp_path / "hf", "llama", seed=8)
    state = read_hf_weights(tmp_path / "hf")
    for i in range(hf.config.num_hidden_layers):
        state[f"model.layers.{i}.self_attn.rotary_emb.inv_freq"] = torch.zeros(8)
    model = convert_llama(state, read_hf_config(tmp_path / "hf")).eval()
    _assert_logits_match(model, hf)


def test_missing_tokenizer_json(tmp_path: Path) -> None:
    from qkv.errors import QkvError

    save_llama(tmp_path, "llama", seed=9)
    shutil.move(tmp_path / "tokenizer.json", tmp_path / "elsewhere.json")
    with pytest.raises(QkvError, match="has no tokenizer.json: .* download the model's tokenizer.json"):
        load_pretrained(tmp_path)


def test_qkv_generate_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`qkv generate --model DIR` as a user types it: greedy text equal to transformers' tokens, decoded."""
    from qkv.cli import main

    hf = save_llama(tmp_path, "qwen2", seed=10, num_key_value_heads=2, rope_theta=1e6)
    tokenizer = load_pretrained(tmp_path).tokenizer
    prompt = torch.tensor([tokenizer.encode("A man is")])
    reference = hf.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=12,
                            eos_token_id=tokenizer.eos_id, pad_token_id=tokenizer.eos_id)  # fmt: skip
    code = main(["generate", "--model", str(tmp_path), "--prompt", "A man is", "--temperature", "0",
                 "--max-new-tokens", "12"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    assert out.rstrip("\n") == tokenizer.decode(reference[0].tolist())
