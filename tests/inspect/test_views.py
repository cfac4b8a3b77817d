"""qkv.views: a loaded model with every view as a method, each the same numbers as the function it wraps."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import torch

import qkv
from qkv.decoding import generate
from qkv.inspect import attention_maps, logit_lens, next_token
from qkv.inspect.views import ModelViews
from qkv.model_dir import ModelBundle


def test_views_open_a_run_folder_and_are_a_bundle(gpt_run, gpt) -> None:
    m = qkv.views(gpt_run)
    assert isinstance(m, ModelViews) and isinstance(m, ModelBundle) and m.path == gpt_run
    assert qkv.views(m) is m and isinstance(qkv.views(gpt), ModelViews)
    assert "parameters" in repr(m) and len(repr(m)) < 200  # not the whole module tree


def test_each_method_is_the_function_it_wraps(gpt) -> None:
    m = qkv.views(gpt)
    assert np.array_equal(m.attention("the fox").groups["decoder"].weights,
                          attention_maps(gpt, "the fox").groups["decoder"].weights)  # fmt: skip
    assert np.array_equal(m.next_token("the", temperatures=(1.0,)).probabilities,
                          next_token(gpt, "the", temperatures=(1.0,)).probabilities)  # fmt: skip
    assert np.array_equal(m.lens("the fox").final_probs, logit_lens(gpt, "the fox").final_probs)
    assert [t for _, t in m.tokens("the")] == ["t", "h", "e"]
    assert m.explain("the fox", layer=1, head=0).layer == 1
    assert m.walkthrough("the").vocab_labels is not None  # the page can redo the sampling
    assert m.neighbours("e", k=2).answers and m.heads(length=4, batch=1).parts


def test_generate_is_greedy_generation_as_text(gpt) -> None:
    m = qkv.views(gpt)
    ids = generate(gpt.model, gpt.tokenizer.encode("the"), max_new_tokens=8, temperature=0.0)
    assert m.generate("the", max_new_tokens=8, temperature=0.0) == gpt.tokenizer.decode(ids[0, 3:].tolist())
    sampled = m.generate("the", max_new_tokens=5, temperature=1.0, generator=torch.Generator().manual_seed(0))
    assert len(sampled) == 5


def test_a_translator_translates(translator) -> None:
    m = qkv.views(translator)
    out = m.translate("3 may", beam=1)
    assert isinstance(out, str) and m.translate(["3 may", "4 june"], beam=1)[0] == out
    assert "cross" in m.attention("3 may").groups


def test_import_qkv_does_not_import_the_views() -> None:
    code = "import sys, qkv; print('qkv.inspect' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False"]


def test_the_python_api_refuses_what_the_command_line_refuses(gpt_run, gpt, translator) -> None:
    """The same one-line QkvError as the verbs: a device that is not one, an option the family has not (a GPT's
    --target was ignored), a view the family has not (a translator's generate was an AttributeError), empty text."""
    import pytest

    from qkv.errors import QkvError

    with pytest.raises(QkvError, match="device 'banana' is not a device: use auto, cpu, cuda or mps"):
        qkv.views(gpt_run, device="banana")
    if not torch.cuda.is_available():
        with pytest.raises(QkvError, match="device cuda was asked for but no CUDA GPU is available"):
            qkv.load(gpt_run, device="cuda")
    m, t = qkv.views(gpt), qkv.views(translator)
    for view in (m.attention, m.lens):
        with pytest.raises(QkvError, match="--target is for translators: .* reads one text"):
            view("the fox", target="x")
    with pytest.raises(QkvError, match="needs a language model"):
        t.generate("3 may")
    for empty in ("", " ", [], ["", "  "]):
        with pytest.raises(QkvError, match="there is nothing to translate"):
            t.translate(empty)
    with pytest.warns(UserWarning, match="1 of the 2 sentences are empty: their translations are empty"):
        assert t.translate(["", "3 may"], beam=1) == ["", t.translate("3 may", beam=1)]
