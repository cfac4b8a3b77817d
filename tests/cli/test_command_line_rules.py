"""The rules every verb's command line keeps (docs/errors.md, "The command line"), checked on the real parser:
a usage mistake is one line naming --help; every flag and positional has help; one name means one thing
(--out, --top/-k, --target, --seed, --device); old spellings still parse, hidden from --help."""

from __future__ import annotations

import argparse
import functools
import subprocess
import sys

import pytest

from qkv.cli import VERBS, build_parser, main, parse
from qkv.cli import verb_parsers as cli_verb_parsers
from qkv.cli.options import SEED_DEFAULT, minutes
from qkv.training.config import TrainConfig
from qkv.version import __version__


@functools.cache
def verb_parsers() -> dict[str, argparse.ArgumentParser]:
    return cli_verb_parsers()


def options(verb: str) -> dict[str, argparse.Action]:
    return {o: a for a in verb_parsers()[verb]._actions for o in a.option_strings}


def usage_error(capsys, argv: list[str]) -> str:
    """The stderr of a usage mistake, checked to be one line naming --help with exit code 2."""
    with pytest.raises(SystemExit) as stop:
        main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "--help" in lines[0] and "usage:" not in err and "Traceback" not in err
    return lines[0]


# (argv, a fragment of the one line) for every verb: an unknown flag, and a few other argparse refusals
USAGE_MISTAKES = [([verb, "--no-such-flag"], f"qkv {verb}: error: ") for verb in VERBS]  # or a missing --out
USAGE_MISTAKES += [
    ([], "qkv: error: the following arguments are required: COMMAND"),
    (["trian"], "invalid choice: 'trian'"),
    (["generate", "RUN", "--temperature", "hot"], "argument --temperature: invalid float value: 'hot'"),
    (["prepare", "corpus.txt"], "the following arguments are required: --out"),
    (["attention", "RUN", "text", "--part", "middle"], "argument --part: invalid choice: 'middle'"),
    (["train", "--max-time", "soon"], "'soon' is not a duration: give e.g. 30s, 10m or 2h"),
]


@pytest.mark.parametrize(
    ("argv", "fragment"), USAGE_MISTAKES, ids=[" ".join(a) or "(nothing)" for a, _ in USAGE_MISTAKES]
)
def test_a_usage_mistake_is_one_line_naming_help(capsys, argv, fragment) -> None:
    line = usage_error(capsys, argv)
    assert fragment in line
    assert line.endswith("--help`)")


def test_an_unknown_worked_example_names_the_ones_there_are(capsys) -> None:
    assert main(["explain", "--example", "005"]) == 2  # checked by the verb: old numbers are hidden aliases
    err = capsys.readouterr().err
    assert err == "qkv explain: error: unknown example '005': choose one of quick-fox, journey, journey-weights\n"


def test_the_installed_command_prints_one_line_too(tmp_path) -> None:
    import os

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    command = [sys.executable, "-c", "import sys; from qkv.cli import main; sys.exit(main())"]
    bad = subprocess.run([*command, "heads", "--top"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.splitlines() == [
        "qkv heads: error: argument --top/-k: expected one argument (see `qkv heads --help`)"
    ]
    version = subprocess.run([*command, "--version"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert (version.returncode, version.stdout.strip()) == (0, f"qkv {__version__}")


def test_every_option_and_positional_has_help() -> None:
    """A walk over the real parser of every verb: an action without help fails, except a hidden alias (help
    SUPPRESS) of a flag that has help under the same dest."""
    missing = []
    root = build_parser()
    for action in root._actions:
        if not action.help:
            missing.append(f"qkv {'/'.join(action.option_strings) or action.dest}")
    for verb, parser in verb_parsers().items():
        shown = {a.dest for a in parser._actions if a.help and a.help != argparse.SUPPRESS}
        for action in parser._actions:
            name = "/".join(action.option_strings) or action.dest
            if action.help == argparse.SUPPRESS:
                if action.dest not in shown:
                    missing.append(f"qkv {verb} {name} (hidden, and no visible flag of the same setting)")
            elif not action.help or not action.help.strip():
                missing.append(f"qkv {verb} {name}")
    assert missing == [], missing


# (argv in an old spelling, the setting, its value): scripts written before the renames keep working
ALIASES = [
    (["train", "--out-dir", "runs/x"], "out_dir", "runs/x"),
    (["train", "--out", "runs/x"], "out_dir", "runs/x"),
    (["train", "--max-tokens", "900", "--task", "translate"], "max_tokens", 900),
    (["train", "--batch-tokens", "900", "--task", "translate"], "max_tokens", 900),
    (["export", "RUN", "--onnx", "m.onnx"], "out", "m.onnx"),
    (["next", "RUN", "the", "--plot", "n.png"], "out", "n.png"),
    (["embeddings", "RUN", "--plot", "e.png"], "out", "e.png"),
    (["embeddings", "RUN", "--target"], "target", True),
    (["embeddings", "RUN", "-k", "3"], "top", 3),
    (["attribute", "RUN", "text", "--prefix", "Das"], "target", "Das"),
    (["patch", "RUN", "--clean", "a", "--corrupt", "b", "--prefix", "Das"], "target", "Das"),
    (["lens", "RUN", "text", "-k", "2"], "top", 2),
    (["heads", "RUN", "-k", "2"], "top", 2),
    (["attribute", "RUN", "text", "-k", "2"], "top", 2),
    (["patch", "RUN", "--clean", "a", "--corrupt", "b", "-k", "2"], "top", 2),
    (["next", "RUN", "the", "-k", "2"], "top", 2),
]


@pytest.mark.parametrize(("argv", "dest", "value"), ALIASES, ids=[" ".join(a) for a, _, _ in ALIASES])
def test_old_spellings_still_parse(argv, dest, value) -> None:
    assert getattr(parse(build_parser(), argv), dest) == value


@pytest.mark.parametrize(("verb", "old"), [("train", "--out-dir"), ("train", "--max-tokens"), ("export", "--onnx"),
                                           ("next", "--plot"), ("embeddings", "--plot"), ("attribute", "--prefix"),
                                           ("patch", "--prefix"), ("embeddings", "--target")])  # fmt: skip
def test_old_spellings_are_hidden_from_help(verb, old) -> None:
    assert options(verb)[old].help == argparse.SUPPRESS
    assert f"{old} " not in verb_parsers()[verb].format_usage()


WRITERS = ["train", "prepare", "quantize", "export", "plot", "attention", "lens", "attribute", "patch", "heads",
           "next", "embeddings"]  # fmt: skip


@pytest.mark.parametrize("verb", WRITERS)
def test_every_verb_that_writes_names_it_with_out(verb) -> None:
    assert "--out" in options(verb)


def test_max_tokens_means_one_thing() -> None:
    """--max-tokens is the cap on a request's max_tokens (new tokens), in serve only; train's token budget per
    batch is --batch-tokens, generate's length --max-new-tokens."""
    shown = [v for v in VERBS if "--max-tokens" in options(v) and options(v)["--max-tokens"].help != argparse.SUPPRESS]
    assert shown == ["serve"]
    assert "--batch-tokens" in options("train") and "--max-new-tokens" in options("generate")


@pytest.mark.parametrize("verb", [v for v in VERBS if "--top" in options(v)])
def test_top_has_k_as_its_alias(verb) -> None:
    top = options(verb)["--top"]
    assert top.option_strings == ["--top", "-k"] and top.type is int


@pytest.mark.parametrize("verb", [v for v in VERBS if "--target" in options(v)])
def test_target_is_a_translators_target_text_everywhere(verb) -> None:
    target = options(verb)["--target"]
    if target.help == argparse.SUPPRESS:  # embeddings' old spelling of --target-side
        assert verb == "embeddings" and options(verb)["--target-side"].dest == target.dest
        return
    assert target.metavar == "TEXT" and "translator" in target.help and "target" in target.help


def test_every_seed_has_the_same_default() -> None:
    seeds = {v: options(v)["--seed"] for v in VERBS if "--seed" in options(v)}
    assert set(seeds) >= {"train", "generate", "heads", "explain"}
    assert TrainConfig().seed == SEED_DEFAULT and f"default {SEED_DEFAULT}" in seeds["train"].help
    for verb, seed in seeds.items():
        if verb != "train":  # train's flags default to the saved or TOML settings first
            assert seed.default == SEED_DEFAULT or (verb == "explain" and seed.default is None), verb
            assert f"default {SEED_DEFAULT}" in seed.help, verb


@pytest.mark.parametrize("verb", ["quantize", "export"])
def test_device_on_the_writers(verb) -> None:
    device = options(verb)["--device"]
    assert device.default == "cpu"
    assert parse(build_parser(), [verb, "RUN", "--device", "cuda", "--out", "x"]).device == "cuda"


@pytest.mark.parametrize(("text", "value"), [("30s", 0.5), ("10m", 10.0), ("2h", 120.0), ("1.5", 1.5), ("90 s", 1.5)])
def test_durations_take_units(text, value) -> None:
    assert minutes(text) == pytest.approx(value)
    assert parse(build_parser(), ["train", "--max-time", text]).max_time == pytest.approx(value)


def test_html_is_the_same_flag_in_lens_and_attention() -> None:
    lens, attention = options("lens")["--html"], options("attention")["--html"]
    assert (lens.nargs, lens.const, lens.metavar) == (attention.nargs, attention.const, attention.metavar) == (
        "?", "", "FILE")  # fmt: skip
    assert parse(build_parser(), ["lens", "RUN", "text", "--html"]).html == ""


LIGHT = """
import contextlib, io, sys
import qkv.cli
qkv.cli.build_parser().format_help()
for argv in (["--version"], ["--help"]):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
        qkv.cli.main(argv)
print(sorted({name.split(".")[0] for name in sys.modules} & {"torch", "numpy", "safetensors", "tokenizers"}))
"""


def test_the_parser_help_and_version_import_no_torch(tmp_path) -> None:
    """`qkv --help` and `qkv --version` answer without importing torch (seconds on a busy machine): the package
    imports its names on first use, and each verb's flags are added when the verb is used (qkv.cli.VerbParser)."""
    import os

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    found = subprocess.run([sys.executable, "-c", LIGHT], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert (found.returncode, found.stdout.strip()) == (0, "[]"), found.stderr


def test_names_of_the_package_still_import() -> None:
    import qkv
    from qkv import GPT, GPTConfig, capture
    from qkv.models import GPT as models_gpt

    assert GPT is models_gpt and qkv.GPTConfig is GPTConfig and callable(capture)
    assert qkv.models.GPT is GPT and set(qkv.__all__) <= set(dir(qkv))
    with pytest.raises(AttributeError):
        qkv.no_such_name  # noqa: B018
