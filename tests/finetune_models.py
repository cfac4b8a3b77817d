"""Tiny pretrained models for the fine-tuning tests, written by transformers (the reference we did not write): a
random Llama and a random GPT-2, each with a byte-level BPE tokenizer (every text encodes) and a ChatML chat
template, so chat data renders without the real SmolLM2 file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
    "'\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def write_tokenizer(folder: Path) -> int:
    """A byte-level BPE over the 256 bytes (a few merges) with ChatML's special tokens; returns the vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.processors import ByteLevel as ByteLevelProcessor
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    alphabet = list(bytes_to_unicode().values())
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("Ġ", "a"), ("i", "n")]
    vocab = {token: i for i, token in enumerate(alphabet + ["".join(m) for m in merges])}
    tokenizer = Tokenizer(models.BPE(vocab, merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = ByteLevelProcessor(trim_offsets=False)
    tokenizer.add_special_tokens(SPECIAL)
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "chat_template": CHATML}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return tokenizer.get_vocab_size()


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Hugging Face folder: a random 2-layer LlamaForCausalLM (grouped-query attention, untied W_U)."""
    transformers = pytest.importorskip("transformers")
    import torch

    folder = tmp_path_factory.mktemp("tiny-llama")
    vocab = write_tokenizer(folder)
    config = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=False, eos_token_id=vocab - 1,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_gpt2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Hugging Face folder: a random 2-layer GPT2LMHeadModel (fused c_attn, Conv1D weights)."""
    transformers = pytest.importorskip("transformers")
    import torch

    folder = tmp_path_factory.mktemp("tiny-gpt2")
    vocab = write_tokenizer(folder)
    end = vocab - 3  # <|endoftext|>
    config = transformers.GPT2Config(
        vocab_size=vocab, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=end, eos_token_id=end
    )
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(config).save_pretrained(folder)
    return folder
