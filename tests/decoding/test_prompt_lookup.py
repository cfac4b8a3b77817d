"""Prompt-lookup decoding: drafts from the earliest earlier occurrence of the text's last tokens, and decoding with
them gives exactly the greedy tokens of decoding without them, on every step strategy, whether the drafts are
right, half right or wrong, through an end id and the token limit, in fewer steps when they are right."""

from __future__ import annotations

import pytest
import torch

from qkv import native
from qkv.decoding import Engine, Request, SamplingParams, generate, stream
from qkv.decoding.prompt_lookup import Lookup
from qkv.decoding.replies import complete
from qkv.errors import QkvError
from qkv.models import LlamaConfig
from qkv.models.llama import Llama

pytestmark = pytest.mark.usefixtures("one_thread")


def test_a_draft_follows_the_earliest_occurrence_of_the_last_three_two_or_one_tokens() -> None:
    lookup = Lookup([5, 6, 7, 8, 9, 5, 6, 7, 1, 2, 5, 6, 7])
    assert lookup.draft(3) == [8, 9, 5]  # "5 6 7" first occurs at 0
    lookup.extend([4])
    assert lookup.draft(2) == []  # 4 never occurred before
    lookup.extend([9])
    assert lookup.draft(4) == [5, 6, 7, 1]  # "4 9" never did, "9" did (at 4)
    assert Lookup([]).draft(3) == [] and Lookup([3]).draft(3) == []


def tiny(dtype: torch.dtype) -> Llama:
    torch.manual_seed(4)
    config = LlamaConfig(vocab_size=40, d_model=64, n_heads=4, n_kv_heads=2, d_ff=64, n_layers=2, context_length=64,
                         init_std=0.4)  # fmt: skip
    return Llama(config).to(dtype).eval()


STEPS = {"native": torch.float32, "static": torch.float64, "model": torch.float64}


def steps_for(name: str) -> str:
    if name == "native" and native.library() is None:
        pytest.skip(f"the C kernels are unavailable: {native.unavailable_reason()}")
    return name


@pytest.mark.parametrize("step", sorted(STEPS))
@pytest.mark.parametrize("quality", ["right", "half right", "wrong", "found"])
def test_the_same_tokens_as_greedy_decoding_whatever_the_drafts(step: str, quality: str, monkeypatch) -> None:
    model, prompts = tiny(STEPS[steps_for(step)]), [[1, 2, 3, 4, 5, 1, 2, 3], [7, 8, 9, 7, 8]]
    reference = generate(model, prompts[:1], max_new_tokens=30, temperature=0, step=step)[0].tolist()
    both = [generate(model, [p], max_new_tokens=30, temperature=0, step=step)[0].tolist() for p in prompts]

    def drafted(self: Lookup, k: int) -> list[int]:  # the true continuation, spoilt as the test asks
        text = next((t for t in both if t[: len(self.tokens)] == self.tokens), reference)
        truth = text[len(self.tokens) : len(self.tokens) + k]
        spoilt = {"right": truth, "half right": truth[: k // 2] + [0] * (k - k // 2), "wrong": [39] * k}
        return spoilt[quality][: len(truth)] if quality in spoilt else found(self, k)

    found = Lookup.draft  # "found": the drafts prompt lookup itself finds
    monkeypatch.setattr(Lookup, "draft", drafted)
    for prompt, expected in zip(prompts, both, strict=True):
        ours = generate(model, [prompt], max_new_tokens=30, temperature=0, step=step, prompt_lookup=6)
        assert ours[0].tolist() == expected, quality
    together = generate(model, [p[-5:] for p in prompts], max_new_tokens=30, temperature=0, step=step,
                        prompt_lookup=6)  # fmt: skip
    assert together.tolist() == generate(model, [p[-5:] for p in prompts], max_new_tokens=30, temperature=0,
                                         step=step).tolist()  # fmt: skip


def engine_steps(model, prompt: list[int], params: SamplingParams, step: str, stop_ids=frozenset()) -> tuple:
    """(the new tokens, the number of engine steps after the prefill)."""
    engine = Engine(model, 1, 64, step=step)
    outputs, tokens, steps = engine.add([Request(prompt, params, stop_ids)]), [], 0
    while outputs:
        tokens += [out.token for out in outputs]
        if not engine.running:
            break
        outputs, steps = engine.step(), steps + 1
    return tokens, steps


@pytest.mark.parametrize("step", ["native", "static"])
def test_right_drafts_take_fewer_steps_and_stop_at_the_limit_and_the_end_id(step: str, monkeypatch) -> None:
    model = tiny(STEPS[steps_for(step)])
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    plain = SamplingParams(max_new_tokens=23, temperature=0)
    expected, plain_steps = engine_steps(model, prompt, plain, step)
    monkeypatch.setattr(Lookup, "draft", lambda self, k: (prompt + expected)[len(self.tokens) : len(self.tokens) + k])
    tokens, steps = engine_steps(model, prompt, plain.replace(prompt_lookup=5), step)
    assert tokens == expected and len(tokens) == 23 and steps == 4 < plain_steps == 22  # 1 + 6 + 6 + 6 + 4
    end = expected[9]  # an end id inside a draft: the text stops there, as it would without drafts
    stopped, _ = engine_steps(model, prompt, plain.replace(prompt_lookup=5), step, frozenset({end}))
    assert stopped == expected[: expected.index(end) + 1]


def test_prompt_lookup_is_refused_where_it_would_change_the_text() -> None:
    with pytest.raises(QkvError, match="greedy decoding: use temperature=0 without penalties"):
        SamplingParams(temperature=0.7, prompt_lookup=4)
    with pytest.raises(QkvError, match="without penalties"):
        SamplingParams(temperature=0, repetition_penalty=1.2, prompt_lookup=4)
    with pytest.raises(QkvError, match="without penalties"):
        SamplingParams(temperature=0, frequency_penalty=-0.5, prompt_lookup=4)
    with pytest.raises(QkvError, match="whole number >= 0"):
        SamplingParams(temperature=0, prompt_lookup=-1)
    assert SamplingParams(temperature=1e-6, prompt_lookup=4).not_greedy() == []  # below GREEDY_BELOW: greedy
    assert SamplingParams(temperature=0.7, presence_penalty=0.5).not_greedy() == [
        ("temperature", 0.7),
        ("presence_penalty", 0.5),
    ]


def test_prompt_lookup_without_a_cache_is_refused_at_once(smol_bundle) -> None:
    """Without a KV cache every step recomputes the window and no draft would be checked: refused, not ignored."""
    ids = smol_bundle.tokenizer.encode("one two one two")
    settings = dict(max_new_tokens=5, temperature=0, prompt_lookup=4, use_cache=False)
    with pytest.raises(QkvError, match="prompt_lookup=4 checks its drafts in a step over the KV cache"):
        generate(smol_bundle.model, ids, **settings)
    with pytest.raises(QkvError, match="use_cache=False"):
        stream(smol_bundle.model, ids, **settings)  # at the call, not at the first token
    with pytest.raises(QkvError, match="use_cache=False"):
        complete(smol_bundle, "one two one two", **settings)
    assert len(generate(smol_bundle.model, ids, **{**settings, "prompt_lookup": 0})[0]) == len(ids) + 5


def test_stream_and_complete_give_the_same_text_with_prompt_lookup(smol_bundle) -> None:
    text = "one two three four five six seven eight nine ten. one two three four five"
    plain = complete(smol_bundle, text, max_new_tokens=25, temperature=0, ignore_eos=True)
    drafted = complete(smol_bundle, text, max_new_tokens=25, temperature=0, ignore_eos=True, prompt_lookup=8)
    assert drafted.text == plain.text and drafted.token_ids == plain.token_ids
    ids = smol_bundle.tokenizer.encode(text)
    columns = list(stream(smol_bundle.model, ids, max_new_tokens=25, temperature=0, prompt_lookup=8))
    assert [int(c) for c in columns] == plain.token_ids
