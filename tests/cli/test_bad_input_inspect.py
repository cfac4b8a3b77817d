"""Bad input to the inspection, quantization and serving verbs: one line naming the problem and the fix, exit
code 2, before any work; input that runs but is partly unknown gets its one `note:` line."""

from __future__ import annotations

import pytest
import torch

from qkv.model_dir import save_model_dir
from qkv.models import Transformer, TransformerConfig, Word2VecConfig
from qkv.models.family import build_model
from qkv.tokenizers.char import CharTokenizer
from qkv.tokenizers.word import WordTokenizer
from tests.cli.test_bad_input import assert_one_line_error, run_cli


@pytest.fixture(scope="module")
def runs(tiny_run, tmp_path_factory):
    """The gpt-nano run `qkv train` made, a tiny translator (context 24) and a tiny Word2Vec, by name."""
    root = tmp_path_factory.mktemp("inspect-bad")
    tok = CharTokenizer.train("the quick brown fox jumps over the lazy dog")
    torch.manual_seed(0)
    translator = Transformer(TransformerConfig(
        src_vocab_size=tok.vocab_size, tgt_vocab_size=tok.vocab_size, d_model=16, n_heads=2, n_encoder_layers=1,
        n_decoder_layers=1, context_length=24,
    ))  # fmt: skip
    words = WordTokenizer.train("king queen man woman crown")
    word2vec = build_model(Word2VecConfig(vocab_size=words.vocab_size, d_model=8))
    return {
        "gpt": tiny_run,
        "translator": save_model_dir(root / "translator", translator, tok),
        "word2vec": save_model_dir(root / "word2vec", word2vec, words),
    }


LONG = "the lazy dog " * 3  # 39 characters: more than the translator's 24 positions

BAD = [
    ("heads --batch huge", "gpt", ["heads", "--batch", "100000000", "--no-plot"],
     "--batch 100000000 must be between 1 and 4,096"),
    ("heads --batch 0", "gpt", ["heads", "--batch", "0", "--no-plot"], "--batch 0 must be between 1"),
    ("heads --seed huge", "gpt", ["heads", "--seed", str(10**23), "--no-plot"], "must be between 0 and 2**63 - 1"),
    ("heads --top 0", "gpt", ["heads", "--top", "0", "--no-plot"], "--top 0 must be at least 1"),
    ("heads --top -2", "gpt", ["heads", "--top", "-2", "--no-plot"], "--top -2 must be at least 1"),
    ("attribute --top 0", "gpt", ["attribute", "hello", "--top", "0", "--no-plot"], "--top 0 must be at least 1"),
    ("attribute --top -1", "gpt", ["attribute", "hello", "--top", "-1", "--no-plot"], "--top -1 must be at least 1"),
    ("patch --top -1", "gpt", ["patch", "--clean", "hello", "--corrupt", "world", "--top", "-1", "--no-plot"],
     "--top -1 must be at least 1"),
    ("lens --target too long", "translator", ["lens", "the dog", "--target", LONG, "--no-plot"],
     "the target text is 39 tokens long but the model's context takes at most 23 after <bos>"),
    ("attention --target too long", "translator", ["attention", "the dog", "--target", LONG],
     "the target text is 39 tokens long"),
    ("quantize a Word2Vec run", "word2vec", ["quantize", "--out", "{tmp}/q"], "Word2Vec (one matrix of word vectors"),
    ("embeddings --positions of Word2Vec", "word2vec", ["embeddings", "--positions", "{tmp}/p.png"],
     "adds no positions to its vectors"),
    ("serve a Word2Vec run", "word2vec", ["serve"], "qkv serve has nothing to show for Word2Vec"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "model", "argv", "fragment"), BAD, ids=[b[0] for b in BAD])
def test_refused_in_one_line(runs, tmp_path, capsys, name, model, argv, fragment) -> None:
    verb, *rest = [a.format(tmp=tmp_path) for a in argv]
    assert_one_line_error(*run_cli(capsys, verb, str(runs[model]), *rest), fragment)
    assert not list(tmp_path.iterdir())  # refused before anything was written


NOTES = [
    ("lens text", "gpt", ["lens", "hello 你好", "--no-plot"], "note: 2 of 8 tokens of the text became <unk>"),
    ("lens --target", "translator", ["lens", "the dog", "--target", "the 你", "--no-plot"],
     "note: 1 of 5 tokens of the target became <unk>"),
    ("attention --target", "translator", ["attention", "the dog", "--target", "你 dog", "--out", "{tmp}/a.png"],
     "note: 1 of 5 tokens of the target became <unk>"),
    ("quantize --calibrate", "gpt", ["quantize", "--out", "{tmp}/q", "--calibrate", "{tmp}/calibration.txt"],
     "note: 2 of 14 tokens of the calibration text became <unk>"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "model", "argv", "note"), NOTES, ids=[n[0] for n in NOTES])
def test_unknown_tokens_get_one_note(runs, tmp_path, capsys, name, model, argv, note) -> None:
    (tmp_path / "calibration.txt").write_text("hello 你好 world")
    verb, *rest = [a.format(tmp=tmp_path) for a in argv]
    code, err = run_cli(capsys, verb, str(runs[model]), *rest)
    assert code == 0, err
    assert [line for line in err.splitlines() if line.startswith("note:")] == [line for line in err.splitlines()
                                                                              if note in line], err  # fmt: skip
    assert note in err


@pytest.fixture
def busy_port():
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        yield held.getsockname()[1]


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--port", "{busy}"], "port {busy} on 127.0.0.1 is in use"),
        (["--host", "192.0.2.7", "--port", "0"], "--host 192.0.2.7 is not an address of this machine"),  # TEST-NET-1
        (["--host", "no-such-host.invalid", "--port", "0"], "--host no-such-host.invalid is not a name or address"),
    ],
)
def test_serve_where_it_cannot_listen(tiny_run, capsys, busy_port, flags, fragment) -> None:
    """Before the model loads and before uvicorn starts (it printed its log and exited with 3)."""
    argv = [f.format(busy=busy_port) for f in flags]
    assert_one_line_error(*run_cli(capsys, "serve", str(tiny_run), *argv), fragment.format(busy=busy_port))
