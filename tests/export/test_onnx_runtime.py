"""The ONNX Runtime loops make qkv's greedy tokens and embeddings from the exported graphs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from qkv.decoding import generate
from qkv.decoding.beam_search import greedy_decode
from qkv.decoding.translator import Translator
from qkv.errors import QkvError
from qkv.export.onnx_runtime import OnnxEncoder, OnnxGPT, OnnxTranslator
from qkv.pretrained import embed_sentences

pytestmark = pytest.mark.slow  # among the longest modules: the workers start them first (tests/conftest.py)


def test_gpt_greedy_generation_equals_qkv(gpt_onnx, tokenizer) -> None:
    model = gpt_onnx.bundle.model
    prompts = torch.tensor([tokenizer.encode("the quick"), tokenizer.encode("a man is ")[:9]])
    gpt = OnnxGPT(gpt_onnx.files[0])
    ours = gpt.generate_greedy(prompts.numpy(), 25)
    assert np.array_equal(ours, generate(model, prompts, max_new_tokens=25, temperature=0.0).numpy())
    eos = int(ours[0, 12])  # a token the first row makes: that row stops there, the other goes on
    np.testing.assert_array_equal(
        gpt.generate_greedy(prompts.numpy(), 25, eos_id=eos),
        generate(model, prompts, max_new_tokens=25, temperature=0.0, eos_id=eos).numpy(),
    )


def test_gpt_loop_refuses_to_run_past_the_context(gpt_onnx) -> None:
    with pytest.raises(QkvError, match="do not fit the context of 40 positions"):
        OnnxGPT(gpt_onnx.files[0]).generate_greedy([[1, 2, 3]], 40)


def test_greedy_translation_equals_qkv(translator_onnx) -> None:
    translator = Translator.from_bundle(translator_onnx.bundle)
    src, mask = translator.encode_sources(["the fox jumps", "a baby", "the lazy dog is eating"])
    target = translator.target_tokenizer
    expected = greedy_decode(translator.model, src, mask, bos_id=target.bos_id, eos_id=target.eos_id, max_len=15,
                             max_len_a=0, max_len_b=15)  # fmt: skip
    onnx = OnnxTranslator(next(p for p in translator_onnx.files if p.name.endswith(".encoder.onnx")))
    ours = onnx.greedy(src.numpy(), (~mask).long().numpy(), bos_id=target.bos_id, eos_id=target.eos_id,
                       max_new_tokens=15)  # fmt: skip
    assert ours == expected and any(len(row) > 3 for row in ours)


def test_sentence_embeddings_equal_qkv(encoder_onnx, tokenizer) -> None:
    from qkv.pretrained.sentences import encode_for_bert

    texts = ["a man is eating food.", "the girl", "the quick brown fox jumps"]
    ids, padding = encode_for_bert(tokenizer, texts, max_tokens=40)
    _, sentence = OnnxEncoder(encoder_onnx.files[0]).forward(ids.numpy(), (~padding).long().numpy())
    np.testing.assert_allclose(sentence, embed_sentences(encoder_onnx.bundle, texts).numpy(), atol=1e-4, rtol=1e-4)


def test_a_graph_of_another_kind_is_named(gpt_onnx, encoder_onnx, tmp_path) -> None:
    with pytest.raises(QkvError, match="is not a qkv encoder graph"):
        OnnxEncoder(gpt_onnx.files[0])
    with pytest.raises(QkvError, match="does not exist: write it with `qkv export RUN --out gone.onnx`"):
        OnnxGPT(tmp_path / "gone.onnx")
