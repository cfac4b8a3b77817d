"""The Hugging Face folders each family's conversion tests read (built once per session, tests/pretrained)."""

from tests.pretrained.conftest import gpt2_dir, gpt2_hf, marian_dir, minilm_dir  # noqa: F401
