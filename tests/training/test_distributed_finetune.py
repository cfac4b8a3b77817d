"""Fine-tuning under torchrun on two CPU processes (gloo): LoRA with DDP and full fine-tuning with FSDP train what one
process trains with the same global batch."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from qkv.training.checkpoint import latest_checkpoint
from tests.training.test_distributed import run_qkv

pytestmark = pytest.mark.slow  # among the longest modules: the workers start them first (tests/conftest.py)

TEXT = "the cat sat on the mat and the dog sat on the log. " * 60


@pytest.mark.parametrize(
    "mode", [["--lora", "4", "--lora-targets", "all"], ["--strategy", "fsdp"]], ids=["ddp-lora", "fsdp"]
)
def test_two_processes_fine_tune_as_one_with_the_same_global_batch(tmp_path, tiny_llama_dir, mode) -> None:
    data = tmp_path / "text.txt"
    data.write_text(TEXT)
    common = ["train", "--from", str(tiny_llama_dir), "--data", str(data), "--steps", "4", "--seq-len", "16",
              "--warmup-steps", "1", "--eval-interval", "2", "--eval-batches", "1", "--lr", "1e-3", "--quiet",
              "--no-samples", "--threads", "1", "--device", "cpu", *mode]  # fmt: skip
    single = run_qkv(common + ["--batch-size", "4", "--out", str(tmp_path / "one")])
    assert single.returncode == 0, single.stderr
    double = run_qkv(common + ["--batch-size", "2", "--out", str(tmp_path / "two")], nproc=2)
    assert double.returncode == 0, double.stderr
    a = load_file(str(latest_checkpoint(tmp_path / "one") / "model.safetensors"))
    b = load_file(str(latest_checkpoint(tmp_path / "two") / "model.safetensors"))
    assert a.keys() == b.keys()
    assert all("lora_" in key for key in a) == ("--lora" in mode)
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=1e-5, rtol=1e-4)
    if "--lora" in mode:  # it trained: B left zero
        assert torch.count_nonzero(b["layers.decoder/blocks/0/feed_forward/linear1.lora_B"]) > 0
    else:
        start = load_file(str(tiny_llama_dir / "model.safetensors"))["model.layers.0.mlp.up_proj.weight"]
        assert not torch.equal(b["decoder.blocks.0.feed_forward.linear1.weight"], start)
