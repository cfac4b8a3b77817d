"""check_type: a setting's value against its field's annotation, refused with the setting's name and the kind
of value it takes."""

from __future__ import annotations

import pytest

from qkv.errors import QkvError
from qkv.training.setting_types import check_type


def test_values_of_the_fields_type_pass() -> None:
    check_type("steps", 3, "int")
    check_type("lr", 3, "float")  # a whole number is a number
    check_type("vocab_size", None, "int | None")
    check_type("compile", True, "str")  # TOML's compile = true
    check_type("model", {"d_model": 64}, "dict[str, Any]")


@pytest.mark.parametrize(
    ("name", "value", "annotation", "words"),
    [
        ("steps", 1.5, "int", "a whole number"),
        ("steps", True, "int", "a whole number"),
        ("lr", "fast", "float", "a number"),
        ("lr", float("nan"), "float", "a finite number"),
        ("shared_vocab", "yes", "bool", "true or false"),
        ("model", 3, "dict[str, Any]", "a table"),
    ],
)
def test_other_values_are_refused_by_name(name, value, annotation, words) -> None:
    with pytest.raises(QkvError, match=f"setting {name} = .* must be {words}"):
        check_type(name, value, annotation)
