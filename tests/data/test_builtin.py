"""The built-in corpus: Python's own documentation, always present, always the same text."""

from __future__ import annotations

from pydoc_data.topics import topics

from qkv.data import BUILTIN_NAME, builtin_corpus


def test_builtin_corpus_is_large_english_text() -> None:
    text = builtin_corpus()
    assert len(text) > 300_000
    assert text.startswith('The "assert" statement\n')  # "assert" is the first topic by name
    assert 'The "for" statement' in text and 'The "while" statement' in text
    words = text.split()
    assert words.count("the") > 2_000  # English prose, not just code


def test_builtin_corpus_is_deterministic() -> None:
    first = builtin_corpus()
    builtin_corpus.cache_clear()
    second = builtin_corpus()
    assert first == second and first is not second


def test_builtin_corpus_joins_topics_in_name_order_with_blank_lines() -> None:
    expected = "\n\n".join(topics[name].strip("\n") for name in sorted(topics)) + "\n"
    assert builtin_corpus() == expected
    text, position = builtin_corpus(), 0
    for name in sorted(topics):  # each topic follows the previous one after exactly one blank line
        body = topics[name].strip("\n")
        assert text.startswith(body, position), name
        position += len(body)
        assert text[position : position + 2] == "\n\n" or position == len(text) - 1
        position += 2
    assert text.endswith("\n") and not text.endswith("\n\n")


def test_builtin_name() -> None:
    assert BUILTIN_NAME == "pydoc"
