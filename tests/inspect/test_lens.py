"""The logit lens: row i is exactly the model cut after block i; checked against Hugging Face GPT-2 and Marian."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch

from qkv.errors import QkvError
from qkv.inspect.lens import logit_lens
from qkv.inspect.trace import encode_text
from qkv.loading import load
from qkv.model_dir import ModelBundle
from qkv.models import Encoder, EncoderConfig
from tests.pretrained.conftest import gpt2_dir, gpt2_hf, marian_dir  # noqa: F401  (session fixtures)


def truncated(model: torch.nn.Module, n_blocks: int) -> torch.nn.Module:
    """A copy of ``model`` whose decoder keeps only its first ``n_blocks`` blocks (final norm and W_U kept)."""
    short = copy.deepcopy(model)
    short.decoder.blocks = short.decoder.blocks[:n_blocks]
    return short


def test_each_row_is_the_gpt_cut_after_that_block(gpt) -> None:
    text = "the quick brown fox"
    lens = logit_lens(gpt, text, top=4)
    ids = torch.tensor([gpt.tokenizer.encode(text)])
    assert lens.rows == ["embedding", "block 0", "block 1"] and lens.norm == "final LayerNorm"
    for row in range(3):
        with torch.no_grad():
            probs = torch.softmax(truncated(gpt.model, row)(ids)[0].double(), -1)  # (T, vocab)
        top, ids_top = probs.topk(4, dim=-1)
        np.testing.assert_allclose(lens.top_probs[row], top.numpy(), rtol=1e-4, atol=1e-7)
        assert (lens.top_ids[row] == ids_top.numpy()).all()
        final = probs[torch.arange(len(lens.tokens)), lens.final_ids].numpy()
        np.testing.assert_allclose(lens.final_probs[row], final, rtol=1e-4, atol=1e-7)
    assert (lens.final_ranks[-1] == 0).all()  # the last row is the model itself
    assert lens.final_tokens[0] == lens.top_tokens[-1][0][0]
    data = json.loads(json.dumps(lens.to_dict()))
    assert len(data["top"]) == 3 and len(data["top"][0]) == len(lens.tokens) and len(data["top"][0][0]) == 4


def test_a_post_ln_translator_reads_each_block_output_through_w_u_directly(translator) -> None:
    lens = logit_lens(translator, "the fox", target="over")
    model, tok = translator.model, translator.tokenizer
    assert lens.norm.startswith("none (post-LN") and lens.tokens[0] == "<bos>" and not lens.generated
    src = torch.tensor([tok.encode("the fox")])
    tgt = torch.tensor([[tok.bos_id, *tok.encode("over")]])
    for row in range(3):  # the embedding row too: a decoder with no blocks is W_U of the embedding
        with torch.no_grad():
            probs = torch.softmax(truncated(model, row)(src, tgt)[0].double(), -1)
        final = probs[torch.arange(tgt.shape[1]), lens.final_ids].numpy()
        np.testing.assert_allclose(lens.final_probs[row], final, rtol=1e-4, atol=1e-7)
    assert lens.source_tokens == ["t", "h", "e", "␣", "f", "o", "x"]
    generated = logit_lens(translator, "the fox")
    assert generated.generated and generated.tokens[0] == "<bos>"


def test_gpt2_rows_match_transformers_hidden_states(gpt2_dir, gpt2_hf) -> None:  # noqa: F811
    """Hugging Face's hidden_states[i] through its own ln_f and lm_head (the last one has ln_f already)."""
    bundle = load(str(gpt2_dir))
    text = "The quick brown fox jumps over"
    lens = logit_lens(bundle, text, top=5)
    ids = torch.tensor([bundle.tokenizer.encode(text)])
    with torch.no_grad():
        out = gpt2_hf(ids, output_hidden_states=True)
        states = out.hidden_states
        n = len(states) - 1
        rows = [gpt2_hf.lm_head(gpt2_hf.transformer.ln_f(states[i])) for i in range(n)] + [gpt2_hf.lm_head(states[n])]
    assert len(lens.rows) == n + 1
    for row, logits in enumerate(rows):
        probs = torch.softmax(logits[0].double(), -1)
        top, _ = probs.topk(5, dim=-1)
        np.testing.assert_allclose(lens.top_probs[row], top.numpy(), rtol=2e-4, atol=1e-6)
    assert lens.final_ids == out.logits[0].argmax(-1).tolist()


def test_marian_rows_match_transformers_decoder_hidden_states(marian_dir) -> None:  # noqa: F811
    """Marian is post-LN with no final norm: lm_head(decoder_hidden_states[i]) + final_logits_bias."""
    folder, reference = marian_dir
    bundle = load(str(folder))
    lens = logit_lens(bundle, "the cat sat", target="die katze")
    src = encode_text(bundle.tokenizer, "the cat sat", limit=64, what="source")
    target_tok = bundle.target_tokenizer
    tgt = [target_tok.bos_id, *target_tok.encode("die katze")]
    with torch.no_grad():
        out = reference(input_ids=torch.tensor([src]), decoder_input_ids=torch.tensor([tgt]), output_hidden_states=True)
        rows = [reference.lm_head(h) + reference.final_logits_bias for h in out.decoder_hidden_states]
    assert len(rows) == len(lens.rows) == 3
    for row, logits in enumerate(rows):
        probs = torch.softmax(logits[0].double(), -1)
        final = probs[torch.arange(len(tgt)), lens.final_ids].numpy()
        np.testing.assert_allclose(lens.final_probs[row], final, rtol=2e-4, atol=1e-6)


def test_an_encoder_has_no_unembedding_to_read_through(char_tokenizer) -> None:
    model = Encoder(EncoderConfig(vocab_size=char_tokenizer.vocab_size, d_model=8, n_heads=2, n_layers=1))
    bundle = ModelBundle(model, model.config, char_tokenizer, None, None)
    with pytest.raises(QkvError, match="the logit lens needs an unembedding, and an encoder .BERT family. has none"):
        logit_lens(bundle, "the fox")
