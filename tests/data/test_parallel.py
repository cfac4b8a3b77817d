"""Parallel text: the encoder reads sources[i], the decoder learns to write targets[i]; loading and splitting."""

from __future__ import annotations

from pathlib import Path

import pytest

from qkv.data.parallel import ParallelCorpus, load_parallel, split_parallel
from qkv.errors import QkvError
from tests.conftest import shared_corpus


def write(path: Path, text: str) -> Path:
    path.write_bytes(text.encode("utf-8"))
    return path


def test_tsv_pairs_with_attribution_columns_crlf_and_whitespace(tmp_path: Path) -> None:
    lines = ["Go.\tVa !\tCC-BY 2.0 (France) Attribution: tatoeba.org #2877272", "  Run!\t Cours !  ", "Hi.\tSalut."]
    tsv = write(tmp_path / "pairs.tsv", "\r\n".join(lines[:2]) + "\r\n" + lines[2] + "\n")
    corpus = load_parallel(tsv)
    assert corpus.sources == ["Go.", "Run!", "Hi."]
    assert corpus.targets == ["Va !", "Cours !", "Salut."]  # third column ignored, \r and outer spaces gone
    assert (len(corpus), corpus.name, corpus.source) == (3, "pairs", str(tsv))
    assert "pairs=3" in repr(corpus)


def test_final_newline_is_optional(tmp_path: Path) -> None:
    with_newline = load_parallel(write(tmp_path / "a.tsv", "a\tb\nc\td\n"))
    without = load_parallel(write(tmp_path / "b.tsv", "a\tb\nc\td"))
    assert with_newline.sources == without.sources == ["a", "c"]
    assert with_newline.targets == without.targets == ["b", "d"]


def test_only_newline_separates_lines(tmp_path: Path) -> None:
    # str.splitlines would also split on \u2028, \x0c, \x1c, \x85 and shift one file against the other
    odd = "one\u2028two\x0cthree\x1cfour\x85five"
    corpus = load_parallel((write(tmp_path / "x.en", f"{odd}\nsix\n"), write(tmp_path / "x.fr", "un\nsix\n")))
    assert corpus.sources == [odd, "six"] and corpus.targets == ["un", "six"]


def test_two_line_aligned_files(tmp_path: Path) -> None:
    en = write(tmp_path / "train.en", "Two dogs play.\r\nA man runs.\n")
    de = write(tmp_path / "train.de", "\ufeffZwei Hunde spielen.\nEin Mann läuft.\n")  # a BOM is dropped
    corpus = load_parallel((en, de))
    assert corpus.sources == ["Two dogs play.", "A man runs."]
    assert corpus.targets == ["Zwei Hunde spielen.", "Ein Mann läuft."]
    assert corpus.name == "train" and str(en) in corpus.source and str(de) in corpus.source
    assert load_parallel([str(en), str(de)]).targets == corpus.targets  # a list of strings works too
    other = load_parallel((en, write(tmp_path / "other.de", "a\nb\n")))
    assert other.name == "train-other"


def test_misaligned_files_name_both_counts(tmp_path: Path) -> None:
    en = write(tmp_path / "a.en", "".join(f"line {i}\n" for i in range(100)))
    de = write(tmp_path / "a.de", "".join(f"Zeile {i}\n" for i in range(98)))
    with pytest.raises(QkvError, match=r"^a\.en has 100 lines but a\.de has 98: the files must be line-aligned"):
        load_parallel((en, de))


def test_tsv_line_without_tab(tmp_path: Path) -> None:
    lines = [f"s{i}\tt{i}" for i in range(1, 17)] + ["no tab here", "s18\tt18"]
    tsv = write(tmp_path / "pairs.tsv", "\n".join(lines) + "\n")
    with pytest.raises(QkvError, match=r"^line 17 of pairs\.tsv has no tab: each line must be source<TAB>target$"):
        load_parallel(tsv)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a\tb\n\nc\td\n", r"^line 2 of p\.tsv is empty: remove it"),
        ("a\tb\n   \t  \n", r"^line 2 of p\.tsv is empty"),
        ("a\tb\nc\td\n\tfr\n", r"^line 3 of p\.tsv has an empty source sentence: remove the line or fill it in$"),
        ("a\tb\nc\td\ne\tf\nx\t \tattribution\n", r"^line 4 of p\.tsv has an empty target sentence"),
        ("a\tb\n\n", r"^line 2 of p\.tsv is empty"),  # one final newline is fine, a blank last line is not
    ],
)
def test_tsv_empty_lines_and_sides_are_errors(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(QkvError, match=message):
        load_parallel(write(tmp_path / "p.tsv", text))


def test_empty_sentence_in_two_files_names_both_lines(tmp_path: Path) -> None:
    en = write(tmp_path / "a.en", "one\ntwo\nthree\nfour\nfive\n")
    fr = write(tmp_path / "a.fr", "un\ndeux\ntrois\nquatre\n \n")
    message = r"^line 5 of a\.fr has an empty target sentence: remove it \(and line 5 of a\.en\) or fill it in$"
    with pytest.raises(QkvError, match=message):
        load_parallel((en, fr))
    with pytest.raises(QkvError, match=r"^line 5 of a\.fr has an empty source sentence"):
        load_parallel((fr, en))


def test_bad_arguments_and_unreadable_files(tmp_path: Path) -> None:
    a = write(tmp_path / "a.en", "x\n")
    with pytest.raises(QkvError, match="one TSV file or a pair"):
        load_parallel((a, a, a))
    with pytest.raises(QkvError, match="does not exist"):
        load_parallel(tmp_path / "missing.tsv")
    with pytest.raises(QkvError, match="is empty"):
        load_parallel(write(tmp_path / "empty.tsv", "\n"))
    (tmp_path / "latin1.fr").write_bytes("café\n".encode("latin-1"))
    with pytest.raises(QkvError, match="not valid UTF-8: byte 0xe9"):
        load_parallel((a, tmp_path / "latin1.fr"))
    with pytest.raises(QkvError, match="1 sources but 0 targets"):
        ParallelCorpus(["a"], [], name="x", source="test")


def numbered(n: int) -> ParallelCorpus:
    return ParallelCorpus([f"s{i}" for i in range(n)], [f"t{i}" for i in range(n)], name="numbers", source="test")


def test_split_is_deterministic_disjoint_and_complete() -> None:
    corpus = numbered(1000)
    train, val = split_parallel(corpus, 0.1, seed=3)
    assert (len(train), len(val)) == (900, 100)
    assert set(train.sources).isdisjoint(val.sources)
    assert sorted(train.sources + val.sources) == sorted(corpus.sources)
    for part in (train, val):  # pairs stay pairs, in corpus order
        assert [s[1:] for s in part.sources] == [t[1:] for t in part.targets]
        assert [int(s[1:]) for s in part.sources] == sorted(int(s[1:]) for s in part.sources)
    again_train, again_val = split_parallel(corpus, 0.1, seed=3)
    assert (again_train.sources, again_val.sources) == (train.sources, val.sources)
    _, other_val = split_parallel(corpus, 0.1, seed=4)
    assert other_val.sources != val.sources
    assert val.sources != corpus.sources[-100:] and val.sources != corpus.sources[:100]  # shuffled, not a slice
    assert "val: 100 of 1000 pairs" in val.source and train.name == "numbers"


def test_split_sizes_and_errors() -> None:
    train, val = split_parallel(numbered(10), 0.0, seed=0)
    assert (len(train), len(val)) == (10, 0)
    assert [len(part) for part in split_parallel(numbered(10), 0.01, seed=0)] == [9, 1]  # at least one for val
    with pytest.raises(QkvError, match="too few"):
        split_parallel(numbered(1), 0.5, seed=0)
    for bad in (1.0, -0.1, True):
        with pytest.raises(QkvError, match="val_fraction must be at least 0 and below 1"):
            split_parallel(numbered(10), bad, seed=0)


def test_multi30k_train_files_load_as_a_pair() -> None:
    folder = shared_corpus("multi30k")
    corpus = load_parallel((folder / "train.en", folder / "train.de"))
    assert len(corpus) == 29_000 and corpus.name == "train"
    assert corpus.sources[0] == "Two young, White males are outside near many bushes."
    assert corpus.targets[0] == "Zwei junge weiße Männer sind im Freien in der Nähe vieler Büsche."


def test_tatoeba_eng_fra_tsv_loads() -> None:
    corpus = load_parallel(shared_corpus("eng-fra") / "eng-fra.txt")
    assert len(corpus) == 135_842
    assert (corpus.sources[0], corpus.targets[0]) == ("Go.", "Va !")
