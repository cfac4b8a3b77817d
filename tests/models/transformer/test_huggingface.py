"""Marian/OPUS-MT imported into qkv's Transformer: positions, logits, greedy translations and tokenizers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from qkv.decoding.beam_search import greedy_decode
from qkv.layers.positional import sinusoidal_table
from qkv.model_dir import load_model_dir
from qkv.models import Transformer
from qkv.models.transformer.huggingface import read_spm
from qkv.pretrained import load_pretrained, save_as_qkv
from tests.pretrained.conftest import DE, EN, save_marian

transformers = pytest.importorskip("transformers")
marian_module = pytest.importorskip("transformers.models.marian.modeling_marian")


@pytest.mark.parametrize("dim", [32, 33])
def test_sinusoidal_layout_is_sin_then_cos_halves(dim: int) -> None:
    reference = marian_module.MarianSinusoidalPositionalEmbedding(50, dim).create_weight()
    torch.testing.assert_close(sinusoidal_table(50, dim, interleaved=False), reference, atol=1e-6, rtol=0)
    assert not torch.allclose(sinusoidal_table(50, dim, interleaved=True), reference, atol=1e-3)


def _source_batch(bundle) -> tuple[torch.Tensor, torch.Tensor]:
    """Encoded source sentences (with </s>), right-padded with <pad>: (ids, padding mask)."""
    rows = bundle.tokenizer.encode_batch(EN[:3] + ["hello"], add_eos=True)
    length = max(map(len, rows))
    pad = bundle.tokenizer.pad_id
    ids = torch.tensor([r + [pad] * (length - len(r)) for r in rows])
    return ids, ids == pad


def test_config_and_tokenizer_roles(marian_dir: tuple[Path, torch.nn.Module]) -> None:
    folder, reference = marian_dir
    bundle = load_pretrained(folder)
    assert isinstance(bundle.model, Transformer)
    config = bundle.config
    assert (config.activation, config.positional, config.sinusoidal_interleaved) == ("silu", "sinusoidal", False)
    assert config.scale_embeddings and config.share_embeddings and config.final_logits_bias and not config.norm_first
    src, tgt = bundle.tokenizer, bundle.target_tokenizer
    assert tgt.bos_id == reference.config.decoder_start_token_id == reference.config.pad_token_id == tgt.pad_id
    assert tgt.eos_id == src.eos_id == reference.config.eos_token_id
    shared = bundle.model.src_embedding.token_embedding.weight
    assert bundle.model.tgt_embedding.token_embedding.weight is shared and bundle.model.unembedding.weight is shared


def test_logits_match_transformers_with_padding(marian_dir: tuple[Path, torch.nn.Module]) -> None:
    folder, reference = marian_dir
    bundle = load_pretrained(folder)
    src, src_pad = _source_batch(bundle)
    start, pad = reference.config.decoder_start_token_id, reference.config.pad_token_id
    rows = bundle.target_tokenizer.encode_batch(DE[:3] + ["hallo"], add_eos=True)
    length = max(map(len, rows))
    labels = torch.tensor([r + [pad] * (length - len(r)) for r in rows])
    decoder_input = torch.cat([torch.full((4, 1), start), labels[:, :-1]], dim=1)  # teacher forcing
    with torch.no_grad():
        expected = reference(input_ids=src, attention_mask=(~src_pad).long(), decoder_input_ids=decoder_input).logits
        ours = bundle.model(src, decoder_input, src_padding_mask=src_pad)
    torch.testing.assert_close(ours, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(("tie", "seed", "scale", "cross"), [(True, 2, 0.05, 3.0), (False, 1, 0.02, 5.0)])
def test_greedy_translation_matches_transformers(
    tmp_path: Path, tie: bool, seed: int, scale: float, cross: float
) -> None:
    reference = save_marian(tmp_path, seed=seed, tie=tie, scale=scale, cross=cross)
    bundle = load_pretrained(tmp_path)
    assert bundle.config.tie_embeddings == tie
    src, src_pad = _source_batch(bundle)
    tgt = bundle.target_tokenizer
    with torch.no_grad():
        out = reference.generate(
            input_ids=src, attention_mask=(~src_pad).long(), num_beams=1, do_sample=False, max_new_tokens=12
        )
    expected = []
    for row in out[:, 1:].tolist():  # drop the start token; cut at </s>
        expected.append(row[: row.index(tgt.eos_id)] if tgt.eos_id in row else row)
    ours = greedy_decode(bundle.model, src, src_pad, bos_id=tgt.bos_id, eos_id=tgt.eos_id, max_len=12)
    assert ours == expected


@pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")
def test_tokenizers_match_marian_tokenizer(marian_dir: tuple[Path, torch.nn.Module]) -> None:
    folder, _ = marian_dir
    reference = transformers.MarianTokenizer.from_pretrained(folder)
    bundle = load_pretrained(folder)
    src, tgt = bundle.tokenizer, bundle.target_tokenizer
    assert src.vocab_size == tgt.vocab_size == len(reference.get_vocab())
    texts = [*EN, "  the  cat,   the dog!  ", "red apples in the park?"]
    for text in texts:
        assert src.encode(text, add_eos=True) == reference(text)["input_ids"]
    for text in [*DE, "grüne katze im park", "  hallo   welt  "]:
        ids = tgt.encode(text, add_eos=True)
        assert ids == reference(text_target=text)["input_ids"]
        assert tgt.decode(ids) == reference.decode(ids, skip_special_tokens=True)


def test_spm_reader_agrees_with_sentencepiece(marian_dir: tuple[Path, torch.nn.Module]) -> None:
    spm = pytest.importorskip("sentencepiece")
    folder, _ = marian_dir
    model = read_spm(folder / "source.spm")
    processor = spm.SentencePieceProcessor(model_file=str(folder / "source.spm"))
    assert [p for p, _, _ in model["pieces"]] == [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
    assert [round(s, 4) for _, s, _ in model["pieces"]] == [
        round(processor.get_score(i), 4) for i in range(processor.get_piece_size())
    ]
    assert model["model_type"] == 1 and model["add_dummy_prefix"] and model["precompiled_charsmap"]


def test_save_as_qkv_reloads(marian_dir: tuple[Path, torch.nn.Module], tmp_path: Path) -> None:
    folder, _ = marian_dir
    bundle = load_pretrained(folder)
    save_as_qkv(bundle, tmp_path)
    again = load_model_dir(tmp_path)
    assert again.config == bundle.config
    assert again.target_tokenizer is not None and again.target_tokenizer.bos_id == bundle.target_tokenizer.bos_id
    assert again.tokenizer.encode(EN[0], add_eos=True) == bundle.tokenizer.encode(EN[0], add_eos=True)
    src, src_pad = _source_batch(bundle)
    tgt = torch.tensor([[bundle.target_tokenizer.bos_id, 5, 6, 7]] * src.shape[0])
    with torch.no_grad():
        torch.testing.assert_close(
            again.model(src, tgt, src_padding_mask=src_pad), bundle.model(src, tgt, src_padding_mask=src_pad)
        )


def test_old_style_checkpoint_with_every_alias(marian_dir: tuple[Path, torch.nn.Module], tmp_path: Path) -> None:
    """pytorch_model.bin holding shared, both embed_tokens, lm_head and the sinusoidal tables, as OPUS-MT's do."""
    from qkv.errors import QkvError
    from qkv.pretrained import convert_marian, read_hf_config, read_hf_weights

    folder, reference = marian_dir
    state = reference.state_dict()
    assert {"model.shared.weight", "model.encoder.embed_positions.weight", "lm_head.weight"} <= set(state)
    torch.save(state, tmp_path / "pytorch_model.bin")
    (tmp_path / "config.json").write_bytes((folder / "config.json").read_bytes())
    model = convert_marian(read_hf_weights(tmp_path), read_hf_config(tmp_path)).eval()
    pad = reference.config.pad_token_id
    src = torch.tensor([[5, 6, 7, 0], [8, 9, 0, pad]])
    tgt = torch.tensor([[pad, 10, 11], [pad, 12, 13]])
    with torch.no_grad():
        expected = reference(input_ids=src, attention_mask=(src != pad).long(), decoder_input_ids=tgt).logits
        torch.testing.assert_close(model(src, tgt, src_padding_mask=src == pad), expected, atol=1e-4, rtol=1e-4)

    state["model.decoder.embed_positions.weight"] = sinusoidal_table(64, 32, interleaved=True)  # the wrong layout
    torch.save(state, tmp_path / "pytorch_model.bin")
    with pytest.raises(QkvError, match=r"model\.decoder\.embed_positions\.weight is not the \[sin \| cos\] table"):
        convert_marian(read_hf_weights(tmp_path), read_hf_config(tmp_path))
