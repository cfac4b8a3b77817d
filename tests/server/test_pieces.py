"""A job's text as its outputs arrive (qkv.server.pieces): pieces of every choice interleaved, a stop string frees
the row at once and later tokens of that choice are ignored, an error ends the stream."""

from __future__ import annotations

import asyncio

import pytest
import torch

from qkv.decoding.request import TokenOutput
from qkv.server.jobs import prepare_completion
from qkv.server.limits import Limits
from qkv.server.metrics import Metrics
from qkv.server.pieces import choice_texts, pieces
from qkv.server.schemas import CompletionRequest
from qkv.tokenizers import CharTokenizer

TOKENIZER = CharTokenizer.train("abcdefgh xyz")


class FakeRun:
    """What pieces() reads of a scheduler's Run: the job, its outputs, and stop()."""

    def __init__(self, job, outputs) -> None:
        self.job, self._outputs, self.stopped, self.failed = job, outputs, [], False

    async def outputs(self):
        for output in self._outputs:
            yield output

    def stop(self, request) -> None:
        self.stopped.append(request)


def collect(run, job) -> list:
    texts = choice_texts(job, TOKENIZER, logprobs=False)

    async def go():
        return [p async for p in pieces(run, texts, [], Metrics())]

    return asyncio.run(go())


def test_choices_interleave_and_a_stop_string_frees_the_row_at_once() -> None:
    body = CompletionRequest(prompt="ab", n=2, stop="xy", max_tokens=10)
    job = prepare_completion(body, TOKENIZER, Limits(), torch.device("cpu"))
    a, b = (c.request for c in job.choices)
    ids = {ch: TOKENIZER.encode(ch)[0] for ch in "cdxyz"}
    outputs = [TokenOutput(a, ids["c"]), TokenOutput(b, ids["d"]), TokenOutput(a, ids["x"]), TokenOutput(a, ids["y"]),
               TokenOutput(a, ids["z"]), TokenOutput(b, ids["c"], finish_reason="length")]  # fmt: skip
    run = FakeRun(job, outputs)
    got = collect(run, job)
    text = {i: "".join(p.text for p in got if p.index == i) for i in (0, 1)}
    finish = {p.index: p.finish_reason for p in got if p.finish_reason}
    assert text == {0: "c", 1: "dc"} and finish == {0: "stop", 1: "length"}
    assert run.stopped == [a]  # freed at its stop string; its later token "z" is ignored
    assert job.completion_tokens == 5


def test_an_error_ends_the_stream() -> None:
    job = prepare_completion(CompletionRequest(prompt="ab"), TOKENIZER, Limits(), torch.device("cpu"))
    run = FakeRun(job, [TokenOutput(job.choices[0].request, error=ValueError("broken row"))])
    with pytest.raises(ValueError, match="broken row"):
        collect(run, job)
    assert run.failed
