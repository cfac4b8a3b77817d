"""A view a family lacks is refused with the same one line by the command line (stderr, exit code 2), by the
server (the error's message) and in /v1/model's list of what the model does not offer: the family's line."""

from __future__ import annotations

import pytest

from qkv.cli import main
from qkv.errors import QkvError
from qkv.model_dir import load_model_dir, save_model_dir
from qkv.models import Word2VecConfig
from qkv.models.family import family_of, refusal
from qkv.models.word2vec import Word2Vec
from qkv.server import create_app
from qkv.tokenizers import CharTokenizer
from tests.server.conftest import TEXT, error_of


def cli_error(capsys, *argv: str) -> str:
    """The one stderr line of a command that must fail with exit code 2, without the "qkv VERB: error: " head."""
    assert main(list(argv)) == 2
    err = capsys.readouterr().err
    head = f"qkv {argv[0]}: error: "
    assert err.startswith(head) and err.count("\n") == 1 and err.endswith("\n"), err
    return err[len(head) : -1]


def test_the_walkthrough_is_refused_with_one_line_everywhere(capsys, tmp_path, monkeypatch, encoder) -> None:
    line = "the walk-through needs a language model, and this is an encoder (BERT family): use `qkv embed` with it"
    monkeypatch.chdir(tmp_path)
    assert cli_error(capsys, "lens", str(encoder.bundle.path), "one two", "--no-plot", "--html", "w.html") == line
    assert not (tmp_path / "w.html").exists()
    assert error_of(encoder.client.post("/v1/walkthrough", json={"text": "one two"}), 404) == line
    assert encoder.client.get("/v1/model").json()["unavailable"]["/v1/walkthrough"] == line


def test_next_token_prediction_is_refused_with_one_line_everywhere(capsys, encoder) -> None:
    line = refusal(family_of("encoder"), "unembedding", "next-token prediction")
    assert line.startswith("next-token prediction needs an unembedding, and an encoder (BERT family) has none: ")
    assert error_of(encoder.client.post("/v1/next-token", json={"prompt": "one two"}), 404) == line
    assert cli_error(capsys, "next", str(encoder.bundle.path), "one two", "--no-plot") == line


def test_a_model_with_nothing_to_serve_is_refused_before_it_listens(capsys, tmp_path) -> None:
    tokenizer = CharTokenizer.train(TEXT)
    model = Word2Vec(Word2VecConfig(vocab_size=tokenizer.vocab_size, d_model=8))
    path = save_model_dir(tmp_path / "w2v", model, tokenizer)
    title = "Word2Vec (one matrix of word vectors, no Transformer)"
    line = f"qkv serve has nothing to show for {title}: use `qkv embeddings`"
    with pytest.raises(QkvError) as error:
        create_app(load_model_dir(path))
    assert str(error.value) == line
    assert cli_error(capsys, "serve", str(path), "--port", "0") == line
