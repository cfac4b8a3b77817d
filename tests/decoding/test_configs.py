"""The configs the decoding loops read are the models' own, unchanged (qkv.decoding.configs)."""

from __future__ import annotations

from qkv.decoding.configs import decoder_config, translator_config
from qkv.models import GPT, RNNSearch, RNNSearchConfig, Transformer, TransformerConfig
from qkv.models.gpt.config import GPTConfig
from qkv.models.llama import Llama, LlamaConfig


def test_decoder_config_is_the_models_own() -> None:
    gpt = GPT(GPTConfig(vocab_size=40, d_model=32, n_heads=4, n_layers=1, context_length=24))
    assert decoder_config(gpt) is gpt.config
    assert (decoder_config(gpt).vocab_size, decoder_config(gpt).context_length) == (40, 24)
    llama = Llama(LlamaConfig(vocab_size=50, d_model=32, n_heads=4, n_kv_heads=2, n_layers=1, context_length=16))
    assert decoder_config(llama) is llama.config
    assert (decoder_config(llama).n_kv_heads, decoder_config(llama).head_dim) == (2, 8)


def test_translator_config_is_the_models_own() -> None:
    config = TransformerConfig(src_vocab_size=30, tgt_vocab_size=20, d_model=32, n_heads=4, d_ff=64,
                               n_encoder_layers=1, n_decoder_layers=1, context_length=12)  # fmt: skip
    transformer = Transformer(config)
    assert translator_config(transformer) is transformer.config
    assert (translator_config(transformer).src_vocab_size, translator_config(transformer).tgt_vocab_size) == (30, 20)
    rnn = RNNSearch(RNNSearchConfig(src_vocab_size=25, tgt_vocab_size=15, d_embedding=16, d_hidden=12,
                                    d_attention=10, d_readout=16, context_length=9))  # fmt: skip
    assert translator_config(rnn) is rnn.config
    assert (translator_config(rnn).tgt_vocab_size, translator_config(rnn).context_length) == (15, 9)
