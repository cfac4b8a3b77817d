"""A request checked once and made into a job (qkv.server.jobs): its prompts as ids, one SamplingParams, n choices
per prompt numbered as OpenAI numbers them, each with its own generator; what it may not ask for is refused."""

from __future__ import annotations

import pytest
import torch

from qkv.server.errors import ServiceError
from qkv.server.jobs import prepare_chat, prepare_completion
from qkv.server.limits import Limits
from qkv.server.schemas import ChatCompletionRequest, CompletionRequest
from qkv.tokenizers import CharTokenizer

TOKENIZER = CharTokenizer.train("the quick brown fox jumps over the lazy dog")
LIMITS = Limits(max_prompt_tokens=20, max_tokens=50, max_n=4, max_logprobs=5)


def job(**body):
    return prepare_completion(CompletionRequest(**body), TOKENIZER, LIMITS, torch.device("cpu"))


def test_prompts_become_choices_with_one_sampling_params_and_their_own_generators() -> None:
    made = job(prompt=["the fox", "own"], n=2, temperature=0.7, top_k=5, min_p=0.1, seed=3, max_tokens=9,
               stop="x", repetition_penalty=1.2, presence_penalty=0.5)  # fmt: skip
    assert [c.index for c in made.choices] == [0, 1, 2, 3]
    assert [c.prompt.ids for c in made.choices][::2] == [TOKENIZER.encode("the fox"), TOKENIZER.encode("own")]
    assert job(prompt=[[5, 6, 7], [8]]).choices[1].prompt.ids == [8]  # prompts given as token ids
    params = made.params
    assert (params.max_new_tokens, params.temperature, params.top_k, params.min_p, params.stop, params.seed) == (
        9, 0.7, 5, 0.1, ("x",), 3)  # fmt: skip
    assert params.repetition_penalty == 1.2 and params.presence_penalty == 0.5
    assert all(c.request.params is params for c in made.choices)  # one object, built once
    draws = [torch.rand(3, generator=c.request.generator).tolist() for c in made.choices]
    assert len({tuple(d) for d in draws}) == 4  # a generator per choice
    again = job(prompt=["the fox", "own"], n=2, seed=3)
    assert [torch.rand(3, generator=c.request.generator).tolist() for c in again.choices] == draws


@pytest.mark.parametrize(
    ("body", "drafts"),
    [
        ({"temperature": 0}, 4),
        ({"temperature": 0, "top_k": 3, "seed": 5}, 4),  # greedy all the same
        ({"temperature": 0.7}, 0),  # sampled: drafts are checked against the argmax only
        ({"temperature": 0, "repetition_penalty": 1.2}, 0),
        ({"temperature": 0, "frequency_penalty": 0.5}, 0),
    ],
)
def test_qkv_serve_prompt_lookup_drafts_for_greedy_requests_only(smol_bundle, body: dict, drafts: int) -> None:
    limits = Limits(max_prompt_tokens=100, max_tokens=50, prompt_lookup=4)
    made = prepare_completion(CompletionRequest(prompt="the fox", **body), TOKENIZER, limits, torch.device("cpu"))
    assert made.params.prompt_lookup == drafts
    chat = ChatCompletionRequest(messages=[{"role": "user", "content": "the fox"}], **body)
    assert prepare_chat(chat, smol_bundle, None, limits, torch.device("cpu")).params.prompt_lookup == drafts
    assert job(prompt="the fox", **body).params.prompt_lookup == 0  # the server's default: none


def test_eos_ends_a_choice_unless_ignore_eos() -> None:
    assert job(prompt="the").choices[0].request.stop_ids == {TOKENIZER.eos_id}
    assert job(prompt="the", ignore_eos=True).choices[0].request.stop_ids == frozenset()


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        (dict(max_tokens=51), 400, "max_tokens=51 is more than this server allows (50, --max-tokens)"),
        (dict(n=5), 400, "n=5 is more than this server allows"),
        (dict(logprobs=6), 400, "logprobs=6 is more than this server allows"),
        (dict(suffix="end"), 400, "suffix is not supported"),
        (dict(logit_bias={"5": 1.0}), 400, "logit_bias is not supported"),
        (dict(prompt="the quick brown fox jumps"), 413, "more than the 20 accepted (--max-prompt-tokens)"),
        (dict(prompt=[1, 2, 999]), 400, "token id 999, outside this model's vocabulary"),
    ],
)
def test_what_a_request_may_not_ask_for(body: dict, status: int, words: str) -> None:
    with pytest.raises(ServiceError) as error:
        job(**{"prompt": "the", **body})
    assert error.value.status == status and words in error.value.message


def test_a_chat_is_rendered_by_the_template_and_ends_at_its_end_of_turn(smol_bundle) -> None:
    from qkv.chat_templates import chat_prompt

    messages = [{"role": "user", "content": "Hi"}]
    body = ChatCompletionRequest(
        messages=messages, max_completion_tokens=7, max_tokens=7, logprobs=True, top_logprobs=2
    )  # both names with one value: fine (different values are refused: test_what_a_chat_may_not_ask_for)
    made = prepare_chat(body, smol_bundle, None, Limits(max_tokens=100), "cpu")
    expected = chat_prompt(smol_bundle, messages)
    assert made.choices[0].prompt.ids == expected.ids and made.choices[0].request.stop_ids == set(expected.stop_ids)
    assert made.params.max_new_tokens == 7 and made.params.logprobs == 2
    default = prepare_chat(ChatCompletionRequest(messages=messages), smol_bundle, None, Limits(max_tokens=33), "cpu")
    assert default.params.max_new_tokens == 33 and default.params.logprobs is None


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (dict(tool_choice="required"), "tool_choice is not supported"),
        (dict(response_format={"type": "json_object"}), "response_format is not supported"),
        (dict(top_logprobs=2), "top_logprobs needs logprobs: true"),
        (dict(max_tokens=99, max_completion_tokens=7), "max_tokens=99 and max_completion_tokens=7 differ"),
        (dict(messages=[{"role": "user", "content": [{"type": "image_url"}]}]), "image_url"),
    ],
)
def test_what_a_chat_may_not_ask_for(smol_bundle, body: dict, words: str) -> None:
    request = ChatCompletionRequest(**{"messages": [{"role": "user", "content": "Hi"}], **body})
    with pytest.raises(ServiceError, match=words):
        prepare_chat(request, smol_bundle, None, Limits(), "cpu")
