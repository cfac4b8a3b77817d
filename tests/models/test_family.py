"""The family table: every config kind has one description, and the description matches the model it builds."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from qkv.errors import QkvError
from qkv.models.config import CONFIG_CLASSES
from qkv.models.family import CAPABILITIES, ROLES, build_model, families, family_of

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
    for field in family.vocab_fields:  # the tokenizer(s) size these fields
        assert getattr(model.config, field) > 0
    modules = dict(model.named_modules())
    for part, (embedding, stack) in family.streams.items():
        assert embedding in modules and stack in modules, part
        assert len(modules[stack].blocks) > 0
    if family.embedding is not None:
        assert family.embedding in modules or hasattr(model, family.embedding)
    assert family.has("unembedding") == hasattr(model, "unembedding") or family.name == "rnnsearch"
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
