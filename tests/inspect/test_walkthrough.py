"""The walk-through's numbers are Hugging Face GPT-2's own: embeddings, attention, residual norms and logits."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from qkv.errors import QkvError
from qkv.inspect.lens import logit_lens
from qkv.inspect.walkthrough import walkthrough
from qkv.inspect.walkthrough_html import walkthrough_html, write_walkthrough_html
from qkv.loading import load
from qkv.model_dir import save_model_dir
from qkv.models import GPT, GPTConfig
from tests.pretrained.conftest import gpt2_dir  # noqa: F401  (session fixtures)

TEXT = "The quick brown fox jumps"


def test_every_step_matches_hugging_face_gpt2(gpt2_dir) -> None:  # noqa: F811
    transformers = pytest.importorskip("transformers")
    bundle = load(str(gpt2_dir))
    walk = walkthrough(bundle, TEXT, top=3)
    ids = bundle.tokenizer.encode(TEXT)
    T = len(ids)
    # The eager attention path is the one that hands back its weights (output_attentions).
    gpt2_hf = transformers.GPT2LMHeadModel.from_pretrained(gpt2_dir, attn_implementation="eager").eval()
    hf = gpt2_hf.transformer
    last_block: list[torch.Tensor] = []
    hook = hf.h[-1].register_forward_hook(
        lambda module, args, out: last_block.append(out if torch.is_tensor(out) else out[0])
    )
    try:
        with torch.no_grad():
            out = gpt2_hf(torch.tensor([ids]), output_attentions=True, output_hidden_states=True)
    finally:
        hook.remove()
    assert walk.ids == ids and len(walk.tokens) == T and walk.positional == "learned"
    np.testing.assert_allclose(walk.token_vectors, hf.wte.weight[ids].detach().double().numpy(), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(walk.position_vectors, hf.wpe.weight[:T].detach().double().numpy(), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(walk.embedding, out.hidden_states[0][0].double().numpy(), rtol=1e-5, atol=1e-6)
    assert walk.attention.shape == (2, 4, T, T)
    for layer in range(2):
        np.testing.assert_allclose(walk.attention[layer], out.attentions[layer][0].double().numpy(), atol=1e-5)
    # HF's last hidden state has ln_f applied: the stream after the last block is the block's own output.
    streams = [out.hidden_states[0], out.hidden_states[1], last_block[0]]
    expected = np.stack([s[0].double().norm(dim=-1).numpy() for s in streams])  # (L + 1, T)
    np.testing.assert_allclose(walk.residual_norms, expected, rtol=1e-5)
    np.testing.assert_allclose(walk.logits, out.logits[0, -1].double().numpy(), rtol=1e-4, atol=1e-4)
    lens = logit_lens(bundle, TEXT, top=3)  # the same lens as `qkv lens`
    np.testing.assert_allclose(walk.lens.top_probs, lens.top_probs, rtol=1e-6)
    assert walk.lens.top_tokens == lens.top_tokens
    assert walk.lens.top_ids[-1, -1, 0] == int(out.logits[0, -1].argmax())


def test_the_json_has_one_entry_per_block_and_position(gpt2_dir) -> None:  # noqa: F811
    bundle = load(str(gpt2_dir))
    walk = walkthrough(bundle, TEXT, top=2, vocab=True)
    data = json.loads(json.dumps(walk.to_dict(logits=True)))
    T = len(walk.tokens)
    assert [b["layer"] for b in data["blocks"]] == [0, 1]  # numbered from 0
    assert np.array(data["blocks"][1]["attention"]).shape == (4, T, T)
    assert len(data["blocks"][0]["lens"]) == T and len(data["blocks"][0]["lens"][0]) == 2
    assert np.array(data["embedding"]["sum"]).shape == (T, 64)
    np.testing.assert_allclose(data["embedding"]["norms"], walk.residual_norms[0], atol=1e-4)
    assert len(data["logits"]) == len(data["vocab"]) == bundle.tokenizer.vocab_size
    assert "logits" not in walk.to_dict()


def test_rope_models_have_no_position_vector(tmp_path, char_tokenizer) -> None:
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=char_tokenizer.vocab_size, d_model=16, n_heads=2, n_layers=1, context_length=16,
                       positional="rope")  # fmt: skip
    bundle = load(str(save_model_dir(tmp_path / "rope", GPT(config), char_tokenizer)))
    walk = walkthrough(bundle, "the fox")
    assert walk.position_vectors is None and walk.positional == "rope"
    np.testing.assert_allclose(walk.embedding, walk.token_vectors)
    assert walk.to_dict()["embedding"]["position"] is None


def test_translators_and_encoders_are_told_it_is_for_language_models(translator, tmp_path, char_tokenizer) -> None:
    with pytest.raises(QkvError, match="the walk-through needs a language model, and this is an encoder-decoder trans"):
        walkthrough(translator, "the fox")
    from qkv.models import Encoder, EncoderConfig

    encoder = Encoder(EncoderConfig(vocab_size=char_tokenizer.vocab_size, d_model=16, n_heads=2, n_layers=1))
    bundle = load(str(save_model_dir(tmp_path / "enc", encoder, char_tokenizer)))
    with pytest.raises(QkvError, match="needs a language model, and this is an encoder .*`qkv embed`"):
        walkthrough(bundle, "the fox")


def test_bad_text_and_top(gpt) -> None:
    with pytest.raises(QkvError, match="the text is empty"):
        walkthrough(gpt, "")
    with pytest.raises(QkvError, match="--top 0 must be at least 1"):
        walkthrough(gpt, "the fox", top=0)
    with pytest.raises(QkvError, match="at most 32: shorten it"):
        walkthrough(gpt, "the fox " * 10)


def test_the_standalone_page_inlines_data_script_and_styles(gpt, tmp_path) -> None:
    walk = walkthrough(gpt, "the fox", vocab=True)
    walk.tokens[0] = "</script><b>"  # a token that would end the data block if written raw
    page = walkthrough_html(walk, title="t")
    assert page.count("</script>") == 3  # the data, walkthrough.js and the boot script; nothing else closes early
    assert "QkvWalkthrough" in page and ".wt-step" in page and "http" not in page.split("<body>")[1]
    data = page.split('id="walkthrough-data">')[1].split("</script>")[0]
    assert json.loads(data)["tokens"][0] == "</script><b>"
    path = write_walkthrough_html(walk, tmp_path / "w.html")
    assert path.read_text(encoding="utf-8") == page.replace("<title>t</title>", "<title>Walk-through</title>").replace(
        "<h1>t</h1>", "<h1>Walk-through</h1>"
    )
    with pytest.raises(ValueError, match="vocab=True"):
        walkthrough_html(walkthrough(gpt, "the fox"))
