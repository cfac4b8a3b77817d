"""Text the tokenizer does not know: every verb that reads text says how many tokens became <unk>, through
one shared function (qkv.tokenizers.unknown.unknown_note)."""

from __future__ import annotations

import pytest

from qkv.cli import main
from qkv.tokenizers.char import CharTokenizer
from qkv.tokenizers.unknown import count_unknown, unknown_note


@pytest.fixture
def run_dir(tiny_run):
    return tiny_run


def test_count_unknown_against_the_tokenizers_own_ids() -> None:
    tokenizer = CharTokenizer.train("abc ")
    ids = tokenizer.encode("abxz c")
    assert count_unknown(tokenizer, "abxz c") == (ids.count(tokenizer.unk_id), len(ids)) == (2, 6)
    assert unknown_note(tokenizer, "abc") is None
    assert "all 2 tokens of the prompt became <unk>" in unknown_note(tokenizer, "xy", "the prompt")


VERBS = [
    ["generate", "{run}", "--prompt", "ΩΩΩ", "--max-new-tokens", "2"],
    ["next", "{run}", "ΩΩΩ"],
    ["explain", "ΩΩΩ", "--run", "{run}"],
    ["attention", "{run}", "ΩΩΩ", "--out", "{tmp}/a.png"],
    ["eval", "{run}", "{tmp}/unknown.txt"],
]


@pytest.mark.parametrize("verb", VERBS, ids=[v[0] for v in VERBS])
def test_every_verb_says_how_many_tokens_became_unk(run_dir, tmp_path, capsys, verb) -> None:
    (tmp_path / "unknown.txt").write_text("ΩΩΩ")
    assert main([a.format(run=run_dir, tmp=tmp_path) for a in verb]) == 0
    err = capsys.readouterr().err
    assert "all 3 tokens of" in err and "became <unk>" in err
    (tmp_path / "unknown.txt").write_text("hello")
    assert main([a.format(run=run_dir, tmp=tmp_path).replace("ΩΩΩ", "hello") for a in verb]) == 0
    assert "<unk>" not in capsys.readouterr().err  # known text: no note
