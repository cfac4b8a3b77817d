"""Quantizing whole models: every linear layer becomes int8 (or int4, the unembedding int8), ties survive,
outputs stay close to float32, and a quantized model folder loads without the original (and refuses to be
mixed up with a float one)."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from safetensors import safe_open

from qkv.errors import QkvError
from qkv.model_dir import MODEL_FILE, QUANTIZATION_FILE, load_model_dir, save_model_dir
from qkv.models import GPT, Encoder, EncoderConfig, GPTConfig, Transformer, TransformerConfig
from qkv.quantization import (
    apply_quantization,
    check_scheme,
    is_quantized,
    quantization_info,
    quantization_scheme,
    quantize_model,
    scheme_for_bits,
    weight_bytes,
)
from qkv.quantization.int4_linear import Int4Linear
from qkv.quantization.int8_embedding import Int8TokenEmbedding
from qkv.quantization.int8_linear import Int8Linear
from qkv.quantization.save import save_quantized
from qkv.tokenizers import train_tokenizer

TEXT = "the quick brown fox jumps over the lazy dog"
SMALL = dict(d_model=64, n_heads=4, context_length=32)


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def linears(model: torch.nn.Module) -> list[str]:
    return [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]


@pytest.fixture
def tokenizer():
    return train_tokenizer("char", TEXT)


@pytest.mark.parametrize("tie", [True, False])
def test_gpt_every_linear_becomes_int8_and_logits_stay_close(tie) -> None:
    model = GPT(GPTConfig(vocab_size=80, n_layers=2, tie_embeddings=tie, **SMALL)).eval()
    names = linears(model)
    ids = torch.randint(0, 80, (2, 12))
    with torch.no_grad():
        before = model(ids)
        quantized = quantize_model(copy.deepcopy(model))
        after = quantized(ids)
    assert len(names) == 12 and all(isinstance(quantized.get_submodule(n), Int8Linear) for n in names)
    assert isinstance(quantized.unembedding, Int8Linear)
    assert all(quantized.get_submodule(n).group_size == 32 for n in names)  # the default where widths allow
    embedding = quantized.embedding.token_embedding
    assert isinstance(embedding, Int8TokenEmbedding) == tie  # an untied lookup stays float32
    if tie:
        assert embedding.qweight is quantized.unembedding.qweight
    assert relative_error(after, before) < 0.03  # int8 weights: about 1% per layer on random weights
    scales = sum(m.weight_scale.numel() for m in quantized.modules() if isinstance(m, Int8Linear))
    assert quantized.num_parameters() == model.num_parameters() + scales


@pytest.mark.parametrize("group_size", [0, 32])
def test_decoding_with_the_cache_equals_decoding_without_it_after_quantization(group_size: int) -> None:
    from qkv.decoding import generate

    model = quantize_model(GPT(GPTConfig(vocab_size=80, n_layers=2, **SMALL)), group_size=group_size)
    prompt = torch.randint(0, 80, (1, 5))
    cached = generate(model, prompt, max_new_tokens=12, temperature=0.0)
    uncached = generate(model, prompt, max_new_tokens=12, temperature=0.0, use_cache=False)
    assert torch.equal(cached, uncached)


def test_encoder_and_translator_quantize_too() -> None:
    encoder = Encoder(EncoderConfig(vocab_size=60, n_layers=2, **SMALL)).eval()
    ids = torch.randint(0, 60, (3, 9))
    with torch.no_grad():
        before = encoder.embed(ids)
        after = quantize_model(copy.deepcopy(encoder)).embed(ids)
    assert torch.nn.functional.cosine_similarity(before, after).min() > 0.99

    config = TransformerConfig(src_vocab_size=50, tgt_vocab_size=50, n_encoder_layers=2, n_decoder_layers=2,
                               share_embeddings=True, final_logits_bias=True, **SMALL)  # fmt: skip
    translator = Transformer(config).eval()
    src, tgt = torch.randint(0, 50, (2, 8)), torch.randint(0, 50, (2, 6))
    with torch.no_grad():
        before = translator(src, tgt)
        quantized = quantize_model(copy.deepcopy(translator))
        after = quantized(src, tgt)
    shared = quantized.src_embedding.token_embedding
    assert shared is quantized.tgt_embedding.token_embedding and isinstance(shared, Int8TokenEmbedding)
    assert shared.qweight is quantized.unembedding.qweight  # one int8 matrix for W_E (both sides) and W_U
    assert quantized.unembedding.bias is not None  # Marian's logits bias is kept
    assert relative_error(after, before) < 0.03


def test_weights_take_a_quarter_of_the_memory() -> None:
    model = GPT(GPTConfig(vocab_size=512, n_layers=2, d_model=128, n_heads=4, context_length=16))
    before = weight_bytes(model)
    per_row = weight_bytes(quantize_model(copy.deepcopy(model), group_size=0))
    assert 3.5 < before / per_row < 4.0  # int8 matrices, float32 positions, norms, biases and scales
    grouped = weight_bytes(quantize_model(model))  # the default: a float32 scale per 32 weights, 1 + 4/32 bytes each
    assert 3.0 < before / grouped < 4.0 / 1.125 < before / per_row


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_int8_layers_take_groups_of_32_by_default_where_every_width_allows(scheme) -> None:
    def int8_sizes(config: GPTConfig, **kwargs) -> set[int]:
        quantized = quantize_model(GPT(config), scheme, **kwargs)
        return {m.group_size for m in quantized.modules() if isinstance(m, Int8Linear)}

    assert int8_sizes(GPTConfig(vocab_size=40, n_layers=1, **SMALL)) == {32}
    assert int8_sizes(GPTConfig(vocab_size=40, n_layers=1, **SMALL), **{"int8_group_size" if scheme == "int4"
                                                                         else "group_size": 0}) == {0}  # fmt: skip
    if scheme == "int8":  # a width of 48 (and d_ff 192): one scale per row, where groups of 32 would be refused
        assert int8_sizes(GPTConfig(vocab_size=40, n_layers=1, d_model=48, n_heads=4, context_length=16)) == {0}
        assert int8_sizes(GPTConfig(vocab_size=40, n_layers=1, d_model=96, n_heads=4, context_length=16)) == {32}


def test_quantizing_twice_changes_nothing() -> None:
    model = quantize_model(GPT(GPTConfig(vocab_size=40, n_layers=1, **SMALL)))
    state = {k: v.clone() for k, v in model.state_dict().items()}
    quantize_model(model)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())


def test_unknown_schemes_are_refused() -> None:
    assert check_scheme("int8") == "int8" and check_scheme("int4") == "int4"
    with pytest.raises(QkvError, match="'int3' is not a quantization scheme qkv has: use int8 .* or int4"):
        quantize_model(GPT(GPTConfig(vocab_size=40, n_layers=1, **SMALL)), "int3")


def test_a_quantized_folder_loads_without_the_original(tmp_path, tokenizer) -> None:
    model = GPT(GPTConfig(vocab_size=tokenizer.vocab_size, n_layers=2, **SMALL)).eval()
    save_model_dir(tmp_path / "float", model, tokenizer)
    bundle = load_model_dir(tmp_path / "float")
    save_quantized(bundle, tmp_path / "int8")
    info = json.loads((tmp_path / "int8" / QUANTIZATION_FILE).read_text())
    assert info["scheme"] == "int8" and info == quantization_info(bundle.model)
    with safe_open(str(tmp_path / "int8" / MODEL_FILE), framework="pt") as f:
        assert f.metadata()["quantization"] == "int8"
        assert f.get_tensor("decoder.blocks.0.feed_forward.linear1.qweight").dtype == torch.int8
        assert "unembedding.qweight" not in f.keys()  # tied to the embedding: stored once
    size = lambda name: (tmp_path / name / MODEL_FILE).stat().st_size  # noqa: E731
    assert size("float") / size("int8") > 3

    (tmp_path / "float" / MODEL_FILE).unlink()  # the original is gone
    again = load_model_dir(tmp_path / "int8")
    assert is_quantized(again.model)
    ids = torch.randint(0, tokenizer.vocab_size, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(again.model(ids), bundle.model(ids))


def test_mixed_up_files_are_named(tmp_path, tokenizer) -> None:
    model = GPT(GPTConfig(vocab_size=tokenizer.vocab_size, n_layers=1, **SMALL))
    save_model_dir(tmp_path / "float", model, tokenizer)
    save_quantized(load_model_dir(tmp_path / "float"), tmp_path / "int8")
    description = (tmp_path / "int8" / QUANTIZATION_FILE).read_text()

    (tmp_path / "int8" / QUANTIZATION_FILE).unlink()
    with pytest.raises(QkvError, match="holds int8 weights written by `qkv quantize`, but no quantization.json"):
        load_model_dir(tmp_path / "int8")
    (tmp_path / "float" / QUANTIZATION_FILE).write_text(description)
    with pytest.raises(QkvError, match="holds float weights, but quantization.json describes an int8 model"):
        load_model_dir(tmp_path / "float")
    save_model_dir(tmp_path / "float", model, tokenizer)  # saving a float model removes the stale description
    assert not (tmp_path / "float" / QUANTIZATION_FILE).exists()


def test_bad_descriptions_are_named(tokenizer) -> None:
    model = GPT(GPTConfig(vocab_size=40, n_layers=1, **SMALL))
    good = quantization_info(quantize_model(copy.deepcopy(model)))
    with pytest.raises(QkvError, match="is not a qkv quantization description"):
        apply_quantization(copy.deepcopy(model), {"modules": "all"})
    with pytest.raises(QkvError, match="which this qkv cannot read: upgrade qkv"):
        apply_quantization(copy.deepcopy(model), {**good, "scheme": "int2"})
    with pytest.raises(QkvError, match="names a layer decoder.blocks.7.self_attn.query that the model"):
        apply_quantization(copy.deepcopy(model), {**good, "modules": ["decoder.blocks.7.self_attn.query"]})
    with pytest.raises(QkvError, match="is a LayerNorm, not a linear layer"):
        apply_quantization(copy.deepcopy(model), {**good, "modules": ["decoder.final_norm"]})


def test_the_output_folder_is_checked_before_anything_is_written(tmp_path, tokenizer) -> None:
    model = GPT(GPTConfig(vocab_size=tokenizer.vocab_size, n_layers=1, **SMALL))
    save_model_dir(tmp_path / "run", model, tokenizer)
    bundle = load_model_dir(tmp_path / "run")
    with pytest.raises(QkvError, match="is the model itself"):
        save_quantized(bundle, tmp_path / "run")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(QkvError, match="already holds other files"):
        save_quantized(bundle, tmp_path / "busy")
    (tmp_path / "training" / "checkpoints").mkdir(parents=True)
    with pytest.raises(QkvError, match="holds a training run"):
        save_quantized(bundle, tmp_path / "training")
    assert not is_quantized(bundle.model)  # nothing happened
    save_quantized(bundle, tmp_path / "int8")
    with pytest.raises(QkvError, match="is quantized already"):
        save_quantized(load_model_dir(tmp_path / "int8"), tmp_path / "again")


def trained_llama(tokenizer, text: str, steps: int = 40) -> torch.nn.Module:
    """A tiny Llama trained on ``text`` for a few steps, so that its next-token choices are confident."""
    from qkv.models import LlamaConfig
    from qkv.models.llama import Llama

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=tokenizer.vocab_size, n_layers=2, d_model=64, n_heads=4, n_kv_heads=2,
                         context_length=32)  # fmt: skip
    model = Llama(config)
    ids = torch.tensor(tokenizer.encode(text))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny products: one thread is several times faster on a busy machine
    try:
        for _ in range(steps):
            starts = torch.randint(0, len(ids) - 33, (16,))
            batch = torch.stack([ids[s : s + 33] for s in starts.tolist()])  # (16, 33)
            logits = model(batch[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    finally:
        torch.set_num_threads(threads)
    return model.eval()


def test_int4_llama_keeps_the_greedy_tokens_of_float(tokenizer) -> None:
    """Teacher-forced: at every position of a held text, the int4 model's top token is the float model's."""
    text = " ".join([TEXT, TEXT.upper(), TEXT[::-1]] * 20)
    model = trained_llama(tokenizer, text)
    quantized = quantize_model(copy.deepcopy(model), "int4")
    assert all(isinstance(quantized.get_submodule(n), Int4Linear) for n in linears(model))
    assert isinstance(quantized.unembedding, Int8Linear)  # W_U stays 8-bit
    ids = torch.tensor(tokenizer.encode(text[5:])[:128]).view(4, 32)  # (4, 32): windows of the context
    with torch.no_grad():
        before, after = model(ids), quantized(ids)
    agreement = float((before.argmax(-1) == after.argmax(-1)).float().mean())
    assert agreement > 0.9 and relative_error(after, before) < 0.1


def test_int4_keeps_ties_and_takes_a_sixth_of_the_bytes() -> None:
    model = GPT(GPTConfig(vocab_size=512, n_layers=2, d_model=128, n_heads=4, context_length=16, tie_embeddings=True))
    before = weight_bytes(model)
    quantized = quantize_model(copy.deepcopy(model), "int4", group_size=64)
    embedding = quantized.embedding.token_embedding
    assert isinstance(embedding, Int8TokenEmbedding) and embedding.qweight is quantized.unembedding.qweight
    assert quantized.decoder.blocks[0].feed_forward.linear1.group_size == 64
    linear_bytes = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear)) * 4
    int4_bytes = sum(t.numel() * t.element_size() for n, t in quantized.state_dict().items() if "decoder" in n
                     and ("qweight" in n or "weight_scale" in n or "weight_min" in n))  # fmt: skip
    assert 5.5 < linear_bytes / int4_bytes < 7.2  # 4 + 32 / 64 bits per weight
    assert before / weight_bytes(quantized) > 3.5  # with the int8 W_U and float32 norms and positions


def test_an_int4_folder_loads_without_the_original(tmp_path, tokenizer) -> None:
    model = GPT(GPTConfig(vocab_size=tokenizer.vocab_size, n_layers=2, **SMALL)).eval()
    save_model_dir(tmp_path / "float", model, tokenizer)
    bundle = load_model_dir(tmp_path / "float")
    save_quantized(bundle, tmp_path / "int4", "int4")
    info = json.loads((tmp_path / "int4" / QUANTIZATION_FILE).read_text())
    assert info == quantization_info(bundle.model)
    assert info["scheme"] == "int4" and info["group_size"] == 32 and info["int8_modules"] == ["unembedding"]
    assert len(info["modules"]) == 12
    with safe_open(str(tmp_path / "int4" / MODEL_FILE), framework="pt") as f:
        assert f.metadata()["quantization"] == "int4"
        assert f.get_tensor("decoder.blocks.0.feed_forward.linear1.qweight").dtype == torch.uint8
        assert f.get_tensor("decoder.blocks.0.feed_forward.linear1.weight_min").dtype == torch.float16
    (tmp_path / "float" / MODEL_FILE).unlink()
    again = load_model_dir(tmp_path / "int4")
    assert quantization_scheme(again.model) == "int4"
    ids = torch.randint(0, tokenizer.vocab_size, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(again.model(ids), bundle.model(ids), rtol=0, atol=0)
    # An int8 description beside int4 weights (or the reverse) is named, not loaded wrongly.
    int8_info = {**info, "scheme": "int8"}
    (tmp_path / "int4" / QUANTIZATION_FILE).write_text(json.dumps(int8_info))
    with pytest.raises(QkvError, match="holds int4 weights, but quantization.json describes an int8 model"):
        load_model_dir(tmp_path / "int4")


def test_a_group_size_the_widths_do_not_divide_is_refused_before_anything_changes() -> None:
    model = GPT(GPTConfig(vocab_size=40, n_layers=1, d_model=96, n_heads=4, context_length=16))
    with pytest.raises(QkvError, match=r"layer decoder.blocks.0.self_attn.query has 96 inputs, not a multiple of "
                       r"the group size 64: use --group-size 32$"):  # fmt: skip
        quantize_model(model, "int4", group_size=64)
    with pytest.raises(QkvError, match="group size 48: int4 groups hold 32, 64, 128, 256 weights"):
        quantize_model(model, "int4", group_size=48)
    assert not is_quantized(model)
    with pytest.raises(QkvError, match=r"--bits 3: qkv quantizes to 8 bits .* use --bits 8 or --bits 4"):
        scheme_for_bits(3)


def test_an_int8_folder_in_groups_records_them_and_loads_back_exactly(tmp_path, tokenizer) -> None:
    model = GPT(GPTConfig(vocab_size=tokenizer.vocab_size, n_layers=2, **SMALL)).eval()
    save_model_dir(tmp_path / "float", model, tokenizer)
    bundle = load_model_dir(tmp_path / "float")
    save_quantized(bundle, tmp_path / "int8", group_size=32)
    info = json.loads((tmp_path / "int8" / QUANTIZATION_FILE).read_text())
    assert info == quantization_info(bundle.model)
    assert info["scheme"] == "int8" and info["int8_group_size"] == 32 and "group of 32 weights" in info["description"]
    assert all(m.group_size == 32 for m in bundle.model.modules() if isinstance(m, Int8Linear))
    with safe_open(str(tmp_path / "int8" / MODEL_FILE), framework="pt") as f:
        assert f.get_tensor("decoder.blocks.0.feed_forward.linear1.weight_scale").shape == (4 * 64, 64 // 32)
    (tmp_path / "float" / MODEL_FILE).unlink()
    again = load_model_dir(tmp_path / "int8")
    assert isinstance(again.model.embedding.token_embedding, Int8TokenEmbedding)  # the tie kept, grouped
    ids = torch.randint(0, tokenizer.vocab_size, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(again.model(ids), bundle.model(ids), rtol=0, atol=0)
    per_row = quantization_info(quantize_model(GPT(GPTConfig(vocab_size=40, n_layers=1, **SMALL)), group_size=0))
    assert "int8_group_size" not in per_row  # per row: the key is left out, as older folders have it


def test_the_int4_schemes_int8_layers_take_groups_when_asked(tmp_path, tokenizer) -> None:
    model = GPT(GPTConfig(vocab_size=tokenizer.vocab_size, n_layers=1, **SMALL)).eval()
    save_model_dir(tmp_path / "float", model, tokenizer)
    plain = quantize_model(copy.deepcopy(model), "int4", int8_group_size=0)
    assert plain.unembedding.group_size == 0 and "int8_group_size" not in quantization_info(plain)
    bundle = load_model_dir(tmp_path / "float")
    save_quantized(bundle, tmp_path / "int4", "int4", int8_group_size=32)
    info = json.loads((tmp_path / "int4" / QUANTIZATION_FILE).read_text())
    assert info["int8_modules"] == ["unembedding"] and info["int8_group_size"] == 32 and info["group_size"] == 32
    again = load_model_dir(tmp_path / "int4")
    assert again.model.unembedding.group_size == 32
    ids = torch.randint(0, tokenizer.vocab_size, (1, 7))
    with torch.no_grad():
        torch.testing.assert_close(again.model(ids), bundle.model(ids), rtol=0, atol=0)


def test_bad_int8_group_sizes_are_refused_before_anything_changes() -> None:
    model = GPT(GPTConfig(vocab_size=40, n_layers=1, d_model=96, n_heads=4, context_length=16))
    with pytest.raises(QkvError, match=r"layer decoder.blocks.0.self_attn.query has 96 inputs, not a multiple of "
                       r"the int8 group size 64: use --group-size 32 or 96$"):  # fmt: skip
        quantize_model(model, "int8", group_size=64)
    for bad in (48, -32, 1):
        with pytest.raises(QkvError, match=f"int8 group size {bad}: int8 groups hold a multiple of 32 weights"):
            quantize_model(model, "int8", group_size=bad)
    with pytest.raises(QkvError, match="int8 group size 40"):
        quantize_model(model, "int4", int8_group_size=40)
    assert not is_quantized(model)
    good = quantization_info(quantize_model(copy.deepcopy(model), "int8", group_size=32))
    with pytest.raises(QkvError, match="says int8_group_size 7, which is not a multiple of 32"):
        apply_quantization(copy.deepcopy(model), {**good, "int8_group_size": 7})
    mixed = quantize_model(copy.deepcopy(model), "int8", group_size=32)
    mixed.unembedding = Int8Linear.from_float(mixed.unembedding.weight)  # one layer per row among groups
    with pytest.raises(QkvError, match="mix scales per row and per group"):
        quantization_info(mixed)
