"""Fine-tuning examples: the ids of a whole conversation and a mask that is True exactly on the assistant turns'
content and end-of-turn token, checked token by token, against transformers' return_assistant_tokens_mask, and
on several template styles."""

from __future__ import annotations

import pytest

from qkv.chat_templates import chat_prompt, chat_training_example
from qkv.errors import QkvError
from qkv.model_dir import ModelBundle
from qkv.tokenizers import CharTokenizer
from tests.chat_templates.templates import CHATML_GENERATION, LLAMA3_GENERATION, LLAMA3_PLAIN
from tests.chat_templates.test_template import SYSTEM

ANSWERS = ["Attention mixes values.", " Softmax of q·k / √d. ", "Yes\n\nbecause <that> is it."]
THREE = [  # three user/assistant turns
    {"role": "user", "content": "What does attention do?"},
    {"role": "assistant", "content": ANSWERS[0]},
    {"role": "user", "content": "And the weights?"},
    {"role": "assistant", "content": ANSWERS[1]},
    {"role": "user", "content": "Is that all?"},
    {"role": "assistant", "content": ANSWERS[2]},
]


def masked_runs(tokenizer, ids: list[int], mask: list[bool]) -> list[str]:
    """The text of each maximal run of masked tokens."""
    runs, current = [], []
    for i, m in zip(ids, mask, strict=True):
        if m:
            current.append(i)
        elif current:
            runs.append(current)
            current = []
    runs += [current] if current else []
    return [tokenizer.decode(run, skip_special=False) for run in runs]


def transformers_mask(hf, messages, template) -> tuple[list[int], list[bool]]:
    out = hf.apply_chat_template(
        messages, chat_template=template, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    return out["input_ids"], [bool(m) for m in out["assistant_masks"]]


def chatml_mask(tokens: list[str]) -> list[bool]:
    """The mask read token by token, knowing ChatML (the implementation does not): after <|im_start|>, "assistant"
    and the newline of its header, up to and including <|im_end|>."""
    mask, inside, header = [], False, []
    for token in tokens:
        if token == "<|im_start|>":
            header = [token]
        elif header:
            header.append(token)
            if token.endswith("\n"):
                inside, header = "".join(header) == "<|im_start|>assistant\n", []
                mask.append(False)
                continue
        mask.append(inside and not header)
        inside = inside and token != "<|im_end|>"
    return mask


def test_smollm2_mask_token_by_token(smol_bundle) -> None:
    messages = [SYSTEM, *THREE]
    ids, mask = chat_training_example(smol_bundle, messages)
    tokens = [smol_bundle.tokenizer.decode([i], skip_special=False) for i in ids]
    assert mask == chatml_mask(tokens)
    assert masked_runs(smol_bundle.tokenizer, ids, mask) == [a + "<|im_end|>" for a in ANSWERS]
    assert ids == chat_prompt(smol_bundle, messages, add_generation_prompt=False).ids


@pytest.mark.parametrize("system", [True, False])
def test_smollm2_mask_is_transformers_assistant_mask(smol_bundle, smol_hf, system) -> None:
    """SmolLM2's own template has no {% generation %} blocks: the turns are found by rendering cut conversations,
    and agree with transformers' mask over the same text written with blocks."""
    messages = [SYSTEM, *THREE] if system else THREE
    ids, mask = chat_training_example(smol_bundle, messages)
    want_ids, want_mask = transformers_mask(smol_hf, [SYSTEM, *THREE], CHATML_GENERATION)
    if system:  # without one, SmolLM2 writes its default system prompt, which the block template does not
        assert (ids, mask) == (want_ids, want_mask)
    assert masked_runs(smol_bundle.tokenizer, ids, mask) == [a + "<|im_end|>" for a in ANSWERS]


def test_llama3_mask_is_transformers_assistant_mask(styled) -> None:
    hf, bundle = styled("llama3")
    ids, mask = chat_training_example(bundle, [SYSTEM, *THREE], template=LLAMA3_PLAIN)
    assert (ids, mask) == transformers_mask(hf, [SYSTEM, *THREE], LLAMA3_GENERATION)
    assert masked_runs(bundle.tokenizer, ids, mask) == [a.strip() + "<|eot_id|>" for a in ANSWERS]
    assert sum(mask) < len(mask) / 2  # the headers, system and user turns are left out


@pytest.mark.parametrize("template", [CHATML_GENERATION, LLAMA3_GENERATION])
def test_generation_blocks_give_transformers_mask(styled, template) -> None:
    hf, bundle = styled("llama3")
    assert chat_training_example(bundle, THREE, template=template) == transformers_mask(hf, THREE, template)


@pytest.mark.parametrize(
    ("style", "strip", "end"),
    [("gemma", True, "<end_of_turn>"), ("mistral", False, "</s>"), ("qwen2", False, "<|im_end|>")],
)
def test_other_styles_mask_content_and_end_of_turn(styled, style, strip, end) -> None:
    hf, bundle = styled(style)
    ids, mask = chat_training_example(bundle, THREE)
    assert ids == hf.apply_chat_template(THREE, tokenize=True, return_dict=False)
    assert masked_runs(bundle.tokenizer, ids, mask) == [(a.strip() if strip else a) + end for a in ANSWERS]


def test_any_tokenizer_with_offsets_works(tmp_path) -> None:
    """A qkv char tokenizer and a plain-text template ending turns with <eos>: the same rule, nothing ChatML."""
    tokenizer = CharTokenizer.train("".join(str(m["content"]) for m in THREE) + "userassistant: \n")
    template = (
        "{% for m in messages %}{{ m.role }}: {{ m.content }}{{ eos_token }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    bundle = ModelBundle(None, None, tokenizer, None, tmp_path, chat_template=template)  # type: ignore[arg-type]
    ids, mask = chat_training_example(bundle, THREE)
    assert masked_runs(tokenizer, ids, mask) == [f"{a}<eos>" for a in ANSWERS]
    assert tokenizer.decode(ids, skip_special=False).count("<eos>") == ids.count(tokenizer.eos_id) == 6


def test_a_conversation_without_an_assistant_is_refused(smol_bundle) -> None:
    with pytest.raises(QkvError, match="has no assistant message, so there is nothing to learn from it"):
        chat_training_example(smol_bundle, THREE[:1])


def test_a_template_that_rewrites_earlier_turns_is_refused(smol_bundle) -> None:
    hides = "{% for m in messages %}{% if m.role == 'assistant' and not loop.last %}[...]{% else %}{{ m.content }}" \
            "{% endif %}<|im_end|>{% endfor %}"  # fmt: skip
    with pytest.raises(QkvError, match=r"writes messages\[1\] differently once later messages follow"):
        chat_training_example(smol_bundle, THREE, template=hides)
