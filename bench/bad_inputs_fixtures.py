"""The models the bad-input battery (bench/bad_inputs.py) spoils: each small, made in a few seconds, in one folder.

    gpt/          a character GPT trained 12 steps by qkv.training (its data.txt beside it)
    llama/        a character Llama trained 12 steps
    translator/   a character encoder-decoder trained 12 steps on word reversal
    word2vec/     word vectors trained one epoch
    hf-llama/     a Hugging Face folder written by transformers: a tiny LlamaForCausalLM, a byte-level BPE
                  tokenizer.json with ChatML's <|im_start|>/<|im_end|>, and a chat template
    hf-gpt2/      a Hugging Face GPT2LMHeadModel with the same tokenizer
    llama.gguf    hf-llama written as GGUF by qkv's exporter (F32)
    int8/, int4/, w8a8/   gpt quantized by `qkv quantize`'s function
    text.txt, pairs.tsv   the training texts

Every case copies what it spoils, so the fixtures stay good for the next case.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

TEXT = (
    "To be, or not to be, that is the question:\n"
    "Whether 'tis nobler in the mind to suffer\n"
    "The slings and arrows of outrageous fortune,\n"
    "Or to take arms against a sea of troubles\n"
) * 30
WORDS = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
    "'\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _lm(root: Path, name: str, model: dict | None = None, **settings) -> Path:
    from qkv.training import TrainConfig, train_language_model

    config = TrainConfig.create(
        data=str(root / "text.txt"), out_dir=str(root / name), steps=12, batch_size=4, warmup_steps=1,
        eval_interval=12, eval_batches=1, log_interval=100, model={"context_length": 32, **(model or {})}, **settings,
    )  # fmt: skip
    return Path(train_language_model(config, quiet=True).run_dir)


def _translator(root: Path) -> Path:
    from qkv.training import TrainConfig, train_translator

    lines = []
    for i in range(200):
        words = [WORDS[(i * 7 + j * 3) % 10] for j in range(2 + i % 3)]
        lines.append(" ".join(words) + "\t" + " ".join(reversed(words)).upper())
    (root / "pairs.tsv").write_text("\n".join(lines) + "\n")
    model = {"d_model": 32, "n_heads": 2, "d_ff": 64, "n_encoder_layers": 1, "n_decoder_layers": 1}
    config = TrainConfig.create(
        task="translate", data=str(root / "pairs.tsv"), out_dir=str(root / "translator"), steps=12, batch_size=16,
        warmup_steps=1, eval_interval=12, eval_batches=1, bleu_sentences=4, log_interval=100, model=model,
    )  # fmt: skip
    return Path(train_translator(config, quiet=True).run_dir)


def _word2vec(root: Path) -> Path:
    from qkv.training import TrainConfig
    from qkv.training.tasks.word2vec import train_word2vec

    config = TrainConfig.create(task="word2vec", data=str(root / "text.txt"), out_dir=str(root / "word2vec"),
                                epochs=1, min_count=1, log_interval=100)  # fmt: skip
    return Path(train_word2vec(config, quiet=True).run_dir)


def bpe_tokenizer_json(path: Path) -> None:
    """A byte-level BPE tokenizer.json trained on the text, with ChatML's two special tokens."""
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers, trainers

    hf = tokenizers.Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    hf.train_from_iterator([TEXT], trainer)
    hf.save(str(path))


def _hf_llama(root: Path) -> Path:
    import transformers

    folder = root / "hf-llama"
    folder.mkdir()
    bpe_tokenizer_json(folder / "tokenizer.json")
    vocab = json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"]
    size = len(vocab)
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "chat_template": CHATML}))  # fmt: skip
    config = transformers.LlamaConfig(
        vocab_size=size, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=64, tie_word_embeddings=True,
    )  # fmt: skip
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def _hf_gpt2(root: Path) -> Path:
    import transformers

    folder = root / "hf-gpt2"
    folder.mkdir()
    bpe_tokenizer_json(folder / "tokenizer.json")
    size = len(json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"])
    config = transformers.GPT2Config(vocab_size=size, n_embd=16, n_layer=1, n_head=2, n_positions=64)
    transformers.GPT2LMHeadModel(config).save_pretrained(folder)
    return folder


def _quantized(root: Path, gpt: Path) -> None:
    import qkv
    from qkv.quantization.save import save_quantized

    save_quantized(qkv.load(gpt), root / "int8", "int8")
    save_quantized(qkv.load(gpt), root / "w8a8", "int8", activations="int8")
    save_quantized(qkv.load(gpt), root / "int4", "int4", group_size=32)


def make_fixtures(root: Path) -> Path:
    """Build every fixture under ``root`` (made empty first); return ``root``."""
    import transformers

    import qkv
    from qkv.export.gguf import export_gguf

    transformers.logging.set_verbosity_error()
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    (root / "text.txt").write_text(TEXT)
    gpt = _lm(root, "gpt", preset="gpt-nano")
    _lm(root, "llama", arch="llama", model={"d_model": 32, "n_heads": 2, "n_layers": 1})
    _translator(root)
    _word2vec(root)
    hf = _hf_llama(root)
    _hf_gpt2(root)
    bundle = qkv.load(hf)
    export_gguf(bundle.model, bundle.tokenizer, root / "llama.gguf", gguf_type="f32", chat_template=CHATML)
    _quantized(root, gpt)
    return root


if __name__ == "__main__":
    import sys
    import time

    started = time.perf_counter()
    print(make_fixtures(Path(sys.argv[1])), f"{time.perf_counter() - started:.0f} s")
