"""A sliding attention window (Mistral v0.1, Qwen2 with use_sliding_window) runs in qkv's Llama and equals
transformers' eager attention on sequences longer than the window; it is saved in config.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from qkv.decoding import Engine, Request, SamplingParams, generate
from qkv.errors import QkvError
from qkv.model_dir import load_model_dir
from qkv.models import LlamaConfig
from qkv.models.llama.huggingface import config_from_hf
from qkv.pretrained import load_pretrained, read_hf_config, save_as_qkv
from tests.pretrained.conftest import llama_config, save_llama

transformers = pytest.importorskip("transformers")

WINDOW = 4
SHAPES = {  # each layer slides a window of 4 positions over sequences of up to 24
    "mistral": dict(sliding_window=WINDOW, num_key_value_heads=2),
    "qwen2": dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=0, num_key_value_heads=2),
}


@pytest.fixture(scope="module", params=list(SHAPES))
def windowed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """(folder, the Hugging Face model with eager attention) of one windowed shape."""
    folder = tmp_path_factory.mktemp(f"{request.param}-window")
    save_llama(folder, request.param, seed=3, **SHAPES[request.param])
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    return folder, hf


def test_the_window_is_kept(windowed) -> None:
    folder, hf = windowed
    config = config_from_hf(read_hf_config(folder))
    assert config.sliding_window == WINDOW < config.context_length
    assert hf.config.sliding_window == WINDOW  # transformers slides it too (the reference is not full attention)


def test_logits_match_transformers_eager_past_the_window(windowed) -> None:
    folder, hf = windowed
    bundle = load_pretrained(folder)
    torch.manual_seed(0)
    ids = torch.randint(0, hf.config.vocab_size, (3, 24))
    mask = torch.ones_like(ids)
    mask[1, 17:] = 0  # right padding
    mask[2, 6:] = 0
    with torch.no_grad():
        reference = hf(ids, attention_mask=mask).logits
        ours = bundle.model(ids, key_padding_mask=mask == 0)
        unwindowed = load_pretrained(folder).model
        for block in unwindowed.decoder.blocks:
            block.self_attn.window = None
        full = unwindowed(ids, key_padding_mask=mask == 0)
    real = mask.bool()
    torch.testing.assert_close(ours[real], reference[real], atol=1e-4, rtol=0)
    assert (full[real] - reference[real]).abs().max() > 1e-3  # the window matters at these lengths


def test_cached_generation_slides_the_window_as_transformers_does(windowed) -> None:
    folder, hf = windowed
    bundle = load_pretrained(folder)
    prompt = torch.tensor([bundle.tokenizer.encode("Tokens are little pieces of")])
    assert prompt.shape[1] > WINDOW
    reference = hf.generate(
        prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=12, pad_token_id=0,
        eos_token_id=None,
    )  # fmt: skip
    ours = generate(bundle.model, prompt, max_new_tokens=12, temperature=0.0, step="model")
    assert ours.tolist() == reference.tolist()


def test_the_window_is_saved_in_config_json(windowed, tmp_path: Path) -> None:
    folder, _ = windowed
    save_as_qkv(load_pretrained(folder), tmp_path / "qkv")
    assert json.loads((tmp_path / "qkv" / "config.json").read_text())["sliding_window"] == WINDOW
    reloaded = load_model_dir(tmp_path / "qkv")
    assert reloaded.config.sliding_window == WINDOW
    assert all(block.self_attn.window == WINDOW for block in reloaded.model.decoder.blocks)


@pytest.mark.parametrize("window", [0, -1, 2.5, True, "4"])
def test_a_bad_window_is_refused_in_one_line(window: object) -> None:
    with pytest.raises(QkvError, match="sliding_window=") as error:
        LlamaConfig(sliding_window=window)  # type: ignore[arg-type]
    assert "\n" not in str(error.value)


def test_a_window_as_long_as_the_context_is_full_attention() -> None:
    config = config_from_hf(llama_config("mistral", 100, sliding_window=128).to_dict())  # 128 positions
    assert config.sliding_window is None and config.context_length == 128


def test_a_window_over_some_layers_only_is_refused() -> None:
    hf = llama_config("qwen2", 100, use_sliding_window=True, sliding_window=32, max_window_layers=1)  # layer 1 of 2
    with pytest.raises(QkvError, match="slides it over 1 of its 2 layers"):
        config_from_hf(hf.to_dict())


def test_the_fast_decode_step_slides_the_window_too(windowed) -> None:
    folder, _ = windowed
    bundle = load_pretrained(folder)
    prompt = torch.tensor([bundle.tokenizer.encode("Tokens are little pieces of")])
    reference = generate(bundle.model, prompt, max_new_tokens=12, temperature=0.0, step="model")
    for step in ("static", "compiled"):  # the eager step reads p + 1 keys; the compiled one all of them, masked
        assert generate(bundle.model, prompt, max_new_tokens=12, temperature=0.0, step=step).tolist() == (
            reference.tolist()
        ), step
    engine = Engine(bundle.model, 2, 32)  # two rows at their own positions: the masks of the batch
    ids = prompt[0].tolist()
    requests = [Request(ids, SamplingParams(max_new_tokens=12, temperature=0)), Request(ids[:3], SamplingParams(
        max_new_tokens=12, temperature=0))]  # fmt: skip
    made: dict[int, list[int]] = {0: [], 1: []}
    outputs = engine.add(requests)
    while outputs:
        for out in outputs:
            made[requests.index(out.request)].append(out.token)
        outputs = engine.step()
    assert made[0] == reference[0, len(ids) :].tolist()
