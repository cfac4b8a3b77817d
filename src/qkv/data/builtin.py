"""The built-in corpus: English text that ships with Python itself, so training needs no download.

Python's standard library carries the reference text behind ``help("assert")``, ``help("for")`` and the
other language topics in the module ``pydoc_data.topics``: a dict ``topics`` from a topic name to about a
page of English prose and code. Joined together it is roughly 460,000 characters, enough for a small
character-level language model to learn spelling, words and a little syntax on a CPU.

The text depends only on the Python version (the topics are regenerated with each release), never on the
machine, so the same interpreter always gives the same corpus.
"""

from __future__ import annotations

from functools import lru_cache

BUILTIN_NAME = "pydoc"
"""The name that selects the built-in corpus, e.g. ``qkv train --data pydoc`` (``"builtin"`` works too)."""

BUILTIN_SOURCE = "Python's own documentation (the standard library module pydoc_data.topics)"
"""Where the built-in corpus comes from, in words, for logs and checkpoints."""


@lru_cache(maxsize=1)
def builtin_corpus() -> str:
    """The texts of ``pydoc_data.topics.topics``, sorted by topic name, separated by one blank line.

    Each topic's leading and trailing newlines are removed before joining with ``"\\n\\n"``, and the whole
    ends with one newline. Sorting by name fixes the order: "assert" comes first, so the corpus starts with
    'The "assert" statement'.
    """
    from pydoc_data.topics import topics  # imported here: a 0.5 MB module nobody else needs

    return "\n\n".join(topics[name].strip("\n") for name in sorted(topics)) + "\n"


CALIBRATION_CHARACTERS = 8000


def calibration_sample() -> str:
    """The start of the built-in corpus, what quantizing calibrates on when given no text of its own
    (:func:`qkv.quantization.smoothing.smoothing_feed`): about 1,800 tokens of SmolLM2's vocabulary."""
    return builtin_corpus()[:CALIBRATION_CHARACTERS]
