"""The decoding engine (qkv.decoding.engine): every request's tokens equal its solo run with
:func:`qkv.decoding.generate`, whatever its neighbours, when it joined, and whoever left; its outputs are data."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from qkv import GPT, GPTConfig
from qkv.decoding import Engine, Request, SamplingParams, TokenOutput, generate
from qkv.errors import QkvError

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: one thread is fastest


def tiny(kind: str = "gpt") -> GPT:
    torch.manual_seed(0)
    if kind == "llama":
        from qkv.models import LlamaConfig
        from qkv.models.llama import Llama

        config = LlamaConfig(vocab_size=50, d_model=32, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=48,
                             context_length=24, init_std=0.5)  # fmt: skip
        return Llama(config).eval()
    return GPT(GPTConfig(vocab_size=50, d_model=32, n_heads=4, n_layers=2, context_length=24, init_std=0.5)).eval()


@dataclass(eq=False)
class Seen:
    """What the engine returned for one request."""

    request: Request
    seed: int | None = None
    out: list[int] = field(default_factory=list)
    finish: str | None = None
    error: BaseException | None = None


def ask(prompt: list[int], *, seed: int | None = None, eos: int | None = None, **settings) -> Seen:
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    stops = frozenset() if eos is None else frozenset({eos})
    return Seen(Request(prompt, SamplingParams(**settings), stops, generator), seed)


def solo(model: GPT, s: Seen) -> list[int]:
    generator = None if s.seed is None else torch.Generator().manual_seed(s.seed)
    eos = next(iter(s.request.stop_ids), None)
    out = generate(model, s.request.prompt, s.request.params, eos_id=eos, generator=generator)
    return out[0, len(s.request.prompt) :].tolist()


def record(seen: dict[int, Seen], outputs: list[TokenOutput]) -> None:
    for output in outputs:
        s = seen[id(output.request)]
        assert s.finish is None and s.error is None, "no output after a request has ended"
        if output.token is not None:
            s.out.append(output.token)
        s.finish, s.error = output.finish_reason, output.error


def run(engine: Engine, arrivals: dict[int, list[Seen]], steps: int = 100, together: bool = False) -> None:
    """Add each step's arrivals (as slots free up; ``together``: all that fit in one prefill), then step, until
    everything has left."""
    seen = {id(s.request): s for group in arrivals.values() for s in group}
    waiting: list[Seen] = []
    for t in range(steps):
        waiting += arrivals.get(t, [])
        if together and waiting and engine.free:
            joining, waiting = waiting[: engine.free], waiting[engine.free :]
            record(seen, engine.add([s.request for s in joining]))
        while waiting and engine.free:
            record(seen, engine.add([waiting.pop(0).request]))
        if not engine.running and not waiting and t > max(arrivals):
            return
        record(seen, engine.step())


@pytest.mark.parametrize("together", [False, True], ids=["one-by-one", "prefilled-together"])
@pytest.mark.parametrize("kind", ["gpt", "llama"])
def test_greedy_and_seeded_requests_joining_at_different_steps_equal_their_solo_runs(kind: str, together) -> None:
    model = tiny(kind)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(50, (n,), generator=g).tolist() for n in (3, 9, 1, 14, 6, 5)]
    settings = [
        dict(temperature=0),
        dict(temperature=0.9, seed=5),
        dict(temperature=1.2, top_k=5, seed=6, repetition_penalty=1.3),
        dict(temperature=0, frequency_penalty=1.5, presence_penalty=0.5),
        dict(temperature=0.8, top_p=0.8, min_p=0.05, seed=7),
        dict(temperature=0, eos=3),
    ]
    requests = [ask(p, max_new_tokens=8 + i, **s) for i, (p, s) in enumerate(zip(prompts, settings, strict=True))]
    arrivals = {0: requests[:2], 2: requests[2:4], 5: requests[4:]}
    run(Engine(model, slots=3, max_len=24), arrivals, together=together)
    for s in requests:
        assert s.finish in ("stop", "length") and s.error is None
        assert s.out == solo(model, s)
        assert (s.finish == "stop") == (s.out[-1] in s.request.stop_ids)


def test_a_seeded_request_draws_the_same_tokens_whatever_its_neighbours() -> None:
    model = tiny()
    texts = []
    for neighbours in (0, 1, 3):
        mine = ask([1, 2, 3], max_new_tokens=12, temperature=1.0, seed=42)
        others = [ask([4 + i] * (2 + i), max_new_tokens=5 + i, temperature=1.5, seed=i) for i in range(neighbours)]
        run(Engine(model, slots=4, max_len=24), {0: others, 1: [mine]})
        texts.append(mine.out)
    assert texts[0] == texts[1] == texts[2] == solo(model, mine)


def test_past_the_context_the_window_slides_as_in_generate() -> None:
    model = tiny()
    long = ask(list(range(20)), max_new_tokens=10, temperature=0)  # 20 + 10 > context 24
    short = ask([7, 8], max_new_tokens=12, temperature=0)
    run(Engine(model, slots=2, max_len=24), {0: [long, short]})
    assert long.out == solo(model, long) and short.out == solo(model, short)


def test_a_failing_request_leaves_alone_and_an_aborted_one_frees_its_slot() -> None:
    model = tiny()
    bad = ask([5, 6, 7], max_new_tokens=10, temperature=1.0)
    bad.request.generator = "not a generator"  # its own sampling raises
    gone = ask([9, 9], max_new_tokens=50, temperature=0)
    good = ask([1, 2], max_new_tokens=10, temperature=0)
    engine = Engine(model, slots=3, max_len=24)
    seen = {id(s.request): s for s in (bad, gone, good)}
    record(seen, engine.add([s.request for s in (bad, gone, good)]))
    assert isinstance(bad.error, TypeError) and bad.request not in engine.requests and bad.out == []
    record(seen, engine.step())
    assert engine.abort([gone.request]) == 1 and engine.requests == [good.request] and engine.free == 2
    while engine.running:
        record(seen, engine.step())
    assert good.finish == "length" and good.out == solo(model, good)
    assert gone.finish is None and gone.error is None and len(gone.out) == 2  # left when aborted, nothing more


def test_logprobs_are_of_the_raw_logits_and_the_top_alternatives_are_the_largest() -> None:
    model = tiny()
    s = ask([3, 4, 5], max_new_tokens=4, temperature=0.7, seed=3, logprobs=3, repetition_penalty=1.5)
    engine = Engine(model, slots=1, max_len=24, step="model")
    outputs = engine.add([s.request])
    ids = list(s.request.prompt)
    while True:
        (output,) = outputs
        with torch.no_grad():
            logits = model(torch.tensor([ids]))[0, -1]
        expected = torch.log_softmax(logits.double(), dim=-1)
        assert output.logprob == pytest.approx(float(expected[output.token]), abs=1e-4)
        top_ids = [i for i, _ in output.top]
        assert top_ids == expected.topk(3).indices.tolist()
        ids.append(output.token)
        if output.finish_reason:
            break
        outputs = engine.step()
    assert output.finish_reason == "length" and len(ids) == 3 + 4


def test_non_finite_logits_end_the_request_with_one_clear_error() -> None:
    model = tiny()
    with torch.no_grad():
        model.unembedding.weight[7] = float("nan")  # tied: W_E row 7 too
    s = ask([1, 2], max_new_tokens=5, temperature=0)
    (output,) = Engine(model, slots=1, max_len=24).add([s.request])
    assert isinstance(output.error, QkvError) and "not finite" in str(output.error)


def test_requests_beyond_the_free_slots_and_rows_that_do_not_fit_are_refused() -> None:
    model = tiny()
    engine = Engine(model, slots=1, max_len=8)
    with pytest.raises(QkvError, match="free slots"):
        engine.add([ask([1]).request, ask([2]).request])
    (output,) = engine.add([ask([1, 2, 3], max_new_tokens=10).request])
    assert isinstance(output.error, QkvError) and "cache row of 8 positions" in str(output.error)
    (output,) = engine.add([ask([1, 2], max_new_tokens=0).request])
    assert output.finish_reason == "length" and output.token is None and not engine.running
