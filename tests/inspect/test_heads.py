"""The head detector: exact scores on planted patterns, Hugging Face GPT-2's own attentions, and induction
heads that form when a small attention model learns to continue repeated random tokens (and not in one layer)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from qkv.errors import QkvError
from qkv.inspect.heads import check_sizes, detect_heads, repeated_random_tokens, score_weights
from qkv.loading import load
from qkv.model_dir import ModelBundle
from qkv.models import GPT, Encoder, EncoderConfig, GPTConfig, LlamaConfig
from qkv.tokenizers import CharTokenizer
from tests.pretrained.conftest import gpt2_dir, gpt2_hf  # noqa: F401  (session fixtures)

pytestmark = pytest.mark.slow  # among the longest modules: the workers start them first (tests/conftest.py)


def planted(length: int, offset: int) -> torch.Tensor:
    """Weights (1, 4, T, T) of four heads: previous token, first token, induction, duplicate token."""
    n = offset + 2 * length
    w = torch.zeros(1, 4, n, n)
    w[0, :, 0, 0] = 1.0
    for i in range(1, n):
        w[0, 0, i, i - 1] = 1.0
        w[0, 1, i, 0] = 1.0
        second = i >= offset + length
        w[0, 2, i, i - length + 1 if second else i] = 1.0  # the first copy attends to itself
        w[0, 3, i, i - length if second else i] = 1.0
    return w


@pytest.mark.parametrize("offset", [0, 1])
def test_planted_heads_score_one_on_their_own_behaviour(offset: int) -> None:
    scores = score_weights(planted(6, offset), offset, 6)
    table = np.stack([scores[k] for k in ("previous-token", "first-token", "induction", "duplicate-token")])
    np.testing.assert_allclose(np.diag(table), 1.0, atol=1e-12)  # each head scores 1 on its own behaviour
    queries = offset + 11  # every position after the first
    assert scores["previous-token"][1] == pytest.approx(1 / queries)  # the first-token head at 1 -> 0 only
    off_diagonal = table - np.diag(np.diag(table))
    assert off_diagonal.max() <= 1 / 6 + 1e-12  # a head scores on another behaviour only where they overlap


def test_gpt2_scores_equal_the_means_of_transformers_attentions(gpt2_dir, gpt2_hf) -> None:  # noqa: F811
    bundle = load(str(gpt2_dir))
    detection = detect_heads(bundle, length=20, batch=3, seed=7, bos=True)
    tok = bundle.tokenizer
    first = repeated_random_tokens(tok, tok.vocab_size, 20, 3, torch.Generator().manual_seed(7))
    ids = torch.cat([torch.full((3, 1), tok.bos_id), first], dim=1)  # the same sequences, <|endoftext|> first
    assert (ids[:, 1:21] == ids[:, 21:]).all() and tok.bos_id not in ids[:, 1:]
    with torch.no_grad():
        attentions = gpt2_hf(ids, output_attentions=True).attentions  # per layer (B, H, T, T)
    part = detection.part("decoder")
    assert part.first == "<|endoftext|>" and (part.n_layers, part.n_heads) == (2, 4)
    for layer, a in enumerate(attentions):
        a = a.double().numpy()
        second = np.arange(21, 41)
        np.testing.assert_allclose(part.scores["induction"][layer], a[:, :, second, second - 19].mean(axis=(0, 2)),
                                   atol=1e-5)  # fmt: skip
        np.testing.assert_allclose(part.scores["first-token"][layer], a[:, :, 1:, 0].mean(axis=(0, 2)), atol=1e-5)
    data = json.loads(json.dumps(detection.to_dict(top=3)))
    assert len(data["parts"]["decoder"]["top"]["induction"]) == 3


def test_encoders_and_translators_are_scored_and_bad_settings_are_errors(gpt, translator, char_tokenizer) -> None:
    model = Encoder(EncoderConfig(vocab_size=char_tokenizer.vocab_size, d_model=8, n_heads=2, n_layers=2,
                                  context_length=30))  # fmt: skip
    encoder = detect_heads(ModelBundle(model, model.config, char_tokenizer, None, None))
    assert encoder.length == 14 and encoder.part().first == "<bos>" and encoder.part().n_layers == 2
    both = detect_heads(translator, length=5)
    assert [p.part for p in both.parts] == ["encoder", "decoder"] and both.part("decoder").first == "<bos>"
    assert both.part("encoder").n_layers == 1 and both.part("decoder").n_layers == 2
    with pytest.raises(QkvError, match="--length 40 does not fit"):
        detect_heads(gpt, length=40)
    with pytest.raises(QkvError, match="--head 2 is out of range: each layer has heads 0..1"):
        detect_heads(gpt, length=4).check(0, 2)


def test_the_memory_check_sizes_the_tokens_fed_not_the_models_context(monkeypatch) -> None:
    """SmolLM2's sizes (no weights needed): 8 sequences of 2 x 50 tokens fit in 21 GiB; sizing them as 8 x 8,192
    tokens (the context, as the check once did) asks for 1,763 GiB."""
    from qkv.models.memory import GIB

    config = LlamaConfig(vocab_size=49152, d_model=576, n_heads=9, n_kv_heads=3, d_ff=1536, n_layers=30,
                         context_length=8192)  # fmt: skip
    monkeypatch.setattr("qkv.models.memory.available_memory", lambda device: 21 * GIB)
    check_sizes(config, 8, 100, 0, torch.device("cpu"))
    with pytest.raises(QkvError, match=r"--batch 8 of 8,192 tokens needs about 1762\.\d GiB .* or --length"):
        check_sizes(config, 8, 8192, 0, torch.device("cpu"))


def train_on_repeats(n_layers: int, tokenizer: CharTokenizer, steps: int = 200, seed: int = 0) -> ModelBundle:
    """A small attention-only GPT trained to continue random tokens repeated with a period of 3 to 15.

    The FFNs are zero and frozen (attention only), and the token and position embeddings are random and frozen:
    in 128 dimensions they are nearly orthogonal, which lets an induction circuit form in about a hundred steps
    instead of thousands (close to the setting of Bietti et al. 2023, "Birth of a Transformer: A Memory Viewpoint").
    The period varies, so no head can predict by position alone; only induction generalises.
    """
    torch.manual_seed(seed)
    vocab = tokenizer.vocab_size
    config = GPTConfig(vocab_size=vocab, d_model=128, n_heads=2, n_layers=n_layers, d_ff=16, context_length=32,
                       tie_embeddings=False)  # fmt: skip
    model = GPT(config)
    with torch.no_grad():
        for block in model.decoder.blocks:
            for p in block.feed_forward.parameters():
                p.zero_().requires_grad_(False)
        for p in (model.embedding.token_embedding.weight, model.embedding.positional_encoding.weight):
            p.copy_(torch.randn_like(p) / 128**0.5).requires_grad_(False)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3, betas=(0.9, 0.95),
                                  weight_decay=0.0)  # fmt: skip
    t = torch.arange(33)
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = 3e-3 * min(1.0, (step + 1) / 20)
        first = torch.stack([torch.randperm(vocab)[:15] for _ in range(32)])  # (32, 15) distinct tokens per row
        period = torch.randint(3, 16, (32, 1))
        x = torch.gather(first, 1, t[None] % period)  # (32, 33): each row repeats its first `period` tokens
        logits = model(x[:, :-1])
        learnable = t[None, :-1] >= period  # from the second copy on, the next token is in the context
        loss = torch.nn.functional.cross_entropy(logits[learnable], x[:, 1:][learnable])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return ModelBundle(model.eval(), config, tokenizer, None, None)


@pytest.fixture
def one_thread():
    """Tiny matrices: one thread is faster than several, and much faster on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_induction_heads_form_in_two_layers_and_not_in_one(one_thread) -> None:
    tokenizer = CharTokenizer.train("".join(chr(c) for c in range(0x30, 0x6C)))  # 60 characters + 4 specials
    assert tokenizer.vocab_size == 64
    two = detect_heads(train_on_repeats(2, tokenizer)).part()
    assert two.top("induction", 1)[0][0] == 1  # the best induction head sits in layer 1
    assert two.scores["induction"][1].max() > 0.5 and two.scores["induction"][0].max() < 0.2
    one = detect_heads(train_on_repeats(1, tokenizer)).part()
    assert one.scores["induction"].max() < 0.2  # one layer cannot find "the token after the last one like me"
