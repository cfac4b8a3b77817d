"""Fine-tuning a pretrained language model (``qkv train --from MODEL``): every weight, or LoRA adapters.

    pretrained model (a run, a Hugging Face folder, a .gguf) -> qkv.load -> [int8 base] -> [LoRA adapters]
        -> its own tokenizer encodes the data: plain text (windows of --seq-len tokens) or chat data (JSON lines
           of {"messages": [...]}, rendered with its chat template, the loss on the assistant's tokens only)
        -> the trainer (the loss on the held-out data first, so the run shows what fine-tuning changed)
        -> the run folder: the whole model (model.safetensors), or the adapters in PEFT's layout
           (adapter_config.json, adapter_model.safetensors: qkv.adapter_dir), with the model's tokenizer and
           chat template

The model keeps its architecture and tokenizer (:mod:`qkv.training.finetune_settings` refuses the flags that
would change them). A LoRA run's checkpoints hold the adapters alone (:class:`~qkv.models.lora.AdapterWeights`)
with the optimizer's state, so it resumes exactly, as every run does.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor, nn

from qkv.adapter_dir import ADAPTER_FILE, save_adapter_config, save_adapter_weights
from qkv.data.chat import ChatBatches, encode_conversations, is_chat_file, read_conversations
from qkv.data.lm import TokenBatches, encode_corpus
from qkv.data.sources import open_source
from qkv.errors import QkvError
from qkv.loading import load
from qkv.model_dir import QUANTIZATION_FILE, ModelBundle, save_model_dir
from qkv.models.family import LANGUAGE_MODEL, family_of
from qkv.models.lora import AdapterWeights, LoRASettings, adapted_targets, apply_lora, has_lora, merge_lora
from qkv.quantization.int8_linear import Int8Linear
from qkv.training.config import TrainConfig
from qkv.training.finetune_settings import DEFAULT_SEQ_LEN, lora_alpha, lora_target_names
from qkv.training.launch import Prepared
from qkv.training.run import Session, fingerprint
from qkv.training.tasks.chat import ChatTask
from qkv.training.tasks.lm_task import LanguageModelTask, check_seq_len
from qkv.training.tasks.protocol import Task


def open_base(config: TrainConfig, device: torch.device) -> ModelBundle:
    """The model to fine-tune, on ``device``: every weight trainable, or (``config.lora``) frozen, in int8 if
    asked, with LoRA adapters added. A LoRA run given as the base has its adapters merged first."""
    assert config.init_from is not None  # fine-tuning is the task of runs given --from
    group = config.base_group_size if config.quantize_base else None
    bundle = load(config.init_from, device=device, quantize=config.quantize_base, group_size=group, dequantize=True)
    model = bundle.model
    if config.quantize_base and group is None:  # the run records the default it got, to reopen the same base
        config.base_group_size = next((m.group_size for m in model.modules() if isinstance(m, Int8Linear)), None)
    family_of(model).require_role(LANGUAGE_MODEL, "--from (fine-tuning)")
    if has_lora(model):
        merge_lora(model)
    if not config.lora:
        model.requires_grad_(True)
        return bundle
    settings = LoRASettings(config.lora, lora_alpha(config), config.lora_dropout, lora_target_names(config))
    apply_lora(model, settings)
    return bundle


def base_path(init_from: str) -> str:
    """Where the base lies, as adapter_config.json records it: an absolute path (a Hub name stays as it is)."""
    path = Path(init_from).expanduser()
    return str(path.resolve()) if path.exists() else init_from


def prepare_finetune(
    config: TrainConfig, resume_dir: Path | None, session: Session, say: Callable[[str], None]
) -> Prepared:
    """The pretrained model (LoRA applied), its data and what the run folder saves (see the module docstring)."""
    bundle = open_base(config, session.device)
    model, model_config = bundle.model, bundle.config
    context = family_of(model_config).context_length(model_config)
    assert context is not None  # a language model's (open_base checks)
    seq_len = check_seq_len(config.seq_len or min(context, DEFAULT_SEQ_LEN), context)
    task, data_info, data_line = _data(config, bundle, seq_len, session)
    save_start, save_best = _savers(config, bundle)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    what = (
        f"LoRA rank {config.lora} (alpha {lora_alpha(config):g}) on {', '.join(adapted_targets(model))}"
        if config.lora
        else "every weight"
    )
    scales = f"a scale per {config.base_group_size} weights" if config.base_group_size else "a scale per row"
    base = f" over an int8 base ({scales})" if config.quantize_base else ""
    return Prepared(
        model,
        task,
        bundle.tokenizer,
        data_info={**data_info, "init_from": config.init_from},
        summary=[
            f"fine-tuning {config.init_from} ({family_of(model).describe(model_config)}): {what}{base}, "
            f"{trainable:,} of {total:,} parameters train; sequences of up to {seq_len} tokens",
            data_line,
        ],
        save_start=save_start,
        save_best=save_best,
        checkpointed=AdapterWeights(model) if config.lora else None,
        evaluate_first=resume_dir is None,
    )


def _data(config: TrainConfig, bundle: ModelBundle, seq_len: int, session: Session) -> tuple[Task, dict, str]:
    """The task (plain text or conversations), the data's fingerprint and the summary line."""
    tokenizer = bundle.tokenizer
    if is_chat_file(config.data):
        assert config.data is not None  # is_chat_file is False for none
        if bundle.chat_template is None:
            raise QkvError(
                f"{config.data} holds conversations, and {config.init_from} has no chat template to render them "
                "with: fine-tune a chat model, or give plain text"
            )
        conversations, sha256 = read_conversations(config.data)
        examples = encode_conversations(bundle, conversations, seq_len, where=str(config.data))
        pad = next((i for i in (tokenizer.pad_id, tokenizer.eos_id) if i is not None), 0)
        chats = ChatBatches(examples, pad_id=pad, val_fraction=config.val_fraction, seed=config.seed)
        task: Task = ChatTask(
            chats,
            batch_size=config.batch_size,
            eval_batches=config.eval_batches,
            device=session.device,
            label_smoothing=config.label_smoothing,
        )
        line = (
            f"data: {len(chats.train)} conversations to train on ({chats.n_train_tokens:,} assistant tokens), "
            f"{len(chats.val)} held out ({chats.n_val_tokens:,}), rendered with the model's chat template"
        )
        return task, {"name": Path(config.data).name, "source": str(config.data), "sha256": sha256}, line
    source = open_source(config.data, text_field=config.text_field)
    text = source.read_text()  # one encode call: a pretrained tokenizer may treat a text's start specially
    ids = encode_corpus(text, tokenizer)
    if len(ids) < 2 * (seq_len + 1):
        raise QkvError(
            f"{source.name} is {len(ids):,} tokens long in the model's tokenizer, too short for training and "
            f"validation windows of {seq_len + 1}: give more text, or a shorter --seq-len"
        )
    batches = TokenBatches(ids, context_length=seq_len, val_fraction=config.val_fraction, seed=config.seed)
    task = LanguageModelTask(
        batches,
        batch_size=config.batch_size,
        eval_batches=config.eval_batches,
        device=session.device,
        label_smoothing=config.label_smoothing,
        fused_loss=True,
    )
    line = (
        f"data: {source.name}, {batches.n_train_tokens:,} training / {batches.n_val_tokens:,} validation tokens "
        "in the model's tokenizer"
    )
    return task, {"name": source.name, "source": source.description, "sha256": fingerprint(text)}, line


def _savers(config: TrainConfig, bundle: ModelBundle) -> tuple[Callable, Callable]:
    """What the run folder holds: at the start (the model's config, tokenizer and chat template; a LoRA run's
    adapter_config.json) and for the best model (the whole model, or the adapters)."""
    model, tokenizer, template = bundle.model, bundle.tokenizer, bundle.chat_template

    def save_start(run_dir: Path) -> None:
        save_model_dir(run_dir, model, tokenizer, weights_name=None, chat_template=template)
        if config.lora:
            (run_dir / QUANTIZATION_FILE).unlink(missing_ok=True)  # an int8 base is rebuilt from the base, not here
            settings = LoRASettings(config.lora, lora_alpha(config), config.lora_dropout, adapted_targets(model))
            assert config.init_from is not None  # open_base loaded the base from it
            save_adapter_config(run_dir, model, settings, base=base_path(config.init_from))

    def save_best(run_dir: Path, trained: nn.Module, weights: dict[str, Tensor] | None) -> None:
        if config.lora:
            save_adapter_weights(run_dir / ADAPTER_FILE, trained)
        else:
            save_model_dir(run_dir, trained, tokenizer, state=weights, chat_template=template)

    return save_start, save_best
