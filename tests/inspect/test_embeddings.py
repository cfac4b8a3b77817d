"""Embeddings: exact analogies and neighbours on hand-built tables; PCA; the positional table."""

from __future__ import annotations

import numpy as np
import pytest

from qkv.errors import QkvError
from qkv.inspect import (
    analogy,
    analogy_of,
    cosine_similarities,
    draw_embedding_map,
    draw_positional_table,
    embedding_matrix,
    nearest_neighbours,
    neighbours_of,
    pca_2d,
    png_size,
    positional_table,
)
from qkv.layers.positional import sinusoidal_table

# Axes: royalty, maleness, femaleness, fruitiness. king - man + woman = queen exactly.
WORDS = ["king", "queen", "man", "woman", "apple", "prince"]
TABLE = np.array(
    [
        [1.0, 1.0, 0.0, 0.0],  # king
        [1.0, 0.0, 1.0, 0.0],  # queen
        [0.0, 1.0, 0.0, 0.0],  # man
        [0.0, 0.0, 1.0, 0.0],  # woman
        [0.0, 0.0, 0.0, 1.0],  # apple
        [0.9, 1.0, 0.0, 0.1],  # prince: close to king
    ]
)


def test_king_minus_man_plus_woman_is_queen() -> None:
    king, queen, man, woman = 0, 1, 2, 3
    (best, similarity), *_ = analogy(TABLE, king, man, woman, k=3, normalize=False)
    assert best == queen and similarity == pytest.approx(1.0)  # E(king) - E(man) + E(woman) = E(queen)
    answers = [i for i, _ in analogy(TABLE, king, man, woman, k=10)]
    assert answers[0] == queen and not {king, man, woman} & set(answers)  # the inputs are never answers
    assert len(answers) == len(WORDS) - 3


def test_analogy_with_unit_vectors_follows_word2vec() -> None:
    unit = TABLE / np.linalg.norm(TABLE, axis=1, keepdims=True)
    target = unit[0] - unit[2] + unit[3]
    expected = max((i for i in range(6) if i not in (0, 2, 3)), key=lambda i: unit[i] @ target / np.linalg.norm(target))
    assert analogy(TABLE, 0, 2, 3)[0][0] == expected == 1


def test_nearest_neighbours_are_ranked_by_cosine() -> None:
    found = nearest_neighbours(TABLE, TABLE[0], k=3, exclude={0})
    # cos(king, prince) = 1.9 / (sqrt(2) sqrt(1.82)), cos(king, man) = 1 / sqrt(2), cos(king, queen) = 1 / 2
    assert [i for i, _ in found] == [5, 2, 1]
    assert [s for _, s in found] == pytest.approx([1.9 / np.sqrt(2 * 1.82), 1 / np.sqrt(2), 0.5])
    cos = cosine_similarities(TABLE, TABLE[0])
    assert cos[0] == pytest.approx(1.0) and cos[4] == 0.0


def test_pca_recovers_points_on_a_line_and_a_plane() -> None:
    rng = np.random.default_rng(0)
    t = rng.normal(size=(20, 2))
    basis = np.linalg.qr(rng.normal(size=(6, 2)))[0].T  # two orthonormal directions in 6-D
    rows = 3.0 + t @ basis
    points, explained = pca_2d(rows)
    assert sum(explained) == pytest.approx(1.0)
    # Distances are preserved: the rows lie in a plane, so the 2-D map is exact up to rotation.
    d_rows = np.linalg.norm(rows[:, None] - rows[None], axis=-1)
    d_points = np.linalg.norm(points[:, None] - points[None], axis=-1)
    np.testing.assert_allclose(d_points, d_rows, atol=1e-9)
    with pytest.raises(QkvError, match="at least two"):
        pca_2d(rows[:1])


def test_neighbours_and_analogy_on_a_model_use_its_w_e(gpt) -> None:
    table, tok = embedding_matrix(gpt)
    assert table.shape == (tok.vocab_size, 16)
    found = neighbours_of(gpt, "e", k=3)
    e = tok.token_to_id("e")
    expected = nearest_neighbours(table, table[e], k=3, exclude={e, 0, 1, 2, 3})
    assert found == [(tok.id_to_token(i), s) for i, s in expected]
    answers = analogy_of(gpt, "a", "b", "c", k=40)
    assert {"a", "b", "c", "<pad>", "<unk>"}.isdisjoint(t for t, _ in answers)
    with pytest.raises(QkvError, match="not one token of this vocabulary"):
        neighbours_of(gpt, "king")
    with pytest.raises(QkvError, match="for translators"):
        embedding_matrix(gpt, target=True)


def test_positional_tables(translator, gpt) -> None:
    table, title = positional_table(translator, length=20)
    np.testing.assert_allclose(table, sinusoidal_table(20, 16).double().numpy(), atol=1e-7)
    assert "sinusoidal" in title
    learned, title = positional_table(gpt, length=100)
    assert learned.shape == (32, 16) and "learned" in title  # capped at the model's context
    np.testing.assert_allclose(learned, gpt.model.embedding.positional_encoding.weight.detach().double().numpy())
    plain, _ = positional_table(None, length=10, d_model=8)
    np.testing.assert_allclose(plain, sinusoidal_table(10, 8).double().numpy())


def test_the_pictures_are_pngs_of_the_expected_size(tmp_path) -> None:
    points, explained = pca_2d(TABLE)
    picture = draw_embedding_map(points, WORDS, tmp_path / "e.png", explained=explained)
    assert picture.panels == 1 and png_size(picture.path) == (850, 700)
    picture = draw_positional_table(sinusoidal_table(50, 32).numpy(), tmp_path / "p.png")
    assert png_size(picture.path) == (picture.width, picture.height) and picture.width > picture.height
    with pytest.raises(QkvError, match="does not end in .png"):
        draw_positional_table(sinusoidal_table(5, 4).numpy(), tmp_path / "p.jpg")


def test_neighbours_all_alike_get_a_note() -> None:
    """Word2Vec after one epoch on the built-in text listed every neighbour at cosine 1.00, with no word."""
    from qkv.inspect.embeddings import alike_note

    assert "still point almost the same way" in alike_note([[("a", 0.999), ("b", 0.995)], [("c", 0.991)]])
    assert alike_note([[("a", 0.999), ("b", 0.42)]]) is None and alike_note([[("a", 1.0)]]) is None
