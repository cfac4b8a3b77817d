"""A LoRA run made by `qkv train --from ... --lora ...`, used by the verbs as a user types them (generate, chat, eval,
lens, serve, export), each answer checked against the adapted model itself (qkv.load: the base plus the adapters);
and the fine-tuning flags that would change the model, refused with one line."""

from __future__ import annotations

import io
import json
import math

import httpx
import pytest
import torch
import torch.nn.functional as F

import qkv
from qkv.cli import main
from qkv.layers.lora import LoRALinear
from qkv.server import BackgroundServer, create_app

TEXT = "the cat sat on the mat and the dog sat on the log. " * 40


def train(root, base, *flags: str) -> list[str]:
    (root / "text.txt").write_text(TEXT)
    return ["train", "--from", str(base), "--data", str(root / "text.txt"), "--steps", "4", "--seq-len", "32",
            "--batch-size", "2", "--eval-interval", "2", "--eval-batches", "1", "--threads", "1", *flags]  # fmt: skip


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory, tiny_llama_dir) -> str:
    root = tmp_path_factory.mktemp("lora-cli")
    assert main([*train(root, tiny_llama_dir, "--lora", "4", "--lora-targets", "all", "--lr", "0.01"),
                 "--out", str(root / "run"), "--quiet", "--no-samples"]) == 0  # fmt: skip
    return str(root / "run")


def test_train_says_the_loss_before_and_after(capsys, tmp_path, tiny_llama_dir) -> None:
    assert main([*train(tmp_path, tiny_llama_dir, "--lora", "2"), "--out", str(tmp_path / "r"), "--no-samples"]) == 0
    err = capsys.readouterr().err
    assert "LoRA rank 2 (alpha 4) on q_proj, v_proj" in err and "before training: val_loss" in err
    assert "(before training: " in err and f"qkv merge {tmp_path / 'r'} --out" in err


def test_generate_greedy_is_the_adapted_models_argmax(capsys, lora_run) -> None:
    assert main(["generate", lora_run, "--prompt", "the c", "--max-new-tokens", "6", "--temperature", "0"]) == 0
    out = capsys.readouterr().out
    assert out == "the c" + qkv.complete(qkv.load(lora_run), "the c", max_new_tokens=6, temperature=0).text + "\n"


def test_chat_answers_as_qkv_chat_does(monkeypatch, capsys, lora_run) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("Hi\n"))
    assert main(["chat", lora_run, "--temperature", "0", "--max-new-tokens", "6"]) == 0
    expected = qkv.chat(qkv.load(lora_run), [{"role": "user", "content": "Hi"}], temperature=0, max_new_tokens=6)
    assert capsys.readouterr().out.splitlines() == expected.text.splitlines()


def test_eval_is_the_cross_entropy_of_the_adapted_model(capsys, lora_run, tmp_path) -> None:
    text = "the cat sat on the log"
    (tmp_path / "t.txt").write_text(text)
    assert main(["eval", lora_run, str(tmp_path / "t.txt"), "--json"]) == 0
    score = json.loads(capsys.readouterr().out)
    bundle = qkv.load(lora_run)
    assert any(isinstance(m, LoRALinear) for m in bundle.model.modules())
    ids = torch.tensor(bundle.tokenizer.encode(text))
    with torch.no_grad():
        expected = F.cross_entropy(bundle.model(ids[None, :-1])[0], ids[1:]).item()
    assert score["loss"] == pytest.approx(expected, abs=1e-5) and score["perplexity"] == pytest.approx(
        math.exp(expected)
    )


def test_lens_last_row_is_the_adapted_models_prediction(capsys, lora_run) -> None:
    assert main(["lens", lora_run, "the cat", "--no-plot", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    bundle = qkv.load(lora_run)
    with torch.no_grad():
        logits = bundle.model(torch.tensor([bundle.tokenizer.encode("the cat")]))[0]
    assert [f["id"] for f in data["final"]] == logits.argmax(-1).tolist()


def test_serve_answers_with_the_adapted_model(lora_run) -> None:
    bundle = qkv.load(lora_run)
    with BackgroundServer(create_app(bundle)) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        body = {"messages": [{"role": "user", "content": "Hi"}], "temperature": 0, "max_tokens": 5}
        response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    expected = qkv.chat(qkv.load(lora_run), body["messages"], temperature=0, max_new_tokens=5).text
    assert response.json()["choices"][0]["message"]["content"] == expected


def test_merge_and_export_write_the_adapted_model(capsys, lora_run, tmp_path) -> None:
    assert main(["merge", lora_run, "--out", str(tmp_path / "merged")]) == 0
    assert main(["export", lora_run, "--gguf", str(tmp_path / "lora.gguf"), "--gguf-type", "f32"]) == 0
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        adapted = qkv.load(lora_run).model(ids)
        torch.testing.assert_close(qkv.load(tmp_path / "merged").model(ids), adapted, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(qkv.load(tmp_path / "lora.gguf").model(ids), adapted, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--lora", "2", "--d-model", "64"], "--from keeps the pretrained model's shape: drop --d-model"),
        (["--arch", "gpt"], "--from keeps the pretrained model's architecture and tokenizer: drop --arch"),
        (["--lora", "2", "--lora-targets", "q_proj,wq"], "--lora-targets: 'wq' is not a projection of llama models"),
        (["--lora-alpha", "4"], "--lora-alpha set up LoRA: add --lora RANK"),
        (["--lora", "2", "--seq-len", "999"], "--seq-len 999 is longer than the model's context (128 tokens)"),
    ],
)
def test_flags_that_do_not_fit_are_one_line(capsys, tmp_path, tiny_llama_dir, flags, message) -> None:
    assert main([*train(tmp_path, tiny_llama_dir, *flags), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_a_resumed_run_keeps_its_base_and_adapters(capsys, lora_run, tiny_llama_dir) -> None:
    assert main(["train", "--resume", lora_run, "--lora", "8", "--steps", "6"]) == 2
    assert "a resumed run keeps its model; drop --lora" in capsys.readouterr().err
