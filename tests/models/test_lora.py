"""LoRA on whole models: PEFT loads qkv's adapters onto the transformers model and gives qkv's logits (Llama; GPT-2,
whose fused c_attn is one adapter over W_q, W_k and W_v), targets by PEFT's names, merging, and decoding."""

from __future__ import annotations

import pytest
import torch

import qkv
from qkv.adapter_dir import ADAPTER_FILE, save_adapter_config, save_adapter_weights
from qkv.decoding import generate
from qkv.errors import QkvError
from qkv.layers.lora import LoRALinear
from qkv.models.lora import (
    AdapterWeights,
    LoRASettings,
    adapted_targets,
    apply_lora,
    load_peft_state,
    merge_lora,
    peft_state,
)

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")


def with_random_adapters(bundle, settings: LoRASettings):
    """The bundle's model with LoRA applied and B drawn at random (a trained adapter, not a fresh one)."""
    apply_lora(bundle.model, settings)
    with torch.no_grad():
        for name, parameter in bundle.model.named_parameters():
            if name.endswith("lora_B"):
                parameter.normal_(0, 0.2)
    return bundle.model.eval()


def peft_logits(folder, adapter, ids: torch.Tensor, architecture) -> torch.Tensor:  # noqa: ANN001
    base = architecture.from_pretrained(folder, dtype=torch.float32)
    model = peft.PeftModel.from_pretrained(base, adapter).eval()
    with torch.no_grad():
        return model(input_ids=ids).logits


@pytest.mark.parametrize("targets", [("q_proj", "v_proj"), ("all",)])
def test_peft_loads_qkvs_llama_adapters_and_gives_its_logits(tiny_llama_dir, tmp_path, targets) -> None:
    bundle = qkv.load(tiny_llama_dir)
    model = with_random_adapters(bundle, LoRASettings(rank=4, alpha=8, targets=targets))
    save_adapter_config(tmp_path, model, LoRASettings(4, 8), base=str(tiny_llama_dir))
    save_adapter_weights(tmp_path / ADAPTER_FILE, model)
    ids = torch.randint(0, bundle.config.vocab_size, (2, 12))
    expected = peft_logits(tiny_llama_dir, tmp_path, ids, transformers.LlamaForCausalLM)
    with torch.no_grad():
        torch.testing.assert_close(model(ids), expected, atol=1e-4, rtol=1e-4)
        assert not torch.allclose(bundle.model(ids), qkv.load(tiny_llama_dir).model(ids), atol=1e-3)  # B mattered


def test_peft_loads_a_gpt2_adapter_whose_c_attn_spans_three_projections(tiny_gpt2_dir, tmp_path) -> None:
    bundle = qkv.load(tiny_gpt2_dir)
    model = with_random_adapters(bundle, LoRASettings(rank=2, alpha=4, targets=("all",)))
    layers = dict(model.named_modules())
    assert layers["decoder.blocks.0.self_attn.key"].lora_A is layers["decoder.blocks.0.self_attn.query"].lora_A
    save_adapter_config(tmp_path, model, LoRASettings(2, 4), base=str(tiny_gpt2_dir))
    save_adapter_weights(tmp_path / ADAPTER_FILE, model)
    ids = torch.randint(0, bundle.config.vocab_size, (2, 10))
    expected = peft_logits(tiny_gpt2_dir, tmp_path, ids, transformers.GPT2LMHeadModel)
    with torch.no_grad():
        torch.testing.assert_close(model(ids), expected, atol=1e-4, rtol=1e-4)


def test_peft_state_round_trips_into_a_fresh_model(tiny_llama_dir) -> None:
    trained = with_random_adapters(qkv.load(tiny_llama_dir), LoRASettings(3, 3, targets=("all",)))
    fresh = apply_lora(qkv.load(tiny_llama_dir).model, LoRASettings(3, 3, targets=("all",))).eval()
    load_peft_state(fresh, peft_state(trained), where="the test")
    ids = torch.randint(0, 100, (1, 9))
    with torch.no_grad():
        torch.testing.assert_close(fresh(ids), trained(ids))
    with pytest.raises(QkvError, match="lacks"):
        load_peft_state(fresh, dict(list(peft_state(trained).items())[1:]), where="the test")


def test_targets_are_peft_names_checked_against_the_family(tiny_llama_dir) -> None:
    model = qkv.load(tiny_llama_dir).model
    apply_lora(model, LoRASettings(2, 4))  # the family's default: PEFT's q_proj and v_proj
    assert adapted_targets(model) == ("q_proj", "v_proj")
    assert all(not p.requires_grad for n, p in model.named_parameters() if "lora_" not in n)
    assert sum(isinstance(m, LoRALinear) for m in model.modules()) == 2 * model.config.n_layers
    with pytest.raises(QkvError, match=r"'c_attn' is not a projection of llama models: choose among q_proj, .*, down"):
        apply_lora(qkv.load(tiny_llama_dir).model, LoRASettings(2, 4, targets=("c_attn",)))
    with pytest.raises(QkvError, match="already has a LoRA adapter"):
        apply_lora(model, LoRASettings(2, 4))
    with pytest.raises(QkvError, match="rank must be a positive whole number"):
        LoRASettings(0, 4)


def test_merged_model_equals_base_plus_adapters(tiny_llama_dir) -> None:
    model = with_random_adapters(qkv.load(tiny_llama_dir), LoRASettings(4, 8, targets=("all",)))
    ids = torch.randint(0, 100, (2, 11))
    with torch.no_grad():
        before = model(ids)
        merge_lora(model)
        assert not any(isinstance(m, LoRALinear) for m in model.modules())
        torch.testing.assert_close(model(ids), before, atol=1e-5, rtol=1e-5)


def test_decoding_a_lora_model_equals_its_own_forward(tiny_llama_dir) -> None:
    """The fast decode step (W_q, W_k, W_v fused: bases stacked, updates added) picks the tokens that the model's
    full forward ranks first, at every step (greedy)."""
    model = with_random_adapters(qkv.load(tiny_llama_dir), LoRASettings(4, 8, targets=("q_proj", "k_proj", "o_proj")))
    prompt = torch.randint(0, 100, (1, 5))
    fast = generate(model, prompt, max_new_tokens=8, temperature=0.0, step="static")
    slow = generate(model, prompt, max_new_tokens=8, temperature=0.0, step="model")
    assert torch.equal(fast, slow)
    with torch.no_grad():
        logits = model(fast[:, :-1])
    assert torch.equal(logits[0, 4:].argmax(-1), fast[0, 5:])


def test_adapter_weights_hold_the_adapters_alone_a_shared_a_once(tiny_gpt2_dir) -> None:
    model = apply_lora(qkv.load(tiny_gpt2_dir).model, LoRASettings(2, 4, targets=("c_attn", "c_fc")))
    view = AdapterWeights(model)
    names = list(view.state_dict())
    assert all(name.endswith(("lora_A", "lora_B")) for name in names) and len(names) == 2 * 2 * 4
    assert {id(p) for p in view.parameters()} == {id(p) for p in model.parameters() if p.requires_grad}
