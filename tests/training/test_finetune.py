"""Fine-tuning a pretrained model (``--from``): LoRA runs in PEFT's layout, the loss before training, an exact resume,
LoRA over an int8 base, full fine-tuning, chat data, merging, and the settings refused with one line."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

import qkv
from qkv.adapter_dir import ADAPTER_CONFIG_FILE, ADAPTER_FILE
from qkv.errors import QkvError
from qkv.export.merge import merge_run
from qkv.layers.lora import LoRALinear
from qkv.quantization.int8_linear import Int8Linear
from qkv.training import TrainConfig, train_language_model
from qkv.training.checkpoint import latest_checkpoint
from qkv.training.metrics import read_metrics

TEXT = "the cat sat on the mat and the dog sat on the log. " * 60


def settings(tmp_path, base, name: str, **changes) -> TrainConfig:
    (tmp_path / "text.txt").write_text(TEXT)
    values = dict(
        init_from=str(base), data=str(tmp_path / "text.txt"), out_dir=str(tmp_path / name), lora=4, seq_len=32,
        batch_size=2, steps=6, eval_interval=3, eval_batches=2, log_interval=1, threads=1, lora_dropout=0.1,
    )  # fmt: skip
    return TrainConfig.create(**{**values, **changes})


def test_a_lora_run_saves_peft_adapters_and_the_loss_before_training(tiny_llama_dir, tmp_path) -> None:
    config = settings(tmp_path, tiny_llama_dir, "lora", lora_targets="q_proj,o_proj,down_proj")
    result = train_language_model(config, quiet=True)
    run = result.run_dir
    adapter = json.loads((run / ADAPTER_CONFIG_FILE).read_text())
    assert adapter["r"] == 4 and adapter["lora_alpha"] == 8.0
    assert adapter["target_modules"] == ["q_proj", "o_proj", "down_proj"]
    assert adapter["base_model_name_or_path"] == str(tiny_llama_dir.resolve())
    assert "model.layers.1.mlp.down_proj" in " ".join(load_file(run / ADAPTER_FILE))
    assert not (run / "model.safetensors").exists() and (run / "chat_template.jinja").is_file()
    rows = read_metrics(run)
    assert rows[0]["step"] == 0 and "val_loss" in rows[0] and result.before == {"val_loss": rows[0]["val_loss"]}
    bundle = qkv.load(run)  # the base with the adapters
    assert sum(isinstance(m, LoRALinear) for m in bundle.model.modules()) == 3 * 2
    assert bundle.chat_template is not None and not bundle.model.training


def test_a_resumed_lora_run_continues_bit_for_bit(tiny_llama_dir, tmp_path) -> None:
    straight = train_language_model(settings(tmp_path, tiny_llama_dir, "straight"), quiet=True)

    def stop_at_step_4(trainer, step: int, loss) -> None:  # noqa: ANN001, ARG001  (as Ctrl-C does)
        if step == 4:
            trainer.request_stop()

    config = settings(tmp_path, tiny_llama_dir, "resumed")
    assert train_language_model(config, quiet=True, on_step=stop_at_step_4).stopped == "interrupted"
    resumed = train_language_model(config, resume=tmp_path / "resumed", quiet=True)
    a = load_file(latest_checkpoint(straight.run_dir) / "model.safetensors")
    b = load_file(latest_checkpoint(resumed.run_dir) / "model.safetensors")
    assert a.keys() == b.keys() and all("lora_" in key for key in a)  # the checkpoint holds the adapters alone
    for key in a:
        assert torch.equal(a[key], b[key]), key
    losses = [{k: v for k, v in row.items() if k != "tokens_per_s"} for row in read_metrics(straight.run_dir)]
    assert losses == [{k: v for k, v in row.items() if k != "tokens_per_s"} for row in read_metrics(resumed.run_dir)]


def test_lora_over_an_int8_base_trains(tiny_llama_dir, tmp_path) -> None:
    config = settings(
        tmp_path, tiny_llama_dir, "int8", quantize_base="int8", lora_targets="all", lr=2e-2, steps=30,
        eval_interval=30, lora_dropout=0.0,
    )  # fmt: skip
    result = train_language_model(config, quiet=True)
    assert result.best < result.before["val_loss"] - 0.3  # the loss went down
    bundle = qkv.load(result.run_dir)  # reopened over the int8 base, as trained
    layer = bundle.model.decoder.blocks[0].self_attn.query
    assert isinstance(layer, LoRALinear) and isinstance(layer.base, Int8Linear)
    trained = json.loads((result.run_dir / "train_config.json").read_text())["train"]
    assert trained["base_group_size"] == layer.base.group_size == 32  # the default, recorded


def test_an_int8_base_reopens_with_the_group_size_it_trained_over(tiny_llama_dir, tmp_path) -> None:
    config = settings(tmp_path, tiny_llama_dir, "rows", quantize_base="int8", base_group_size=0, steps=4)
    result = train_language_model(config, quiet=True)
    adapted, merged = qkv.load(result.run_dir), qkv.load(result.run_dir, merge_adapters=True)
    layer = adapted.model.decoder.blocks[0].self_attn.query
    assert layer.base.group_size == 0 and layer.base.weight_scale.dim() == 1  # a scale per row, as trained
    ids = torch.randint(0, merged.config.vocab_size, (1, 12))
    with torch.no_grad():  # int8 base + adapters against the float base + adapters: close, not equal
        torch.testing.assert_close(adapted.model(ids), merged.model(ids), atol=0.1, rtol=0.1)
    # A run from before the group was recorded reopens with the default, 32.
    path = result.run_dir / "train_config.json"
    data = json.loads(path.read_text())
    del data["train"]["base_group_size"]
    path.write_text(json.dumps(data))
    assert qkv.load(result.run_dir).model.decoder.blocks[0].self_attn.query.base.group_size == 32


def test_full_fine_tuning_saves_the_whole_model_and_its_chat_template(tiny_llama_dir, tmp_path) -> None:
    result = train_language_model(settings(tmp_path, tiny_llama_dir, "full", lora=0, lora_dropout=0.0), quiet=True)
    bundle = qkv.load(result.run_dir)
    assert not any(isinstance(m, LoRALinear) for m in bundle.model.modules())
    assert bundle.chat_template == qkv.load(tiny_llama_dir).chat_template
    base = qkv.load(tiny_llama_dir).model
    changed = [n for n, p in bundle.model.named_parameters() if not torch.equal(p, base.get_parameter(n))]
    assert "decoder.blocks.0.feed_forward.gate.weight" in changed and "embedding.token_embedding.weight" in changed


def test_merge_writes_a_model_equal_to_base_plus_adapters(tiny_llama_dir, tmp_path) -> None:
    result = train_language_model(settings(tmp_path, tiny_llama_dir, "lora", lr=1e-2, lora_targets="all"), quiet=True)
    out = merge_run(result.run_dir, tmp_path / "merged")
    merged, adapted = qkv.load(out), qkv.load(result.run_dir)
    ids = torch.randint(0, merged.config.vocab_size, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(merged.model(ids), adapted.model(ids), atol=1e-5, rtol=1e-5)
        assert not torch.allclose(merged.model(ids), qkv.load(tiny_llama_dir).model(ids), atol=1e-4)
    assert merged.chat_template == adapted.chat_template
    with pytest.raises(QkvError, match="already holds a model: add --force"):
        merge_run(result.run_dir, out)


def test_chat_data_trains_on_the_assistant_tokens(tiny_llama_dir, tmp_path) -> None:
    lines = [
        {"messages": [{"role": "user", "content": f"Say {word}."}, {"role": "assistant", "content": f"{word}!"}]}
        for word in ("cat", "dog", "sun", "log", "mat", "hat", "top", "map")
    ]
    (tmp_path / "chat.jsonl").write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    config = settings(tmp_path, tiny_llama_dir, "chat", data=str(tmp_path / "chat.jsonl"), lr=1e-2, steps=20,
                      eval_interval=20, lora_targets="all", lora_dropout=0.0)  # fmt: skip
    result = train_language_model(config, quiet=True)
    assert result.best < result.before["val_loss"]
    assert json.loads((result.run_dir / "train_config.json").read_text())["data"]["name"] == "chat.jsonl"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (dict(model={"d_model": 64}), "--from keeps the pretrained model's shape: drop --d-model"),
        (dict(preset="gpt-nano"), "--from keeps the pretrained model's architecture and tokenizer: drop --preset"),
        (dict(tokenizer="bpe"), "drop --tokenizer"),
        (dict(init_from=None), "--lora, --lora-dropout adapt a pretrained model: add --from MODEL"),
        (dict(lora=0, quantize_base="int8"), "--quantize-base set up LoRA: add --lora RANK"),
        (dict(quantize_base="int4"), "--quantize-base 'int4' is unknown"),
        (dict(quantize_base="int8", base_group_size=20), "--base-group-size 20 must be 0 .* or a multiple of 32"),
        (dict(base_group_size=0), "--base-group-size 0 sizes the groups of an int8 base: add --quantize-base int8"),
        (dict(strategy="fsdp"), "--strategy fsdp shards every weight for full fine-tuning"),
        (dict(optimizer="muon"), "LoRA's low-rank factors train with AdamW"),
        (dict(task="translate"), "--from fine-tunes language models"),
    ],
)
def test_settings_that_do_not_fit_fine_tuning_are_one_line(tmp_path, changes, message) -> None:
    from qkv.training.config import flag_names

    with flag_names(), pytest.raises(QkvError, match=message.replace("(", r"\(")) as error:
        settings(tmp_path, "base-model", "refused", **changes)
    assert "\n" not in str(error.value)


def test_a_sequence_longer_than_the_context_is_refused(tiny_llama_dir, tmp_path) -> None:
    with pytest.raises(QkvError, match=r"--seq-len 500 is longer than the model's context \(128 tokens\)"):
        train_language_model(settings(tmp_path, tiny_llama_dir, "long", seq_len=500), quiet=True)
