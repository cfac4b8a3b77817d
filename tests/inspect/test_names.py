"""act_name gives exactly the names capture() records: built from each family's description, on real models."""

from __future__ import annotations

import pytest
import torch

from qkv.inspect.names import act_name
from qkv.inspect.residual import stream
from qkv.layers.capture import capture
from qkv.models import (
    GPT,
    Encoder,
    EncoderConfig,
    GPTConfig,
    LlamaConfig,
    RNNSearchConfig,
    Transformer,
    TransformerConfig,
)
from qkv.models.family import family_of
from qkv.models.llama import Llama
from qkv.models.rnnsearch import RNNSearch

V = 12


def models() -> dict:
    return {
        "gpt": GPT(GPTConfig(vocab_size=V, d_model=8, n_heads=2, n_layers=2, context_length=8)),
        "llama": Llama(LlamaConfig(vocab_size=V, d_model=8, n_heads=2, n_layers=2, context_length=8)),
        "encoder": Encoder(EncoderConfig(vocab_size=V, d_model=8, n_heads=2, n_layers=2, context_length=8)),
        "transformer": Transformer(TransformerConfig(src_vocab_size=V, tgt_vocab_size=V, d_model=8, n_heads=2,
                                                     n_encoder_layers=1, n_decoder_layers=2, context_length=8)),
        "rnnsearch": RNNSearch(RNNSearchConfig(src_vocab_size=V, tgt_vocab_size=V, d_embedding=8, d_hidden=8,
                                               d_attention=8, d_readout=8, context_length=8)),
    }  # fmt: skip


def expected_names(model) -> set[str]:
    """Every name a forward pass records, built only from the family's description and act_name."""
    family = family_of(model)
    names = {act_name("logits")} if family.has("unembedding") else {act_name("hidden")}
    if family.two_vocabularies:
        names.add(act_name("memory"))
    for part, (embedding, _) in family.streams.items():
        names |= {act_name("tokens", embedding=embedding), act_name("embed", embedding=embedding)}
        if model.config.positional in ("learned", "sinusoidal"):  # rotary positions add no vector
            names.add(act_name("positions", embedding=embedding))
        s = stream(model, part)
        for layer in range(s.n_layers):
            names.add(act_name("resid_post", layer, stack=s.stack))
            for sub in s.sublayers:
                names.add(act_name("sublayer_out", layer, stack=s.stack, sublayer=sub.residual))
                if sub.attention is not None:
                    names |= {act_name(w, layer, stack=s.stack, attention=sub.attention)
                              for w in ("q", "k", "v", "weights", "context")}  # fmt: skip
    if family.has("alignment"):  # RNNSearch: embeddings of both sides and one attention outside any block
        names |= {act_name(w, embedding=e) for w in ("tokens", "embed") for e in ("src_embedding", "tgt_embedding")}
        names.add(act_name("weights", stack="decoder", attention="attention"))
    return names


@pytest.mark.parametrize("name", ["gpt", "llama", "encoder", "transformer", "rnnsearch"])
def test_act_name_builds_exactly_the_names_a_forward_pass_records(name) -> None:
    model = models()[name].eval()
    ids = torch.tensor([[1, 2, 3, 4]])
    with capture(model) as acts:
        model(ids, ids[:, :3]) if family_of(model).two_vocabularies else model(ids)
    assert set(acts) == expected_names(model)


def test_the_stream_reads_are_named_as_the_views_expect() -> None:
    assert act_name("resid_pre", 0, embedding="tgt_embedding") == "tgt_embedding.output"
    assert act_name("resid_pre", 2, stack="encoder") == "encoder.blocks.1.output"
    assert act_name("q", 1, attention="cross_attn") == "decoder.blocks.1.cross_attn.q"
    assert act_name("weights", stack="decoder", attention="attention") == "decoder.attention.weights"
    assert act_name("sublayer_out", 0, sublayer="ffn_sublayer") == "decoder.blocks.0.ffn_sublayer.out"


def test_a_bad_request_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="unknown activation 'attn_out'"):
        act_name("attn_out", 0)
    with pytest.raises(ValueError, match="needs a layer"):
        act_name("resid_post")
    with pytest.raises(ValueError, match="needs the sublayer's name"):
        act_name("sublayer_out", 0)
