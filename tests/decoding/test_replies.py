"""Text in, text out (qkv.decoding.replies): qkv.complete and qkv.chat give the text of generate()'s tokens, stop
at the template's end of turn and at stop strings, and refuse what they cannot do in one line."""

from __future__ import annotations

import pytest
import torch

import qkv
from qkv.chat_templates import chat_prompt
from qkv.decoding import generate
from qkv.errors import QkvError
from qkv.model_dir import ModelBundle
from qkv.tokenizers import CharTokenizer
from tests.conftest import tiny_gpt

QUESTION = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def char_bundle(tmp_path_factory) -> ModelBundle:
    tokenizer = CharTokenizer.train("the quick brown fox jumps over the lazy dog. " * 3)
    model = tiny_gpt(vocab_size=tokenizer.vocab_size, context_length=48, dtype=torch.float32).eval()
    return ModelBundle(model, model.config, tokenizer, None, tmp_path_factory.mktemp("char"))


def test_complete_is_the_text_of_generates_greedy_tokens(char_bundle) -> None:
    tokenizer, model = char_bundle.tokenizer, char_bundle.model
    prompt = "the quick"
    ids = tokenizer.encode(prompt)
    expected = generate(model, ids, max_new_tokens=30, temperature=0, eos_id=tokenizer.eos_id)[0, len(ids) :].tolist()
    reply = qkv.complete(char_bundle, prompt, max_new_tokens=30, temperature=0)
    assert reply.token_ids == expected
    assert reply.text == tokenizer.decode(expected)
    assert reply.finish_reason == ("stop" if expected[-1] == tokenizer.eos_id else "length")
    assert reply.prompt_tokens == len(ids) and reply.cropped == 0
    assert "".join(qkv.complete_stream(char_bundle, prompt, max_new_tokens=30, temperature=0)) == reply.text


def test_a_stop_string_ends_the_text_before_it(char_bundle) -> None:
    full = qkv.complete(char_bundle, "the", max_new_tokens=30, temperature=0, ignore_eos=True).text
    stop = full[5:7]
    cut = qkv.complete(char_bundle, "the", max_new_tokens=30, temperature=0, ignore_eos=True, stop=[stop])
    assert cut.text == full[: full.index(stop)] and cut.finish_reason == "stop"


def test_chat_answers_with_generates_tokens_up_to_the_end_of_turn(smol_bundle) -> None:
    prompt = chat_prompt(smol_bundle, QUESTION)
    out = generate(smol_bundle.model, prompt.ids, max_new_tokens=24, temperature=0, eos_id=prompt.stop_ids)
    new = out[0, len(prompt.ids) :].tolist()
    reply = qkv.chat(smol_bundle, QUESTION, max_new_tokens=24, temperature=0)
    assert reply.token_ids == new
    ended = new[-1] in prompt.stop_ids
    assert reply.finish_reason == ("stop" if ended else "length")
    assert reply.text == smol_bundle.tokenizer.decode(new[:-1] if ended else new)
    assert "".join(qkv.chat_stream(smol_bundle, QUESTION, max_new_tokens=24, temperature=0)) == reply.text


def test_a_seeded_chat_is_repeatable_and_sampling_settings_are_checked(smol_bundle) -> None:
    settings = dict(max_new_tokens=12, temperature=1.0, top_p=0.9, min_p=0.05, repetition_penalty=1.2, seed=7)
    assert (
        qkv.chat(smol_bundle, QUESTION, **settings).token_ids == qkv.chat(smol_bundle, QUESTION, **settings).token_ids
    )
    with pytest.raises(QkvError, match="min_p"):
        qkv.chat(smol_bundle, QUESTION, min_p=2)
    with pytest.raises(QkvError, match="the conversation is empty"):
        qkv.chat(smol_bundle, [])


def test_chat_and_complete_need_a_language_model(tmp_path) -> None:
    from qkv.models import Transformer, TransformerConfig

    tokenizer = CharTokenizer.train("abc")
    config = TransformerConfig(src_vocab_size=tokenizer.vocab_size, tgt_vocab_size=tokenizer.vocab_size, d_model=16,
                               n_heads=2, n_encoder_layers=1, n_decoder_layers=1)  # fmt: skip
    translator = ModelBundle(Transformer(config), config, tokenizer, tokenizer, tmp_path)
    with pytest.raises(QkvError, match="needs a language model"):
        qkv.complete(translator, "abc")
    with pytest.raises(QkvError, match="needs a language model"):
        qkv.chat(translator, QUESTION)


def test_a_model_without_a_chat_template_is_one_line(char_bundle) -> None:
    with pytest.raises(QkvError, match="chat template"):
        qkv.chat(char_bundle, QUESTION)


def test_a_temperature_that_rounds_to_zero_in_float32_is_greedy(char_bundle) -> None:
    """T = 1e-300 is 0 in float32 (logits / T overflowed and sampling crashed): greedy, as T < 1e-5 is everywhere."""
    greedy = qkv.complete(char_bundle, "the qu", max_new_tokens=8, temperature=0)
    for temperature in (1e-300, 5e-324, 9e-6):
        assert qkv.complete(char_bundle, "the qu", max_new_tokens=8, temperature=temperature).text == greedy.text
        ids = generate(char_bundle.model, char_bundle.tokenizer.encode("the qu"), max_new_tokens=8,
                       temperature=temperature)  # fmt: skip
        assert ids[0, 6:].tolist() == greedy.token_ids
