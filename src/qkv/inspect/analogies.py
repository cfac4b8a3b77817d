"""Analogy accuracy: how often a - b + c lands on d, over a file of questions, section by section.

The questions-words format (Mikolov et al., 2013; gensim ships a copy as ``questions-words.txt``) is
plain text: ``: section-name`` lines open a section, and every other line is a question ``a b c d``,
read "a is to b as c is to d" (``Athens Greece Baghdad Iraq``). A question is answered with the 3CosAdd
rule: the word whose vector has the highest cosine with unit(b) - unit(a) + unit(c), a, b and c excluded.

:func:`evaluate_analogies` scores it exactly as gensim's ``KeyedVectors.evaluate_word_analogies`` does,
so the two give the same numbers on the same vectors:

- only the ``restrict_vocab`` most frequent words take part: a question with a word outside them is
  skipped (counted, not scored), and answers are drawn from them;
- words are compared in upper case (``case_insensitive``); when two vocabulary words differ only in case,
  the more frequent one stands for both;
- the answer is the first of the 8 nearest words (a, b, c excluded by index) whose upper-case form is
  none of a, b, c.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from qkv.errors import QkvError
from qkv.inspect.summary import ShortRepr
from qkv.io import read_text

Question = tuple[str, str, str, str]
BATCH = 512  # questions scored per matrix product


@dataclass(repr=False)
class AnalogySection(ShortRepr):
    """One section's questions and, once evaluated, how many were answered correctly."""

    name: str
    questions: list[Question] = field(default_factory=list)
    correct: int = 0
    answered: int = 0  # questions whose four words are all in the restricted vocabulary

    @property
    def accuracy(self) -> float:
        return self.correct / self.answered if self.answered else 0.0

    @property
    def skipped(self) -> int:
        return len(self.questions) - self.answered


@dataclass(repr=False)
class AnalogyResult(ShortRepr):
    sections: list[AnalogySection]
    restrict_vocab: int

    @property
    def correct(self) -> int:
        return sum(s.correct for s in self.sections)

    @property
    def answered(self) -> int:
        return sum(s.answered for s in self.sections)

    @property
    def questions(self) -> int:
        return sum(len(s.questions) for s in self.sections)

    @property
    def accuracy(self) -> float:
        """Correct answers over answered questions, all sections together (gensim's "Total accuracy")."""
        return self.correct / self.answered if self.answered else 0.0

    def to_dict(self) -> dict:
        rows = [
            dict(section=s.name, correct=s.correct, answered=s.answered, skipped=s.skipped, accuracy=s.accuracy)
            for s in self.sections
        ]
        total = {"correct": self.correct, "answered": self.answered, "questions": self.questions}
        return {"restrict_vocab": self.restrict_vocab, "sections": rows, "total": {**total, "accuracy": self.accuracy}}


def read_analogies(path: str | Path) -> list[AnalogySection]:
    """The sections of a questions-words file; a question before the first ``: section`` line, or a file
    with no questions, is a QkvError. Lines that are not four words are skipped, as gensim skips them."""
    sections: list[AnalogySection] = []
    for number, line in enumerate(read_text(path, what="analogy file").splitlines(), start=1):
        if line.startswith(":"):
            sections.append(AnalogySection(line.lstrip(": ").strip()))
            continue
        words = line.split()
        if len(words) != 4:
            continue
        if not sections:
            raise QkvError(
                f"{path} line {number} is a question before any ': section' line: start the file with a "
                "section header (the questions-words format)"
            )
        sections[-1].questions.append((words[0], words[1], words[2], words[3]))
    if not any(s.questions for s in sections):
        raise QkvError(f"{path} holds no analogy questions (lines 'a b c d' under ': section' headers): check the file")
    return sections


def _unit(matrix: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(matrix, axis=-1, keepdims=True)
    return matrix / np.where(norms == 0, 1.0, norms)


def evaluate_analogies(
    vectors: np.ndarray,
    words: list[str],
    sections: list[AnalogySection],
    *,
    restrict_vocab: int = 30_000,
    case_insensitive: bool = True,
) -> AnalogyResult:
    """Score ``sections`` on ``vectors`` (V, d), whose row i is the vector of ``words[i]``; ``words`` must be
    ordered from the most frequent. Fills each section's ``correct`` and ``answered``; see the module doc."""
    if restrict_vocab < 1:
        raise QkvError(f"--restrict-vocab must be at least 1, got {restrict_vocab}")
    fold = str.upper if case_insensitive else (lambda word: word)
    keys = [fold(w) for w in words[:restrict_vocab]]
    index: dict[str, int] = {}
    for i in reversed(range(len(keys))):  # the most frequent spelling wins
        index[keys[i]] = i
    table = _unit(np.asarray(vectors[: len(keys)], dtype=np.float64))  # (N, d) unit rows
    for section in sections:
        section.correct = section.answered = 0
        known = [tuple(fold(w) for w in q) for q in section.questions]
        known = [q for q in known if all(w in index for w in q)]
        section.answered = len(known)
        for start in range(0, len(known), BATCH):
            chunk = known[start : start + BATCH]
            ids = np.array([[index[w] for w in q] for q in chunk])  # (Q, 4): a, b, c, expected
            target = _unit(table[ids[:, 1]] - table[ids[:, 0]] + table[ids[:, 2]])  # (Q, d) unit(b - a + c)
            similarity = target @ table.T  # (Q, N)
            top = min(8, similarity.shape[1])
            nearest = np.argpartition(-similarity, top - 1, axis=1)[:, :top]  # (Q, 8), unordered
            order = np.take_along_axis(similarity, nearest, axis=1).argsort(axis=1)[:, ::-1]
            nearest = np.take_along_axis(nearest, order, axis=1)  # most similar first
            for question, row, candidates in zip(chunk, ids, nearest, strict=True):
                predicted = None
                for j in candidates:
                    if j in row[:3]:
                        continue
                    predicted = keys[j]
                    if predicted not in question[:3]:
                        break
                section.correct += predicted == question[3]
    return AnalogyResult(sections, restrict_vocab)


def analogy_accuracy(bundle, path: str | Path, *, restrict_vocab: int = 30_000, target: bool = False) -> AnalogyResult:
    """Score a model's W_E (a Word2Vec run, a Transformer's, a pretrained model's) on a questions-words file.

    The candidate words are the vocabulary's non-special tokens in id order, each as the text it decodes to
    (a word tokenizer's ids run from the most frequent word; a BPE's follow its merges instead)."""
    from qkv.inspect.embeddings import embedding_matrix, special_ids

    sections = read_analogies(path)
    table, tokenizer = embedding_matrix(bundle, target=target)
    specials = special_ids(tokenizer)
    ids = [i for i in range(tokenizer.vocab_size) if i not in specials]
    words = [tokenizer.decode([i]).strip() for i in ids]
    result = evaluate_analogies(table[ids], words, sections, restrict_vocab=restrict_vocab)
    if not result.answered:
        raise QkvError(
            f"none of the {result.questions} questions in {path} has all four words among the model's "
            f"{min(restrict_vocab, len(ids))} most frequent words: train on a larger corpus or raise --restrict-vocab"
        )
    return result
