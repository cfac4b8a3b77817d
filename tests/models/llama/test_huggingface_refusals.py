"""What qkv's Llama family cannot run is refused from config.json with one line naming the field and what qkv
supports, before any weight is read; through the real command line: exit code 2 and no traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import qkv
from qkv.errors import QkvError
from qkv.pretrained import load_pretrained
from tests.cli.test_bad_input import assert_one_line_error
from tests.pretrained.conftest import llama_config

transformers = pytest.importorskip("transformers")

READS = (
    "GPT2LMHeadModel, LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM, BertModel, BertForMaskedLM, MarianMTModel"
)

REFUSALS = {
    "unsupported model_type": (
        "llama", {"model_type": "gemma", "architectures": ["GemmaForCausalLM"]},
        f"holds a 'gemma' (GemmaForCausalLM) model (config.json's model_type), which qkv cannot import: "
        f"qkv reads {READS}",
    ),
    "yarn rope scaling (transformers 5)": (
        "qwen2", {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6}},
        'sets rope_parameters={"rope_type": "yarn"',
    ),
    "linear rope scaling (transformers 4)": (
        "llama", {"rope_scaling": {"type": "linear", "factor": 2.0}}, 'sets rope_scaling={"type": "linear"',
    ),
    "heads not divisible": (
        "llama", {"num_key_value_heads": 3},
        "config.json's num_attention_heads=4 is not divisible by num_key_value_heads=3",
    ),
    "head_dim": ("mistral", {"head_dim": 32}, "sets head_dim=32 in config.json, which qkv cannot run"),
    "activation": ("llama", {"hidden_act": "gelu"}, 'sets hidden_act="gelu" in config.json'),
    "mlp_bias": ("llama", {"mlp_bias": True}, "sets mlp_bias=true"),
    "attention_bias on W_o": ("llama", {"attention_bias": True}, "sets attention_bias=true"),
    # A window over every layer runs (test_sliding_window.py); over some layers only, it is refused.
    "qwen2 sliding window on some layers": (
        "qwen2", {"use_sliding_window": True, "sliding_window": 32, "max_window_layers": 1, "layer_types": None},
        "sets sliding_window=32",
    ),
}  # fmt: skip


def _config_only(folder: Path, model_type: str, edits: dict[str, object]) -> Path:
    """A folder with only config.json: the refusal must come before the (missing) weights are looked for."""
    folder.mkdir(parents=True, exist_ok=True)
    config = llama_config(model_type, 100).to_dict()
    config.update(edits)
    config = {k: v for k, v in config.items() if v is not None or k == "sliding_window"}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("name", list(REFUSALS))
def test_refused_in_one_line(name: str, tmp_path: Path) -> None:
    model_type, edits, fragment = REFUSALS[name]
    folder = _config_only(tmp_path, model_type, edits)
    with pytest.raises(QkvError) as error:
        load_pretrained(folder)
    message = str(error.value)
    assert fragment in message and "\n" not in message
    assert str(folder) in message  # the file it comes from


def test_window_as_long_as_the_context_is_accepted(tmp_path: Path) -> None:
    from qkv.models.llama.huggingface import config_from_hf

    config = llama_config("mistral", 100, sliding_window=128).to_dict()
    assert config_from_hf(config).context_length == 128


CLI_CASES = ["unsupported model_type", "yarn rope scaling (transformers 5)", "heads not divisible"]


@pytest.mark.parametrize("name", CLI_CASES)
def test_command_line_exit_code_2_without_traceback(name: str, tmp_path: Path) -> None:
    model_type, edits, fragment = REFUSALS[name]
    folder = _config_only(tmp_path / "model", model_type, edits)
    src = str(Path(qkv.__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]), OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, "-m", "qkv", "generate", "--model", str(folder), "--prompt", "x"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert_one_line_error(done.returncode, done.stderr, fragment)
