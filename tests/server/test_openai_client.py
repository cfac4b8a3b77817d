"""The official `openai` Python client against a running qkv server: completions with logprobs, echo, n, stop
and seed, streaming, the model list, and refusals surfacing as the client's own exceptions with our message."""

from __future__ import annotations

import json

import pytest

from qkv.cli import main

openai = pytest.importorskip("openai", reason="the openai client is a test dependency: pip install -e '.[test]'")


@pytest.fixture(scope="module")
def client(gpt):
    with openai.OpenAI(base_url=gpt.url + "/v1", api_key="not-needed", max_retries=0, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def model(gpt) -> str:
    return gpt.bundle.path.name


def test_the_model_list_and_one_model(client, model) -> None:
    (card,) = client.models.list().data
    assert card.id == model and card.object == "model" and card.owned_by == "qkv" and isinstance(card.created, int)
    assert client.models.retrieve(model).id == model
    with pytest.raises(openai.NotFoundError) as error:
        client.models.retrieve("gpt-4o")
    assert error.value.code == "model_not_found" and "does not exist here" in str(error.value)


def test_a_completion_with_logprobs_echo_n_stop_and_seed(client, model) -> None:
    prompt = "To be, or"
    options = dict(model=model, prompt=prompt, max_tokens=12, temperature=1.2, seed=8, n=2, logprobs=3, echo=True)
    first = client.completions.create(**options, stop=["\n"])
    again = client.completions.create(**options, stop=["\n"])
    assert first.object == "text_completion" and first.model == model and len(first.choices) == 2
    for mine, theirs in zip(first.choices, again.choices, strict=True):  # the seed: the same text and tokens
        assert (mine.text, mine.finish_reason, mine.logprobs.tokens) == (theirs.text, theirs.finish_reason,
                                                                        theirs.logprobs.tokens)  # fmt: skip
        # the same numbers, to float32 rounding: the rows of a batch may sum in another order from run to run
        assert mine.logprobs.token_logprobs == pytest.approx(theirs.logprobs.token_logprobs, abs=1e-5)
    for index, choice in enumerate(first.choices):
        assert choice.index == index and choice.text.startswith(prompt) and "\n" not in choice.text
        lp = choice.logprobs
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None  # the first prompt token
        assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
        assert all(lp.text_offset[i] <= lp.text_offset[i + 1] for i in range(len(lp.text_offset) - 1))
        assert all(value <= 0 for value in lp.token_logprobs[1:])
        assert all(3 <= len(top) <= 4 for top in lp.top_logprobs[1:])
    usage = first.usage
    assert usage.prompt_tokens == len(prompt) and usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.completion_tokens >= sum(len(c.text) - len(prompt) for c in first.choices)


def test_echo_logprobs_agree_with_qkv_eval(client, model, gpt_run, tmp_path, capsys) -> None:
    text = "Whether 'tis nobler in the mind to suffer\nThe slings and arrows of outrageous fortune,"
    (tmp_path / "text.txt").write_text(text)
    assert main(["eval", gpt_run, str(tmp_path / "text.txt"), "--json"]) == 0
    score = json.loads(capsys.readouterr().out)
    answer = client.completions.create(model=model, prompt=text, max_tokens=0, echo=True, logprobs=0)
    logprobs = answer.choices[0].logprobs.token_logprobs
    assert len(logprobs) - 1 == score["tokens"]
    assert -sum(logprobs[1:]) / score["tokens"] == pytest.approx(score["loss"], rel=1e-9)


def test_streaming_gives_the_text_of_the_same_request_unstreamed(client, model) -> None:
    options = dict(model=model, prompt="Or to take arms", max_tokens=20, temperature=0.9, seed=3, logprobs=1)
    whole = client.completions.create(**options)
    chunks = list(client.completions.create(**options, stream=True))
    assert len(chunks) > 2 and len({c.id for c in chunks}) == 1
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    tokens = [t for c in chunks for t in c.choices[0].logprobs.tokens]
    assert tokens == whole.choices[0].logprobs.tokens
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


@pytest.mark.parametrize(
    ("options", "exception", "param", "words"),
    [
        (dict(logprobs=6), "BadRequestError", "logprobs", "--max-logprobs"),
        (dict(n=9), "BadRequestError", "n", "--max-n"),
        (dict(suffix="and so on"), "BadRequestError", "suffix", "cannot fill in the middle"),
        (dict(model="davinci-002"), "NotFoundError", "model", "does not exist here"),
        (dict(seed=2**70), "UnprocessableEntityError", "seed", "less than or equal to"),
        (dict(max_tokens=10_000), "BadRequestError", "max_tokens", "--max-tokens"),
    ],
)
def test_refusals_are_the_clients_exceptions_with_our_message(client, model, options, exception, param, words) -> None:
    with pytest.raises(getattr(openai, exception)) as error:
        client.completions.create(**{"model": model, "prompt": "To be", "max_tokens": 2, **options})
    assert words in str(error.value) and error.value.param == param
    with pytest.raises(getattr(openai, exception)):  # the same in a stream: refused before it starts
        client.completions.create(**{"model": model, "prompt": "To be", "max_tokens": 2, **options}, stream=True)
