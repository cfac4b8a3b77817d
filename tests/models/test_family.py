"""The family table: every config kind has one description, and the description matches the model it builds."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from qkv.errors import QkvError
from qkv.layers.blocks import DecoderBlock
from qkv.layers.embedding import Unembedding
from qkv.models.config import CONFIG_CLASSES
from qkv.models.family import CAPABILITIES, LANGUAGE_MODEL, ROLES, build_model, families, family_of, in_role

SMALL = {"d_model": 16, "n_heads": 2, "context_length": 16}


def small_config(family):
    fields = {f.name for f in dataclasses.fields(family.config)}
    sizes = {k: v for k, v in SMALL.items() if k in fields}
    if "d_embedding" in fields:  # RNNSearch
        sizes = {"d_embedding": 8, "d_hidden": 8, "d_attention": 8, "d_readout": 8, "context_length": 16}
    if family.name == "word2vec":
        sizes = {"d_model": 8}
    return family.config(**sizes)


def test_every_saved_kind_has_exactly_one_family():
    assert set(families()) == set(CONFIG_CLASSES)
    for name, family in families().items():
        assert family.name == name == family.config.kind
        assert family.role in ROLES
        assert family.capabilities <= set(CAPABILITIES)


@pytest.mark.parametrize("name", sorted(families()))
def test_a_description_matches_the_model_it_builds(name):
    family = families()[name]
    model = build_model(small_config(family))
    assert type(model) is family.model
    assert family_of(model) is family and family_of(model.config) is family and family_of(name) is family
    assert family_of(family.config) is family
    for field in family.vocab_fields:  # the tokenizer(s) size these fields
        assert getattr(model.config, field) > 0
    modules = dict(model.named_modules())
    for part, (embedding, stack) in family.streams.items():
        assert embedding in modules and stack in modules, part
        assert len(modules[stack].blocks) > 0
        assert (part in family.masked) == isinstance(modules[stack].blocks[0], DecoderBlock), part
    assert family.masked <= set(family.streams)
    if family.embedding is not None:
        assert family.embedding in modules or hasattr(model, family.embedding)
    assert family.has("unembedding") == hasattr(model, "unembedding") or family.name == "rnnsearch"
    assert family.has("unembedding") == (family.unembedding is not None)  # where W_U is, for those that have one
    if family.unembedding is not None:
        assert isinstance(modules[family.unembedding], Unembedding)
    assert family.has("cross-attention") == any(name.endswith("cross_attn") for name in modules)


def test_the_family_of_a_wrapped_model_is_the_inner_models():
    model = build_model(small_config(families()["llama"]))
    compiled = torch.compile(model)  # not run: only the wrapper's attribute is read
    assert family_of(compiled).name == "llama"


def test_a_missing_capability_is_refused_with_one_line_naming_what_to_use():
    with pytest.raises(QkvError) as error:
        family_of("encoder").require("unembedding", "the logit lens")
    message = str(error.value)
    assert "\n" not in message and message.startswith("the logit lens needs an unembedding")
    assert "qkv heads" in message
    family_of("gpt").require("residual stream", "the logit lens")  # a GPT has one: nothing raised
    with pytest.raises(ValueError):
        family_of("gpt").has("a time machine")


def test_an_unknown_kind_or_a_foreign_object_is_a_clear_error():
    with pytest.raises(QkvError, match="unknown model kind 'mamba'"):
        family_of("mamba")
    with pytest.raises(QkvError, match="cannot build a model from a dict"):
        build_model({"model": "gpt"})  # type: ignore[arg-type]


def test_a_role_mismatch_names_the_command_to_use():
    with pytest.raises(QkvError, match="needs a translator, and this is a GPT.*use `qkv generate`"):
        family_of("gpt").require_role("translator", "qkv translate")


def test_in_role_asks_the_description_not_the_class():
    for family in families().values():
        config = small_config(family)
        if family.role == LANGUAGE_MODEL:  # GPT's and Llama's configs alike: the same object back
            assert in_role(config, LANGUAGE_MODEL, object, "the test") is config
        else:
            refused = re.escape(f"the test needs a language model, and this is {family.title}")
            with pytest.raises(QkvError, match=refused):
                in_role(config, LANGUAGE_MODEL, object, "the test")


def test_each_family_declares_the_fast_decode_step_its_model_fits():
    steps = {name: family.decode_step for name, family in families().items()}
    assert steps == {"gpt": "causal", "llama": "causal", "encoder": "one-pass", "transformer": "cross",
                     "rnnsearch": None, "word2vec": None}  # fmt: skip
    for family in families().values():  # what each step reads is there
        modules = dict(build_model(small_config(family)).named_modules())
        if family.decode_step == "causal":
            assert "decoder" in modules and "unembedding" in modules and not modules["decoder"].cross_attention
        elif family.decode_step == "cross":
            assert "encoder" in modules and modules["decoder"].cross_attention and "unembedding" in modules
        elif family.decode_step == "one-pass":
            assert "encoder" in modules and "unembedding" not in modules
    with pytest.raises(ValueError, match="decode_step='rnn'"):
        dataclasses.replace(families()["gpt"], decode_step="rnn")


def test_presets_come_from_the_families_and_build_their_models():
    from qkv.models.presets import PRESETS, make_config

    names = [name for family in families().values() for name in family.presets]
    assert len(names) == len(set(names)) == len(PRESETS)  # no name in two families
    for family in families().values():
        for name in family.presets:
            assert PRESETS[name][0] is family.config and type(make_config(name)) is family.config
        for setting, value in family.train_defaults.items():
            assert setting != "preset" or value in family.presets


def test_families_with_hugging_face_checkpoints_name_their_conversion():
    seen: list[str] = []
    for family in families().values():
        if family.hf_model_types:
            for step in ("config_from_hf", "convert", "load_tokenizers"):
                assert callable(getattr(family.hf_conversion, step))
            assert family.hf_architectures
        else:
            assert family.hf_conversion is None and not family.hf_architectures
        seen += family.hf_model_types
    assert len(seen) == len(set(seen)) == 6


def test_a_translator_describes_its_sizes_in_one_line():
    line = family_of("rnnsearch").describe(small_config(families()["rnnsearch"]))
    assert line.startswith("RNNSearch (bidirectional GRU encoder") and "\n" not in line
    assert family_of("gpt").describe(small_config(families()["gpt"])) == family_of("gpt").title


@pytest.mark.parametrize("name", sorted(families()))
def test_fsdp_units_are_the_blocks_of_the_streams_the_family_names(name):
    """training.strategy.block_modules asks the family's streams; the blocks found by their classes agree."""
    from qkv.layers.blocks import DecoderBlock, EncoderBlock
    from qkv.training.strategy import block_modules

    model = build_model(small_config(families()[name]))
    by_class = [m for m in model.modules() if isinstance(m, (EncoderBlock, DecoderBlock))]
    assert [id(m) for m in block_modules(model)] == [id(m) for m in by_class]


def test_the_encoder_says_what_its_first_block_reads():
    """The BERT note of `qkv explain` comes from the family's description, for BERT's embeddings only."""
    note, config = families()["encoder"].embedding_note, small_config(families()["encoder"])
    assert note is not None and "as in BERT" in (note(config.replace(embedding_norm=True)) or "")
    assert note(config) is None
    assert all(f.embedding_note is None for n, f in families().items() if n != "encoder")


VARIANTS = [{}, {"positional": "rope"}, {"positional": "sinusoidal", "norm_first": False}, {"norm": "rmsnorm"},
            {"positional": "none"}]  # fmt: skip


@pytest.mark.parametrize("name", sorted(families()))
@pytest.mark.parametrize("variant", range(len(VARIANTS)))
def test_the_description_of_positions_and_norms_is_what_the_model_builds(name, variant):
    """context_length, positions and block_input_norm, read from a config, against the modules it builds."""
    from qkv.layers.positional import LearnedPositionalEncoding, RotaryEmbedding, SinusoidalPositionalEncoding

    family = families()[name]
    config = small_config(family)
    fields = {f.name for f in dataclasses.fields(family.config)}
    changes = {k: v for k, v in VARIANTS[variant].items() if k in fields}
    if name == "llama" and "positional" in changes or (variant and not changes):
        pytest.skip("this family's config has no such choice")
    config = dataclasses.replace(config, **changes)
    modules = list(build_model(config).modules())
    kinds = {"rope": RotaryEmbedding, "learned": LearnedPositionalEncoding, "sinusoidal": SinusoidalPositionalEncoding}
    built = [p for p, kind in kinds.items() if any(isinstance(m, kind) for m in modules)]
    assert built == ([] if family.positions(config) == "none" else [family.positions(config)])
    assert family.has("positions") or family.positions(config) == "none"
    tables = [m for m in modules if isinstance(m, (LearnedPositionalEncoding, SinusoidalPositionalEncoding))]
    for table in tables:  # a table has a row for every position of the context
        rows = table.weight if isinstance(table, LearnedPositionalEncoding) else table.table
        assert rows.shape[0] == family.context_length(config)
    assert (family.context_length(config) is None) == (name == "word2vec")
    sublayers = [m for m in modules if hasattr(m, "norm_first") and hasattr(m, "norm")]
    norm = family.block_input_norm(config)
    if norm is None:
        assert all(not m.norm_first for m in sublayers)
    else:
        assert sublayers and all(m.norm_first and type(m.norm).__name__.endswith(norm) for m in sublayers)
