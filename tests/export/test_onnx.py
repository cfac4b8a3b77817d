"""The exported graphs, run by ONNX Runtime, give qkv's numbers: logits within 1e-4 from an empty cache and
step by step, token vectors and sentence embeddings, the translator's cross-attention keys and values."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from qkv.export.onnx_runtime import load_session

pytestmark = pytest.mark.slow  # among the longest modules: the workers start them first (tests/conftest.py)


def feeds(session, *values: np.ndarray) -> dict[str, np.ndarray]:
    return {i.name: v for i, v in zip(session.get_inputs(), values, strict=True)}


def empty(batch: int, layers: int, config) -> list[np.ndarray]:
    return [np.zeros((batch, config.n_heads, 0, config.head_dim), np.float32) for _ in range(2 * layers)]


def close(ours: np.ndarray, theirs: torch.Tensor) -> None:
    np.testing.assert_allclose(ours, theirs.detach().numpy(), atol=1e-4, rtol=1e-4)


def test_gpt_files_and_their_inputs(gpt_onnx) -> None:
    (path,) = gpt_onnx.files
    session = load_session(path)
    names = [i.name for i in session.get_inputs()]
    assert names == ["input_ids", "past_key_0", "past_value_0", "past_key_1", "past_value_1"]
    assert [o.name for o in session.get_outputs()][:2] == ["logits", "present_key_0"]
    assert session.get_inputs()[1].shape == ["batch", 4, "past_sequence", 8]  # named, dynamic axes
    meta = session.get_modelmeta().custom_metadata_map
    assert meta["qkv.graph"] == "gpt" and json.loads(meta["qkv.config"]) == gpt_onnx.bundle.config.to_dict()


def test_gpt_logits_from_a_prompt_and_then_token_by_token(gpt_onnx) -> None:
    session, model = load_session(gpt_onnx.files[0]), gpt_onnx.bundle.model
    ids = torch.randint(0, model.config.vocab_size, (3, 11))
    with torch.no_grad():
        expected = model(ids)  # (3, 11, vocab), the whole sequence at once, no cache
    logits, *past = session.run(None, feeds(session, ids[:, :6].numpy(), *empty(3, 2, model.config)))
    close(logits, expected[:, :6])
    for t in range(6, 11):  # one token at a time, the presents fed back as pasts
        logits, *past = session.run(None, feeds(session, ids[:, t : t + 1].numpy(), *past))
        close(logits, expected[:, t : t + 1])
    assert past[0].shape == (3, 4, 11, 8)


def test_encoder_vectors_and_sentence_embeddings(encoder_onnx) -> None:
    (path,) = encoder_onnx.files
    session, model = load_session(path), encoder_onnx.bundle.model
    ids = torch.randint(0, model.config.vocab_size, (3, 9))
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[1, 6:] = 0  # padding
    hidden, sentence = session.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
    with torch.no_grad():
        expected = model(ids, padding_mask=mask == 0)
        pooled = model.embed(ids, padding_mask=mask == 0)
    real = mask.bool().numpy()
    np.testing.assert_allclose(hidden[real], expected.numpy()[real], atol=1e-4, rtol=1e-4)
    close(sentence, pooled)


def test_translator_two_graphs_give_the_decoder_logits(translator_onnx) -> None:
    encoder_file, decoder_file = (p for p in sorted(translator_onnx.files, key=lambda p: "decoder" in p.name))
    assert encoder_file.name == "translator.encoder.onnx" and decoder_file.name == "translator.decoder.onnx"
    encoder, decoder = load_session(encoder_file), load_session(decoder_file)
    model = translator_onnx.bundle.model
    src, tgt = torch.randint(3, model.config.src_vocab_size, (2, 8)), torch.randint(3, 20, (2, 6))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[0, 5:] = 0
    with torch.no_grad():
        expected = model(src, tgt, src_padding_mask=mask == 0)  # teacher forcing, the whole target at once
        memory = model.encode(src, src_padding_mask=mask == 0)
    cross = encoder.run(None, {"input_ids": src.numpy(), "attention_mask": mask.numpy()})
    attention = model.decoder.blocks[1].cross_attn
    close(cross[3], attention.split_heads(attention.value(memory)))  # layer 1's values
    past = empty(2, 2, model.config)
    logits, *past = decoder.run(None, feeds(decoder, tgt[:, :3].numpy(), mask.numpy(), *past, *cross))
    close(logits, expected[:, :3])
    for t in range(3, 6):
        logits, *past = decoder.run(None, feeds(decoder, tgt[:, t : t + 1].numpy(), mask.numpy(), *past, *cross))
        close(logits, expected[:, t : t + 1])
