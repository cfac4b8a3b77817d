"""OpenAI's completion options against a real server: logprobs (log-softmax of the raw logits, checked against
torch and against `qkv eval`), echo, n, stop, prompts as lists and token ids, usage, and the same numbers
streamed."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from qkv.cli import main

PROMPT = "To be, or"


def complete(served, **body) -> dict:
    response = served.client.post("/v1/completions", json={"prompt": PROMPT, **body})
    assert response.status_code == 200, response.text
    return response.json()


def streamed(served, **body) -> list[dict]:
    with served.client.stream("POST", "/v1/completions", json={"prompt": PROMPT, "stream": True, **body}) as r:
        assert r.status_code == 200
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def reference_logprobs(served, ids: list[int]) -> torch.Tensor:
    """log softmax(logits) at every position of ``ids``, computed here with torch's own log_softmax."""
    with torch.no_grad():
        return F.log_softmax(served.bundle.model(torch.tensor([ids]))[0].double(), dim=-1)  # (T, V)


def test_logprobs_are_the_log_softmax_of_the_raw_logits_whatever_the_temperature(gpt) -> None:
    tokenizer = gpt.bundle.tokenizer
    for temperature, seed in ((0, None), (1.3, 4), (0.6, 5)):
        data = complete(gpt, max_tokens=12, temperature=temperature, seed=seed, logprobs=3, ignore_eos=True)
        logprobs = data["choices"][0]["logprobs"]
        new = [tokenizer.token_to_id(t) for t in logprobs["tokens"]]  # a character model: one token per char
        assert len(new) == data["usage"]["completion_tokens"] == 12
        ids = tokenizer.encode(PROMPT) + new  # 21 tokens: within the context of 32
        reference = reference_logprobs(gpt, ids)[len(ids) - 13 : -1]  # the rows that predicted the new tokens
        chosen = reference[torch.arange(12), torch.tensor(new)]
        torch.testing.assert_close(torch.tensor(logprobs["token_logprobs"], dtype=torch.float64), chosen, atol=2e-5,
                                   rtol=0)  # fmt: skip
        for row, top, token in zip(reference, logprobs["top_logprobs"], logprobs["tokens"], strict=True):
            best = row.topk(3)
            expected = {tokenizer.decode([i], skip_special=False): v for i, v in zip(best.indices.tolist(),
                        best.values.tolist(), strict=True)}  # fmt: skip
            assert set(top) == set(expected) | {token} and len(top) in (3, 4)  # the top 3, and the chosen one
            for text, value in expected.items():
                assert top[text] == pytest.approx(value, abs=2e-5)
        if temperature == 0:  # greedy: each chosen token is the likeliest
            assert all(lp == max(top.values()) for lp, top in zip(logprobs["token_logprobs"], logprobs["top_logprobs"],
                       strict=True))  # fmt: skip


def test_text_offsets_count_from_the_start_of_the_prompt(gpt) -> None:
    data = complete(gpt, max_tokens=8, temperature=0, logprobs=0)
    choice = data["choices"][0]
    offsets, tokens = choice["logprobs"]["text_offset"], choice["logprobs"]["tokens"]
    assert offsets == list(range(len(PROMPT), len(PROMPT) + len(tokens)))  # one character per token
    assert "".join(tokens) == choice["text"]
    assert all(len(top) == 1 for top in choice["logprobs"]["top_logprobs"])  # logprobs 0: the chosen token only
    echoed = complete(gpt, max_tokens=8, temperature=0, logprobs=0, echo=True)["choices"][0]
    text, lp = echoed["text"], echoed["logprobs"]
    assert text == PROMPT + choice["text"] and lp["text_offset"][len(PROMPT) :] == offsets
    assert all(text[o : o + len(t)] == t for o, t in zip(lp["text_offset"], lp["tokens"], strict=True))


def test_echo_logprobs_add_up_to_what_qkv_eval_reports(gpt, gpt_run, tmp_path, capsys) -> None:
    """The same text scored two ways: the API's echo and `qkv eval` (longer than the context: several windows)."""
    text = "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\nThe slings"
    (tmp_path / "text.txt").write_text(text)
    assert main(["eval", gpt_run, str(tmp_path / "text.txt"), "--json"]) == 0
    score = json.loads(capsys.readouterr().out)
    data = complete(gpt, prompt=text, echo=True, max_tokens=0, logprobs=1)
    choice = data["choices"][0]
    lp = choice["logprobs"]
    assert choice["text"] == text and choice["finish_reason"] == "length"
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None  # nothing predicts the first token
    assert len(lp["tokens"]) == len(text) == data["usage"]["prompt_tokens"] and data["usage"]["completion_tokens"] == 0
    assert score["tokens"] == len(text) - 1
    total = sum(lp["token_logprobs"][1:])
    assert -total == pytest.approx(score["loss"] * score["tokens"], rel=1e-9)
    ids = gpt.bundle.tokenizer.encode(text)
    head = reference_logprobs(gpt, ids[:32])  # the first window, independently
    expected = head[torch.arange(31), torch.tensor(ids[1:32])]
    torch.testing.assert_close(torch.tensor(lp["token_logprobs"][1:32], dtype=torch.float64), expected, atol=2e-5,
                               rtol=0)  # fmt: skip


def test_n_choices_are_numbered_reproducible_and_counted_in_usage(gpt) -> None:
    body = dict(max_tokens=10, temperature=1.3, seed=11, ignore_eos=True)
    data = complete(gpt, n=3, **body)
    texts = [c["text"] for c in data["choices"]]
    assert [c["index"] for c in data["choices"]] == [0, 1, 2] and len(set(texts)) > 1
    assert complete(gpt, n=3, **body)["choices"] == data["choices"]  # the seed covers all n
    assert complete(gpt, n=1, **body)["choices"][0]["text"] == texts[0]  # choices are drawn one after the other
    prompt_tokens = len(PROMPT)
    assert data["usage"] == {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": 30,
        "total_tokens": prompt_tokens + 30,
    }
    echoed = complete(gpt, n=3, echo=True, **body)
    assert [c["text"] for c in echoed["choices"]] == [PROMPT + t for t in texts]
    assert echoed["usage"] == data["usage"]  # the echoed prompt is not a completion token


def test_several_prompts_and_token_id_prompts(gpt) -> None:
    tokenizer = gpt.bundle.tokenizer
    prompts = ["To be", "Whether 'tis"]
    data = complete(gpt, prompt=prompts, n=2, max_tokens=6, temperature=0)
    assert [c["index"] for c in data["choices"]] == [0, 1, 2, 3]  # prompt_index * n + j
    for i, prompt in enumerate(prompts):
        alone = complete(gpt, prompt=prompt, max_tokens=6, temperature=0)["choices"][0]["text"]
        assert data["choices"][2 * i]["text"] == data["choices"][2 * i + 1]["text"] == alone
        by_ids = complete(gpt, prompt=tokenizer.encode(prompt), max_tokens=6, temperature=0)
        assert by_ids["choices"][0]["text"] == alone
    as_ids = complete(gpt, prompt=[tokenizer.encode(p) for p in prompts], max_tokens=6, temperature=0, echo=True)
    assert [c["text"] for c in as_ids["choices"]] == [p + data["choices"][2 * i]["text"] for i, p in enumerate(prompts)]
    assert data["usage"]["prompt_tokens"] == sum(len(p) for p in prompts)


def test_stop_strings_end_the_text_and_are_left_out(gpt) -> None:
    full = complete(gpt, max_tokens=60, temperature=0, ignore_eos=True)["choices"][0]["text"]
    stop = full[7:10]  # three characters: three tokens, so the check must hold text back across tokens
    cut = full[: full.index(stop)]
    for stops in (stop, [stop], ["NEVER-THERE", stop]):
        data = complete(gpt, max_tokens=60, temperature=0, ignore_eos=True, stop=stops, logprobs=1)
        choice = data["choices"][0]
        assert choice["text"] == cut and choice["finish_reason"] == "stop"
        assert "".join(choice["logprobs"]["tokens"]) == cut  # the tokens of the text returned, no more
        assert data["usage"]["completion_tokens"] == len(cut) + len(stop)  # the stop's tokens were generated
    chunks = streamed(gpt, max_tokens=60, temperature=0, ignore_eos=True, stop=stop)
    assert all(stop not in c["choices"][0]["text"] for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks) == cut
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    unmet = complete(gpt, max_tokens=20, temperature=0, ignore_eos=True, stop="NEVER-THERE")["choices"][0]
    assert unmet["text"] == full[:20] and unmet["finish_reason"] == "length"


def test_a_stream_carries_the_same_choices_and_logprobs_as_one_answer(gpt) -> None:
    body = dict(prompt=["To be", "Or not"], n=2, max_tokens=9, temperature=1.1, seed=21, logprobs=2, echo=True)
    whole = complete(gpt, **body)
    chunks = streamed(gpt, **body)
    assert {c["id"] for c in chunks} == {chunks[0]["id"]}
    rebuilt = {}
    for chunk in chunks:
        (choice,) = chunk["choices"]
        into = rebuilt.setdefault(choice["index"], {"text": "", "logprobs": {k: [] for k in choice["logprobs"]}})
        into["text"] += choice["text"]
        for key, values in choice["logprobs"].items():
            into["logprobs"][key] += values
        into["finish_reason"] = choice["finish_reason"]
    assert len(rebuilt) == 4
    for choice in whole["choices"]:
        assert rebuilt[choice["index"]] == {k: choice[k] for k in ("text", "logprobs", "finish_reason")}
    assert chunks[-1]["usage"] == whole["usage"] and all("usage" not in c for c in chunks[:-1])


def test_max_tokens_zero_scores_the_prompt_only(gpt) -> None:
    data = complete(gpt, max_tokens=0)
    assert data["choices"][0]["text"] == "" and data["usage"]["completion_tokens"] == 0


def test_tokenize_and_detokenize_round_trip(gpt, translator) -> None:
    tokenizer = gpt.bundle.tokenizer
    data = gpt.client.post("/tokenize", json={"prompt": "To be", "return_token_strs": True}).json()
    assert data == {"tokens": tokenizer.encode("To be"), "count": 5, "max_model_len": 32, "token_strs": list("To be")}
    assert "token_strs" not in gpt.client.post("/tokenize", json={"prompt": "To"}).json()
    assert gpt.client.post("/detokenize", json={"tokens": data["tokens"]}).json() == {"prompt": "To be"}
    bad = gpt.client.post("/detokenize", json={"tokens": [1, 99_999]})
    assert bad.status_code == 400 and "99999" in bad.json()["error"]["message"]
    upper = translator.client.post("/tokenize", json={"prompt": "ONE", "target": True}).json()
    assert upper["tokens"] == (translator.bundle.target_tokenizer or translator.bundle.tokenizer).encode("ONE")
    assert gpt.client.post("/tokenize", json={"prompt": "x", "target": True}).status_code == 400
