"""Preset parameter counts match the published figures and Hugging Face's implementations."""

from __future__ import annotations

import pytest

from qkv.errors import QkvError
from qkv.models import GPT, Encoder, Transformer, Word2VecConfig, make_config
from qkv.models.presets import PRESETS

transformers = pytest.importorskip("transformers")


def test_gpt2_small_has_124_439_808_parameters() -> None:
    model = GPT(make_config("gpt2-small"))
    assert model.num_parameters() == 124_439_808
    reference = transformers.GPT2LMHeadModel(transformers.GPT2Config())  # n_layer=12, n_embd=768, tied
    assert model.num_parameters() == reference.num_parameters()


@pytest.mark.parametrize(
    ("preset", "hf_kwargs"),
    [
        ("bert-base", {}),
        ("minilm-l6", dict(num_hidden_layers=6, hidden_size=384, num_attention_heads=12, intermediate_size=1536)),
    ],
)
def test_bert_family_matches_hugging_face_without_the_pooler(preset, hf_kwargs) -> None:
    ours = Encoder(make_config(preset)).num_parameters()
    reference = transformers.BertModel(transformers.BertConfig(**hf_kwargs), add_pooling_layer=False)
    assert ours == reference.num_parameters()


def test_paper_base_model() -> None:
    config = make_config("transformer-base")
    assert (config.n_encoder_layers, config.d_model, config.n_heads, config.head_dim, config.d_ff, config.dropout) == (
        6,
        512,
        8,
        64,
        2048,
        0.1,
    )
    n = Transformer(config).num_parameters()
    d, ff, vocab, layers = 512, 2048, 37000, 6
    attention = 4 * (d * d + d)
    feed_forward = d * ff + ff + ff * d + d
    norm = 2 * d
    expected = (
        vocab * d + layers * (attention + feed_forward + 2 * norm) + layers * (2 * attention + feed_forward + 3 * norm)
    )
    assert n == expected
    # The paper's Table 3 rounds the base model to 65 million; counted exactly it is 63.1 million.
    assert abs(n - 65e6) / 65e6 < 0.05


def test_every_preset_builds_a_valid_config() -> None:
    for name in PRESETS:
        config = make_config(name)
        if isinstance(config, Word2VecConfig):  # word vectors: no attention heads
            assert config.d_model == 100, name
            continue
        assert config.d_model % config.n_heads == 0, name


def test_a_setting_the_preset_lacks_is_one_clear_error() -> None:
    with pytest.raises(QkvError, match="a word2vec model has no n_layers"):
        make_config("word2vec", n_layers=2)
