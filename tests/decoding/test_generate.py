"""Generation: the KV-cached path equals the uncached reference token for token (also past the context),
cropping, eos, streaming, the text streamer and bad input."""

from __future__ import annotations

from functools import cache

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from qkv import GPT, GPTConfig
from qkv.decoding import Engine, Request, SamplingParams, TextStreamer, generate, stream
from qkv.errors import QkvError
from qkv.tokenizers import BPETokenizer
from tests.conftest import tiny_gpt as shared_tiny_gpt

CONTEXT = 16
VOCAB = 50
POSITIONALS = ("rope", "learned", "sinusoidal")


@cache
def tiny_gpt(positional: str, dtype: torch.dtype = torch.float64) -> GPT:
    return shared_tiny_gpt(vocab_size=VOCAB, context_length=CONTEXT, positional=positional, dtype=dtype)


def reference_generate(model: GPT, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Greedy decoding written out as plainly as possible: argmax of the logits of the last C tokens."""
    seq = list(prompt)
    for _ in range(max_new_tokens):
        window = torch.tensor([seq[-CONTEXT:]])
        with torch.no_grad():
            seq.append(int(model(window)[0, -1].argmax()))
    return seq[len(prompt) :]


def _both_paths(model: GPT, prompt: torch.Tensor | list[int], seed: int, **kwargs) -> tuple[torch.Tensor, ...]:
    outs = [
        generate(model, prompt, use_cache=use_cache, generator=torch.Generator().manual_seed(seed), **kwargs)
        for use_cache in (True, False)
    ]
    length = torch.as_tensor(prompt).shape[-1]
    return outs[0], outs[1], [length - CONTEXT] if length > CONTEXT else []


# ------------------------------------------------------------------------------- cache == no cache


@settings(max_examples=40, deadline=None)
@given(
    positional=st.sampled_from(POSITIONALS),
    batch=st.integers(1, 2),
    prompt_length=st.integers(1, CONTEXT + 8),
    max_new_tokens=st.integers(0, CONTEXT + 4),
    sampling=st.sampled_from(
        [dict(temperature=0), dict(temperature=1.0), dict(temperature=0.7, top_k=5), dict(temperature=1.5, top_p=0.8)]
    ),
    seed=st.integers(0, 2**16),
)
def test_cached_and_uncached_generation_agree_token_for_token(
    positional: str, batch: int, prompt_length: int, max_new_tokens: int, sampling: dict, seed: int
) -> None:
    model = tiny_gpt(positional)
    prompt = torch.randint(VOCAB, (batch, prompt_length), generator=torch.Generator().manual_seed(seed))
    cached, uncached, crops = _both_paths(model, prompt, seed, max_new_tokens=max_new_tokens, **sampling)
    assert cached.shape == (batch, prompt_length + max_new_tokens)
    assert torch.equal(cached[:, :prompt_length], prompt)
    assert torch.equal(cached, uncached)
    assert crops == ([prompt_length - CONTEXT] if prompt_length > CONTEXT else [])


@pytest.mark.parametrize("positional", POSITIONALS)
@pytest.mark.parametrize("prompt_length", [3, CONTEXT - 1, CONTEXT, CONTEXT + 5])
def test_greedy_generation_matches_a_plain_sliding_window_loop(positional: str, prompt_length: int) -> None:
    model = tiny_gpt(positional)
    prompt = torch.randint(VOCAB, (prompt_length,), generator=torch.Generator().manual_seed(prompt_length)).tolist()
    expected = reference_generate(model, prompt, 2 * CONTEXT)
    for use_cache in (True, False):
        out = generate(model, prompt, max_new_tokens=2 * CONTEXT, temperature=0, use_cache=use_cache)
        assert out[0, prompt_length:].tolist() == expected
    if prompt_length > 3:
        assert len(set(expected)) > 3  # varied text, so a token conditioned on the wrong window would show


@pytest.mark.parametrize("positional", POSITIONALS)
def test_cache_agrees_in_float32_past_the_context(positional: str) -> None:
    model = tiny_gpt(positional, torch.float32)
    prompt = torch.randint(VOCAB, (2, 5), generator=torch.Generator().manual_seed(0))
    for sampling in (dict(temperature=0), dict(temperature=0.9, top_p=0.95)):
        cached, uncached, _ = _both_paths(model, prompt, 11, max_new_tokens=CONTEXT + 6, **sampling)
        assert torch.equal(cached, uncached)


@pytest.mark.parametrize(
    ("engine", "forward_calls"),
    [
        # prefill 14 tokens, then one token at a time up to 16; after that the window slides every step
        ("model", [CONTEXT - 2, 1, 1, CONTEXT, CONTEXT, CONTEXT]),
        # the same, but the one-token steps run the engine's decode step instead of the model's forward
        ("static", [CONTEXT - 2, CONTEXT, CONTEXT, CONTEXT]),
    ],
)
def test_the_cached_path_feeds_one_token_per_step_and_refills_when_the_window_slides(engine, forward_calls) -> None:
    model = tiny_gpt("rope")
    fed: list[tuple[int, bool, bool]] = []
    hook = model.register_forward_pre_hook(
        lambda m, args, kwargs: fed.append((args[0].shape[1], kwargs["cache"] is not None, kwargs["last_only"])),
        with_kwargs=True,
    )
    try:
        generate(model, list(range(1, CONTEXT - 1)), max_new_tokens=6, temperature=0, step=engine)
    finally:
        hook.remove()
    assert [n for n, _, _ in fed] == forward_calls
    assert all(cache and last_only for _, cache, last_only in fed)


def test_a_long_prompt_is_cropped_from_the_left_once() -> None:
    model = tiny_gpt("learned")
    prompt = torch.randint(VOCAB, (CONTEXT + 7,), generator=torch.Generator().manual_seed(5)).tolist()
    out = generate(model, prompt, max_new_tokens=4, temperature=0)
    assert stream(model, prompt, max_new_tokens=4, temperature=0).cropped == 7
    assert out[0, : len(prompt)].tolist() == prompt  # the result still starts with the whole prompt
    assert stream(model, prompt[7:], max_new_tokens=4, temperature=0).cropped == 0  # a prompt that fits: none
    cropped = generate(model, prompt[7:], max_new_tokens=4, temperature=0)
    assert torch.equal(out[0, len(prompt) :], cropped[0, CONTEXT:])


# ----------------------------------------------------------------------------------------- eos


def test_rows_stop_at_eos_and_are_filled_with_it() -> None:
    model = tiny_gpt("rope")
    prompt = torch.randint(VOCAB, (3, 4), generator=torch.Generator().manual_seed(2))
    free = generate(model, prompt, max_new_tokens=12, temperature=0)[:, 4:]
    eos = int(free[0, 2])
    expected, ends = [], []
    for row in free.tolist():
        end = row.index(eos) + 1 if eos in row else len(row)
        ends.append(end)
        expected.append(row[:end] + [eos] * (len(row) - end))
    n = max(ends)  # generation ends when every row is done
    for use_cache in (True, False):
        out = generate(model, prompt, max_new_tokens=12, temperature=0, eos_id=eos, use_cache=use_cache)
        assert out.shape == (3, 4 + n)
        assert out[:, 4:].tolist() == [row[:n] for row in expected]


def test_generation_ends_early_when_every_row_is_done() -> None:
    model = tiny_gpt("learned")
    first = int(generate(model, [7, 8, 9], max_new_tokens=1, temperature=0)[0, -1])
    out = generate(model, [7, 8, 9], max_new_tokens=50, temperature=0, eos_id=first)
    assert out.tolist() == [[7, 8, 9, first]]


def test_logprobs_come_from_the_raw_logits_each_token_is_chosen_from() -> None:
    """Past the context too: each step's log-probabilities are those of the window the plain loop reads."""
    model = tiny_gpt("learned")
    prompt = [3, 1, 4, 1, 5]
    request = Request(prompt, SamplingParams(max_new_tokens=CONTEXT + 3, temperature=0, logprobs=4))
    engine = Engine(model, 1, CONTEXT)
    outputs, made = engine.add([request]), []
    while outputs:
        (output,) = outputs
        window = torch.tensor([(prompt + made)[-CONTEXT:]])
        with torch.no_grad():
            expected = torch.log_softmax(model(window)[0, -1], dim=-1)  # (V,)
        assert output.token == int(expected.argmax())
        assert output.logprob == pytest.approx(float(expected[output.token]), abs=1e-9)
        assert [i for i, _ in output.top] == expected.topk(4).indices.tolist()
        made.append(output.token)
        outputs = engine.step()
    assert made == generate(model, prompt, max_new_tokens=CONTEXT + 3, temperature=0)[0, 5:].tolist()


# -------------------------------------------------------------------------------------- stream


@pytest.mark.parametrize("sampling", [dict(temperature=0), dict(temperature=1.0, top_k=10)])
@pytest.mark.parametrize("use_cache", [True, False])
def test_stream_yields_the_ids_generate_returns(sampling: dict, use_cache: bool) -> None:
    model = tiny_gpt("rope")
    prompt = [3, 1, 4, 1, 5]
    kwargs = dict(max_new_tokens=CONTEXT + 3, use_cache=use_cache, **sampling)
    out = generate(model, prompt, generator=torch.Generator().manual_seed(9), **kwargs)
    streamed = list(stream(model, prompt, generator=torch.Generator().manual_seed(9), **kwargs))
    assert streamed == out[0, len(prompt) :].tolist()
    eos = streamed[4]
    with_eos = list(stream(model, prompt, eos_id=eos, generator=torch.Generator().manual_seed(9), **kwargs))
    assert with_eos == streamed[: streamed.index(eos) + 1]


def test_stream_runs_without_gradients_only_while_it_runs_and_restores_training() -> None:
    model = tiny_gpt("sinusoidal")
    model.train()
    try:
        ids = stream(model, [1, 2, 3], max_new_tokens=3, temperature=0)
        next(ids)
        assert torch.is_grad_enabled()  # no_grad does not leak out of the generator
        assert not model.training  # dropout off while the stream is open
        list(ids)
        assert model.training
        out = generate(model, [1, 2, 3], max_new_tokens=2)
        assert model.training and not out.requires_grad
    finally:
        model.eval()


# ---------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        (dict(max_new_tokens=-1), "max_new_tokens"),
        (dict(temperature=-1.0), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=2.0), "top_p"),
        (dict(top_k=-3), "top_k"),
        (dict(eos_id=VOCAB), "eos_id"),
    ],
)
def test_bad_arguments_raise_qkv_errors_with_the_fix(kwargs: dict, words: str) -> None:
    model = tiny_gpt("rope")
    kwargs = {"max_new_tokens": 3, **kwargs}
    with pytest.raises(QkvError, match=words):
        generate(model, [1, 2], **kwargs)
    with pytest.raises(QkvError, match=words):
        stream(model, [1, 2], **kwargs)  # raised at once, not at the first next()


def test_an_empty_prompt_needs_a_bos_token() -> None:
    model = tiny_gpt("rope")
    with pytest.raises(QkvError, match="the prompt is empty: give some text, or"):
        generate(model, [], max_new_tokens=3)
    out = generate(model, [], max_new_tokens=3, temperature=0, bos_id=1)
    assert out.shape == (1, 4) and int(out[0, 0]) == 1


@pytest.mark.parametrize("prompt", [[1, VOCAB], [-1], [[1, 2], [3]], torch.ones(1, 2)])
def test_bad_prompts_raise_qkv_errors(prompt: object) -> None:
    with pytest.raises(QkvError):
        generate(tiny_gpt("rope"), prompt, max_new_tokens=2)  # type: ignore[arg-type]


def test_stream_takes_one_prompt_and_zero_new_tokens_give_the_prompt() -> None:
    model = tiny_gpt("rope")
    with pytest.raises(QkvError, match="generate"):
        stream(model, torch.zeros(2, 3, dtype=torch.long), max_new_tokens=2)
    assert generate(model, [4, 5], max_new_tokens=0).tolist() == [[4, 5]]
    assert list(stream(model, [4, 5], max_new_tokens=0)) == []


# ------------------------------------------------------------------------------- text streamer

TEXT = "Héllo wörld! Ça va? ☃ snow, 日本語のテキスト, emoji 🙂🚀 and naïve café. " * 20


@cache
def bpe() -> BPETokenizer:
    return BPETokenizer.train(TEXT, vocab_size=300)


def test_text_streamer_reassembles_multibyte_characters() -> None:
    tok = bpe()
    text = "Ça va? ☃ 日本語 🙂🚀 naïve 𝄞"
    ids = tok.encode(text)
    assert any(tok.decode(ids[: i + 1]).endswith("\ufffd") for i in range(len(ids)))  # some tokens split a char
    streamer = TextStreamer(tok)
    pieces = [streamer.push(i) for i in ids]
    assert "" in pieces  # held back while a character was incomplete
    assert not any("\ufffd" in piece for piece in pieces)
    assert "".join(pieces) == text
    assert streamer.flush() == ""


def test_text_streamer_flushes_an_incomplete_character_and_skips_the_prompt() -> None:
    tok = bpe()
    prompt = tok.encode("snow: ")
    snowman = tok.encode("☃")
    assert len(snowman) > 1
    streamer = TextStreamer(tok, prompt_ids=prompt)
    assert streamer.push(snowman[0]) == ""
    assert streamer.flush() == "\ufffd"
    assert streamer.push(tok.encode("!")[0]) == "!"


@settings(max_examples=50, deadline=None)
@given(ids=st.lists(st.integers(0, 299), max_size=30))
def test_text_streamer_pieces_add_up_to_the_decoded_text(ids: list[int]) -> None:
    tok = bpe()
    streamer = TextStreamer(tok)
    pieces = [streamer.push(i) for i in ids]
    assert not any(piece.endswith("\ufffd") for piece in pieces)
    assert "".join(pieces) + streamer.flush() == tok.decode(ids)


def test_streaming_generated_ids_through_the_text_streamer() -> None:
    tok = bpe()
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, d_model=32, n_heads=4, n_layers=1, context_length=32)).eval()
    prompt = tok.encode("日本")
    streamer = TextStreamer(tok, prompt_ids=prompt)
    new = []
    text = ""
    for token in stream(model, prompt, max_new_tokens=40, generator=torch.Generator().manual_seed(0)):
        new.append(token)
        text += streamer.push(token)
    text += streamer.flush()
    assert tok.decode(prompt) + text == tok.decode(prompt + new)


def test_a_seed_in_the_settings_is_one_generator_for_the_batch() -> None:
    model = tiny_gpt("rope")
    prompt = torch.tensor([[3, 1, 4], [3, 1, 4]])
    seeded = generate(model, prompt, max_new_tokens=8, temperature=1.5, seed=11)
    given = generate(model, prompt, max_new_tokens=8, temperature=1.5, generator=torch.Generator().manual_seed(11))
    assert torch.equal(seeded, given)  # the same as passing that generator
    assert not torch.equal(seeded[0], seeded[1])  # two rows, two different draws from one stream
