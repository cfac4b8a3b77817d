"""The model folder (config.json + tokenizer.json + model.safetensors): round trips, ties, and every bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

import qkv.model_dir
import qkv.storage
from qkv.errors import QkvError
from qkv.model_dir import (
    CONFIG_FILE,
    MODEL_FILE,
    TARGET_TOKENIZER_FILE,
    TOKENIZER_FILE,
    build_model,
    load_model_dir,
    load_weights,
    save_model_dir,
    save_weights,
)
from qkv.models import GPT, Encoder, EncoderConfig, GPTConfig, Transformer, TransformerConfig
from qkv.tokenizers import train_tokenizer

TEXT = "the quick brown fox jumps over the lazy dog"
TINY = dict(d_model=16, n_heads=2, dropout=0.1)


@pytest.fixture
def tokenizer():
    return train_tokenizer("char", TEXT)


def gpt_config(vocab_size: int, **changes) -> GPTConfig:
    return GPTConfig(**{"vocab_size": vocab_size, "n_layers": 2, "context_length": 16, **TINY, **changes})


def file_keys(path: Path) -> set[str]:
    with safe_open(str(path), framework="pt") as f:
        return set(f.keys())


def ids(vocab_size: int, length: int = 7) -> torch.Tensor:
    return torch.randint(4, vocab_size, (2, length))


def test_build_model_dispatches_on_the_config():
    assert type(build_model(gpt_config(20))) is GPT
    assert type(build_model(EncoderConfig(vocab_size=20, n_layers=1, **TINY))) is Encoder
    assert type(build_model(TransformerConfig(n_encoder_layers=1, n_decoder_layers=1, **TINY))) is Transformer


def test_tied_weights_are_stored_once_and_stay_tied(tmp_path):
    model = GPT(gpt_config(20))
    assert model.unembedding.weight is model.embedding.token_embedding.weight
    save_weights(model, tmp_path / MODEL_FILE)
    keys = file_keys(tmp_path / MODEL_FILE)
    assert "embedding.token_embedding.weight" in keys
    assert "unembedding.weight" not in keys
    assert keys == set(model.state_dict()) - {"unembedding.weight"}

    fresh = GPT(gpt_config(20))
    load_weights(fresh, tmp_path / MODEL_FILE)
    assert fresh.unembedding.weight is fresh.embedding.token_embedding.weight
    assert torch.equal(fresh.unembedding.weight, model.embedding.token_embedding.weight)
    with torch.no_grad():  # still one tensor: a change through one name shows through the other
        fresh.embedding.token_embedding.weight[0, 0] = 123.0
    assert fresh.unembedding.weight[0, 0] == 123.0


def test_shared_source_and_target_embeddings_are_stored_once(tmp_path):
    config = TransformerConfig(n_encoder_layers=1, n_decoder_layers=1, share_embeddings=True, **TINY)
    model = Transformer(config)
    save_weights(model, tmp_path / MODEL_FILE)
    keys = file_keys(tmp_path / MODEL_FILE)
    assert "src_embedding.token_embedding.weight" in keys
    assert not keys & {"tgt_embedding.token_embedding.weight", "unembedding.weight"}
    fresh = Transformer(config)
    load_weights(fresh, tmp_path / MODEL_FILE)
    assert fresh.tgt_embedding.token_embedding.weight is fresh.src_embedding.token_embedding.weight
    assert fresh.unembedding.weight is fresh.src_embedding.token_embedding.weight
    assert torch.equal(fresh.unembedding.weight, model.unembedding.weight)


def test_untied_weights_are_both_stored(tmp_path):
    model = GPT(gpt_config(20, tie_embeddings=False))
    save_weights(model, tmp_path / MODEL_FILE)
    assert {"embedding.token_embedding.weight", "unembedding.weight"} <= file_keys(tmp_path / MODEL_FILE)


def test_tied_file_fills_an_untied_model_from_the_shared_tensor(tmp_path):
    tied = GPT(gpt_config(20))
    save_weights(tied, tmp_path / MODEL_FILE)
    untied = load_weights(GPT(gpt_config(20, tie_embeddings=False)), tmp_path / MODEL_FILE)
    assert untied.unembedding.weight is not untied.embedding.token_embedding.weight
    assert torch.equal(untied.unembedding.weight, tied.embedding.token_embedding.weight)


def test_metadata_names_format_and_model(tmp_path):
    save_weights(Encoder(EncoderConfig(vocab_size=20, n_layers=1, **TINY)), tmp_path / MODEL_FILE)
    with safe_open(str(tmp_path / MODEL_FILE), framework="pt") as f:
        metadata = f.metadata()
    assert metadata["format"] == "qkv" and metadata["model"] == "encoder"


def run_gpt(model, n):
    return model(ids(n))


def run_encoder(model, n):
    return model(ids(n), padding_mask=torch.tensor([[False] * 5 + [True] * 2] * 2))


def run_transformer(model, n):
    return model(ids(n, 6), ids(n, 5))


@pytest.mark.parametrize(
    ("make", "run"),
    [
        (lambda n: GPTConfig(vocab_size=n, n_layers=2, context_length=16, **TINY), run_gpt),
        (
            lambda n: EncoderConfig(vocab_size=n, n_layers=2, type_vocab_size=2, embedding_norm=True, **TINY),
            run_encoder,
        ),
        (
            lambda n: TransformerConfig(
                src_vocab_size=n,
                tgt_vocab_size=n,
                n_encoder_layers=1,
                n_decoder_layers=2,
                positional="sinusoidal",
                final_logits_bias=True,
                **TINY,
            ),
            run_transformer,
        ),
    ],
    ids=["gpt", "encoder", "transformer"],
)
def test_model_dir_round_trip_gives_identical_outputs(tmp_path, tokenizer, make, run):
    model = build_model(make(tokenizer.vocab_size)).eval()
    with torch.no_grad():
        for parameter in model.parameters():  # make every tensor (even biases that start at zero) matter
            parameter.add_(0.01 * torch.randn_like(parameter))
    save_model_dir(tmp_path / "run", model, tokenizer)
    assert {p.name for p in (tmp_path / "run").iterdir()} == {CONFIG_FILE, TOKENIZER_FILE, MODEL_FILE}

    bundle = load_model_dir(tmp_path / "run")
    assert bundle.config == model.config
    assert bundle.tokenizer == tokenizer and bundle.target_tokenizer is None
    assert bundle.path == tmp_path / "run"
    assert not bundle.model.training
    assert type(bundle.model) is type(model)
    torch.manual_seed(1)
    expected = run(model, tokenizer.vocab_size)
    torch.manual_seed(1)
    assert torch.equal(run(bundle.model, tokenizer.vocab_size), expected)


def test_transformer_with_a_target_tokenizer(tmp_path, tokenizer):
    target = train_tokenizer("word", "le renard brun saute par dessus le chien")
    config = TransformerConfig(
        src_vocab_size=tokenizer.vocab_size,
        tgt_vocab_size=target.vocab_size,
        n_encoder_layers=1,
        n_decoder_layers=1,
        **TINY,
    )
    save_model_dir(tmp_path, Transformer(config), tokenizer, target)
    bundle = load_model_dir(tmp_path)
    assert bundle.target_tokenizer == target

    other = train_tokenizer("word", "ein ganz anderes vokabular mit mehr oder weniger wörtern als das andere hier")
    assert other.vocab_size != target.vocab_size
    other.save(tmp_path / TARGET_TOKENIZER_FILE)
    with pytest.raises(QkvError, match=rf"tokenizer_target.json has {other.vocab_size} tokens .*tgt_vocab_size="):
        load_model_dir(tmp_path)


def test_saving_without_a_target_tokenizer_removes_a_stale_one(tmp_path, tokenizer):
    n = tokenizer.vocab_size
    config = TransformerConfig(src_vocab_size=n, tgt_vocab_size=n, n_encoder_layers=1, n_decoder_layers=1, **TINY)
    save_model_dir(tmp_path, Transformer(config), tokenizer, tokenizer)
    save_model_dir(tmp_path, Transformer(config), tokenizer)
    assert not (tmp_path / TARGET_TOKENIZER_FILE).exists()
    assert load_model_dir(tmp_path).target_tokenizer is None


def test_tokenizer_and_config_vocab_mismatch_names_both_numbers(tmp_path, tokenizer):
    save_model_dir(tmp_path, GPT(gpt_config(tokenizer.vocab_size)), tokenizer)
    bigger = train_tokenizer("char", TEXT + " XYZ")
    bigger.save(tmp_path / TOKENIZER_FILE)
    message = (
        f"tokenizer.json has {bigger.vocab_size} tokens but config.json says vocab_size={tokenizer.vocab_size}: "
        "the files come from different runs"
    )
    with pytest.raises(QkvError, match=message):
        load_model_dir(tmp_path)


def test_saving_a_mismatched_tokenizer_is_refused(tmp_path, tokenizer):
    with pytest.raises(QkvError, match=f"has {tokenizer.vocab_size} tokens but config.json says vocab_size=50"):
        save_model_dir(tmp_path, GPT(gpt_config(50)), tokenizer)
    assert not any(tmp_path.iterdir())


def test_missing_directory(tmp_path):
    with pytest.raises(QkvError, match="nowhere does not exist"):
        load_model_dir(tmp_path / "nowhere")


def test_directory_without_config_is_not_a_run_directory(tmp_path):
    with pytest.raises(QkvError, match=r"is not a qkv run directory \(no config.json\): give the folder `qkv train`"):
        load_model_dir(tmp_path)


def test_run_directory_without_weights_or_tokenizer(tmp_path, tokenizer):
    save_model_dir(tmp_path, GPT(gpt_config(tokenizer.vocab_size)), tokenizer)
    (tmp_path / MODEL_FILE).unlink()
    with pytest.raises(QkvError, match="model.safetensors in .* does not exist"):
        load_model_dir(tmp_path)
    (tmp_path / TOKENIZER_FILE).unlink()
    with pytest.raises(QkvError, match="has no tokenizer.json"):
        load_model_dir(tmp_path)


def test_invalid_config_names_the_file(tmp_path, tokenizer):
    save_model_dir(tmp_path, GPT(gpt_config(tokenizer.vocab_size)), tokenizer)
    data = json.loads((tmp_path / CONFIG_FILE).read_text())
    (tmp_path / CONFIG_FILE).write_text(json.dumps({**data, "n_heads": 3}))
    with pytest.raises(QkvError, match=r"config.json in .*d_model=16 is not divisible by n_heads=3"):
        load_model_dir(tmp_path)


def test_truncated_weights_are_reported_and_explained(tmp_path, tokenizer):
    save_model_dir(tmp_path, GPT(gpt_config(tokenizer.vocab_size)), tokenizer)
    data = (tmp_path / MODEL_FILE).read_bytes()
    (tmp_path / MODEL_FILE).write_bytes(data[: len(data) // 2])
    with pytest.raises(QkvError, match=r"model.safetensors in .* is damaged or truncated \(.*\): restore it") as error:
        load_model_dir(tmp_path)
    assert str(tmp_path / "checkpoints") in str(error.value)
    (tmp_path / MODEL_FILE).write_bytes(data[:5])  # not even a whole header length
    with pytest.raises(QkvError, match="damaged or truncated"):
        load_model_dir(tmp_path)


def test_shape_mismatch_names_the_tensor_and_both_shapes(tmp_path):
    save_weights(GPT(gpt_config(20)), tmp_path / MODEL_FILE)
    longer = GPT(gpt_config(20, context_length=32))
    with pytest.raises(
        QkvError, match=r"embedding.positional_encoding.weight .* shape \[16, 16\] .* expects \[32, 16\]"
    ):
        load_weights(longer, tmp_path / MODEL_FILE)


def test_missing_and_unexpected_tensors_are_named(tmp_path):
    save_weights(GPT(gpt_config(20)), tmp_path / MODEL_FILE)
    with pytest.raises(QkvError, match=r"lacks \d+ tensor\(s\) .*decoder.blocks.2"):
        load_weights(GPT(gpt_config(20, n_layers=3)), tmp_path / MODEL_FILE)
    with pytest.raises(QkvError, match=r"has tensors the model does not have \(decoder.blocks.1"):
        load_weights(GPT(gpt_config(20, n_layers=1)), tmp_path / MODEL_FILE)


def test_weights_of_another_model_kind_are_refused(tmp_path):
    save_weights(GPT(gpt_config(20)), tmp_path / MODEL_FILE)
    with pytest.raises(QkvError, match="holds the weights of a gpt model, not of the encoder model"):
        load_weights(Encoder(EncoderConfig(vocab_size=20, n_layers=2, **TINY)), tmp_path / MODEL_FILE)


def test_a_failed_save_leaves_the_finished_files_alone(tmp_path, tokenizer, monkeypatch):
    model = GPT(gpt_config(tokenizer.vocab_size))
    save_model_dir(tmp_path, model, tokenizer)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(qkv.storage, "save_file", broken)
    with pytest.raises(OSError, match="disk full"):
        save_model_dir(tmp_path, GPT(gpt_config(tokenizer.vocab_size)), tokenizer)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # no temp files left either
    assert torch.equal(load_model_dir(tmp_path).model.unembedding.weight, model.unembedding.weight)


def test_no_pickle_in_the_model_folder(tmp_path, tokenizer):
    save_model_dir(tmp_path, GPT(gpt_config(tokenizer.vocab_size)), tokenizer)
    for path in tmp_path.iterdir():
        data = path.read_bytes()
        assert not data.startswith(b"PK\x03\x04"), path  # torch.save's zip container
        if path.suffix == ".json":
            json.loads(data)
        else:
            assert path.suffix == ".safetensors" and file_keys(path), path
    for module in (qkv.model_dir, qkv.storage):
        source = Path(module.__file__).read_text()
        assert "import pickle" not in source and "torch.save(" not in source and "torch.load(" not in source


def test_config_and_tokenizer_first_weights_from_elsewhere(tmp_path, tokenizer):
    model = GPT(gpt_config(tokenizer.vocab_size))
    save_model_dir(tmp_path, model, tokenizer, weights_name=None)  # a run that has only begun
    assert {p.name for p in tmp_path.iterdir()} == {CONFIG_FILE, TOKENIZER_FILE}
    step_dir = tmp_path / "checkpoints" / "step-000010"
    step_dir.mkdir(parents=True)
    save_weights(model, step_dir / MODEL_FILE)
    bundle = load_model_dir(tmp_path, weights_path=step_dir / MODEL_FILE)
    assert torch.equal(bundle.model.unembedding.weight, model.unembedding.weight)

    data = (step_dir / MODEL_FILE).read_bytes()
    (step_dir / MODEL_FILE).write_bytes(data[: len(data) // 2])
    with pytest.raises(QkvError, match=r"damaged or truncated .*: delete .*step-000010 to use the checkpoint before"):
        load_model_dir(tmp_path, weights_path=step_dir / MODEL_FILE)
