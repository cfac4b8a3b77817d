"""The endpoints the playground draws from: model info, health, next-token distribution, attention weights,
translation."""

from __future__ import annotations

import json

import pytest
import torch

from qkv.decoding.sampling import top_k_filter, top_p_filter
from qkv.decoding.translator import Translator
from qkv.layers.softmax import softmax


def post(served, path: str, **body) -> dict:
    response = served.client.post(path, json=body)
    assert response.status_code == 200, response.text
    return response.json()


def test_health_and_model_info(gpt, translator, encoder) -> None:
    health = gpt.client.get("/health").json()
    assert health["status"] == "ok" and health["kind"] == "gpt" and health["active_generations"] == 0
    info = gpt.client.get("/v1/model").json()
    config = gpt.bundle.config
    assert (info["kind"], info["role"]) == ("gpt", "language model")
    assert info["layers"] == config.n_layers and info["heads"] == config.n_heads
    assert info["context_length"] == 32 and info["vocab_size"] == gpt.bundle.tokenizer.vocab_size
    assert info["parameters"] == sum(p.numel() for p in gpt.bundle.model.parameters())
    assert info["tokenizer"] == "char" and info["limits"]["max_tokens"] == 300
    assert "/v1/completions" in info["endpoints"] and "/v1/translations" not in info["endpoints"]
    t = translator.client.get("/v1/model").json()
    assert (t["kind"], t["role"]) == ("transformer", "translator")
    assert t["encoder_layers"] == 1 and t["decoder_layers"] == 1 and t["layers"] == 2
    assert "/v1/translations" in t["endpoints"]
    e = encoder.client.get("/v1/model").json()
    assert (e["kind"], e["role"]) == ("encoder", "encoder") and e["endpoints"][0] == "/v1/attention"
    models = gpt.client.get("/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == info["name"]


def model_logits(served, prompt: str) -> torch.Tensor:
    ids = torch.tensor([served.bundle.tokenizer.encode(prompt)])
    with torch.no_grad():
        return served.bundle.model(ids)[0, -1].float()


def test_next_token_at_t1_is_the_softmax_of_the_models_logits(gpt) -> None:
    vocab = gpt.bundle.tokenizer.vocab_size
    data = post(gpt, "/v1/next-token", prompt="To be, or", n=vocab)
    probs = {t["id"]: t["prob"] for t in data["tokens"]}
    assert len(probs) == vocab and sum(probs.values()) == pytest.approx(1, abs=1e-5)
    expected = softmax(model_logits(gpt, "To be, or"))
    got = torch.tensor([probs[i] for i in range(vocab)])
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-4)
    assert all(t["prob"] == pytest.approx(t["prob_t1"]) for t in data["tokens"])
    assert [t["prob"] for t in data["tokens"]] == sorted((t["prob"] for t in data["tokens"]), reverse=True)
    assert data["kept"] == vocab and data["context_tokens"] == len("To be, or")
    first = data["tokens"][0]
    assert first["text"] == gpt.bundle.tokenizer.decode([first["id"]], skip_special=False)
    space = gpt.bundle.tokenizer.encode(" ")[0]
    (token,) = [t for t in data["tokens"] if t["id"] == space]
    assert token["text"] == " " and token["label"] == "␣"  # shown as every qkv view shows a space


@pytest.mark.parametrize(("temperature", "top_k", "top_p"), [(0.5, None, None), (1.5, 3, None), (0.8, None, 0.6)])
def test_next_token_applies_temperature_top_k_and_top_p_as_sampling_does(gpt, temperature, top_k, top_p) -> None:
    vocab = gpt.bundle.tokenizer.vocab_size
    data = post(gpt, "/v1/next-token", prompt="To be", n=vocab, temperature=temperature, top_k=top_k, top_p=top_p)
    logits = model_logits(gpt, "To be")
    expected = softmax(top_p_filter(top_k_filter((logits - logits.max()) / temperature, top_k), top_p))
    got = torch.tensor([{t["id"]: t["prob"] for t in data["tokens"]}[i] for i in range(vocab)])
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-4)
    assert sum(got.tolist()) == pytest.approx(1, abs=1e-5)
    assert data["kept"] == int((expected > 0).sum())
    if top_k:
        assert data["kept"] == top_k
    if top_p:
        assert 1 <= data["kept"] < vocab


def test_next_token_at_t0_puts_all_the_mass_on_the_argmax(gpt) -> None:
    data = post(gpt, "/v1/next-token", prompt="To be", temperature=0, n=5)
    assert data["tokens"][0]["prob"] == 1 and all(t["prob"] == 0 for t in data["tokens"][1:])
    assert data["tokens"][0]["id"] == int(model_logits(gpt, "To be").argmax())
    assert data["kept"] == 1 and data["entropy_bits"] == 0
    higher = post(gpt, "/v1/next-token", prompt="To be", temperature=2.0)
    lower = post(gpt, "/v1/next-token", prompt="To be", temperature=0.5)
    assert higher["entropy_bits"] > lower["entropy_bits"]  # a higher temperature flattens the distribution


def test_next_token_with_an_empty_prompt_starts_from_bos(gpt) -> None:
    assert len(post(gpt, "/v1/next-token", prompt="")["tokens"]) == 10


def check_maps(weights: list, layers: int, heads: int, rows: int, cols: int, *, causal: bool = False) -> None:
    w = torch.tensor(weights)
    assert w.shape == (layers, heads, rows, cols)
    torch.testing.assert_close(w.sum(-1), torch.ones(layers, heads, rows), atol=1e-3 * cols, rtol=0)
    assert (w >= 0).all()
    if causal:
        assert (w.triu(1) == 0).all()


def test_gpt_attention_rows_sum_to_one_and_never_look_ahead(gpt) -> None:
    data = post(gpt, "/v1/attention", text="To be, or not")
    assert data["kind"] == "gpt" and data["source_tokens"] == list("To␣be,␣or␣not")  # labels, as the CLI shows
    (name,) = data["groups"]
    group = data["groups"][name]
    assert name == "decoder" and group["causal"] and "causal self-attention" in group["description"]
    assert group["query_tokens"] == group["key_tokens"] == data["source_tokens"]
    check_maps(group["weights"], 2, 4, 13, 13, causal=True)
    rounded = post(gpt, "/v1/attention", text="To be", decimals=2)["groups"]["decoder"]["weights"]
    assert all(round(v, 2) == v for layer in rounded for head in layer for row in head for v in row)


def test_encoder_attention_looks_both_ways(encoder) -> None:
    data = post(encoder, "/v1/attention", text="To be")
    assert data["source_tokens"] == ["<bos>", *"To␣be", "<eos>"]
    group = data["groups"]["encoder"]
    assert not group["causal"] and "every token of the text" in group["description"]
    check_maps(group["weights"], 2, 2, 7, 7)
    assert torch.tensor(group["weights"]).triu(1).sum() > 0


def test_translator_attention_has_encoder_decoder_and_cross_maps(translator) -> None:
    data = post(translator, "/v1/attention", text="one two three")
    greedy = Translator.from_bundle(translator.bundle).translate(["one two three"], beam=1)[0]
    assert data["target_text"] == greedy and data["generated"]  # the model's own greedy translation by default
    n_src, n_tgt = len("one two three"), len(data["target_tokens"])
    assert data["target_tokens"][0] == "<bos>" and n_tgt == len(translator.bundle.tokenizer.encode(greedy)) + 1
    groups = data["groups"]
    assert list(groups) == ["encoder", "decoder", "cross"]
    check_maps(groups["encoder"]["weights"], 1, 2, n_src, n_src)
    check_maps(groups["decoder"]["weights"], 1, 2, n_tgt, n_tgt, causal=True)
    check_maps(groups["cross"]["weights"], 1, 2, n_tgt, n_src)
    assert groups["cross"]["query_tokens"] == data["target_tokens"]
    assert groups["cross"]["key_tokens"] == data["source_tokens"]
    given = post(translator, "/v1/attention", text="one two", target="TWO ONE")
    assert given["target_text"] == "TWO ONE" and not given["generated"]
    assert len(given["target_tokens"]) == len("TWO ONE") + 1


def test_translations_match_the_translator(translator) -> None:
    reference = Translator.from_bundle(translator.bundle)
    data = post(translator, "/v1/translations", text="one two three")
    assert data["object"] == "translation"
    assert data["translations"] == [{"text": reference.translate(["one two three"], beam=1)[0], "index": 0}]
    sentences = ["four five", "six seven eight"]
    data = post(translator, "/v1/translations", text=sentences, beam=3)
    assert [t["text"] for t in data["translations"]] == reference.translate(sentences, beam=3)
    assert [t["index"] for t in data["translations"]] == [0, 1]
    assert data["usage"]["prompt_tokens"] == sum(len(s) for s in sentences)


def test_translator_next_token_follows_the_target_prefix(translator) -> None:
    data = post(translator, "/v1/next-token", prompt="one two", target="TW", n=5)
    model, tokenizer = translator.bundle.model, translator.bundle.tokenizer
    with torch.no_grad():
        memory = model.encode(torch.tensor([tokenizer.encode("one two")]))
        logits = model.decode(torch.tensor([[tokenizer.bos_id, *tokenizer.encode("TW")]]), memory)[0, -1]
    assert data["tokens"][0]["id"] == int(logits.argmax())
    assert data["tokens"][0]["prob"] == pytest.approx(float(softmax(logits)[logits.argmax()]), rel=1e-4)


def test_the_playground_is_served_and_needs_nothing_from_outside(gpt) -> None:
    page = gpt.client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert '<script src="/static/app.js">' in page.text and 'href="/static/style.css"' in page.text
    for name in ("app.js", "style.css"):
        asset = gpt.client.get(f"/static/{name}")
        assert asset.status_code == 200 and len(asset.text) > 500
        assert "http://" not in asset.text and "https://" not in asset.text  # no CDN: works offline
    assert "https://" not in page.text and "http://" not in page.text
    for label in ("temperature", "top-k", "top-p", "prompt"):
        assert f'for="{label}"' in page.text  # every control has a label


def cli_json(capsys, *argv: str) -> dict:
    from qkv.cli import main

    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def test_qkv_next_and_the_playground_show_the_same_numbers(gpt, translator, capsys) -> None:
    """One implementation: the chart's numbers are `qkv next`'s, to the last bit, filters included."""
    for served, text, target in ((gpt, "To be, or", None), (translator, "one two", "TW")):
        flags = ["--target", target] if target else []
        cli = cli_json(capsys, "next", str(served.bundle.path), text, *flags, "--temperatures", "0.7", "--top", "8",
                       "--top-k", "5", "--top-p", "0.95", "--no-plot", "--json")  # fmt: skip
        api = post(
            served, "/v1/next-token", prompt=text, target=target or "", temperature=0.7, top_k=5, top_p=0.95, n=8
        )
        assert [t["id"] for t in cli["top"]] == [t["id"] for t in api["tokens"]]
        assert [t["token"] for t in cli["top"]] == [t["label"] for t in api["tokens"]]
        assert [t["logit"] for t in cli["top"]] == [t["logit"] for t in api["tokens"]]
        assert [t["probabilities"]["0.7"] for t in cli["top"]] == [t["prob"] for t in api["tokens"]]
        assert cli["kept"]["0.7"] == api["kept"] <= 5


def test_qkv_attention_and_the_playground_show_the_same_numbers(gpt, translator, tmp_path, capsys) -> None:
    for served, text in ((gpt, "To be, or not"), (translator, "one two three")):
        out = str(tmp_path / f"{served.bundle.config.kind}.png")
        cli = cli_json(capsys, "attention", str(served.bundle.path), text, "--out", out, "--json")
        api = post(served, "/v1/attention", text=text, decimals=6)  # `qkv attention --json` rounds to 6 places
        for key in ("kind", "source_tokens", "target_tokens", "generated"):
            assert cli[key] == api[key], key
        assert list(cli["groups"]) == list(api["groups"])
        for name, group in cli["groups"].items():
            for key in ("title", "causal", "query_tokens", "key_tokens", "weights"):
                assert group[key] == api["groups"][name][key], (name, key)
