"""Every `qkv ...` command line in README.md and docs/*.md parses with the real parser, and names its flags as
`--help` shows them (not an old spelling kept as a hidden alias), so a renamed flag fails this test before a
reader meets it.

What is read: in fenced code blocks, lines that start with ``qkv `` or ``$ qkv `` (a trailing backslash joins
the next line; ``# ...`` comments are dropped; ``torchrun ... -m qkv VERB`` counts too); in the text, inline
code spans that start with ``qkv ``. A code-block line is parsed whole (`parse`, as `qkv` itself does); an
inline span is often a fragment (`qkv lens --html`), so only its verb and flags are checked.

Skipped, as placeholders: a command with ``...`` in it (an elided argument, e.g. ``--clean ... --corrupt ...``)
or ``COMMAND`` in the verb's place. Not commands: the tool's own output (``qkv lens: error: ...``). Commands
joined by ``&&`` are checked one by one; ``--top-k/--top-p`` in the text names two flags.
"""

from __future__ import annotations

import argparse
import functools
import re
import shlex
from pathlib import Path

import pytest

from qkv.cli import VERBS, build_parser, parse, verb_parsers

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _commands(path: Path) -> list[tuple[int, str, bool]]:
    """(line number, command text, whole line?) for every qkv command in a Markdown file."""
    found, fenced, pending = [], False, None
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced, pending = not fenced, None
            continue
        if fenced:
            text = line.strip().removeprefix("$ ")
            if pending is not None:
                pending = (pending[0], pending[1] + " " + text.rstrip("\\"))
            elif re.match(r"(qkv|torchrun .*-m qkv) [a-z-]", text):
                pending = (number, re.sub(r"^torchrun .*?-m qkv ", "qkv ", text).rstrip("\\"))
            if pending is not None and not text.endswith("\\"):
                found.append((*pending, True))
                pending = None
        else:
            found += [(number, span, False) for span in re.findall(r"`(qkv [^`]+)`", line)]
    return found


def _split(text: str) -> list[str]:
    """The commands of a line joined by ``&&``, each from its ``qkv``; none when the line is qkv's own output."""
    parts = [part.strip() for part in text.split("&&")]
    return [part for part in parts if re.match(r"qkv [a-z-]", part) and not re.match(r"qkv [A-Za-z-]*:", part)]


COMMANDS = [(f"{p.name}:{n}", c, whole) for p in DOCS for n, text, whole in _commands(p) for c in _split(text)]


def _placeholder(words: list[str]) -> bool:
    return any("..." in w for w in words) or words[1:2] == ["COMMAND"]


@functools.cache
def _verbs() -> dict[str, argparse.ArgumentParser]:
    return verb_parsers()


def _flag_problems(words: list[str]) -> list[str]:
    if words[1].startswith("-"):  # qkv --help, qkv --version
        return [] if words[1] in ("--help", "-h", "--version") else [f"qkv has no {words[1]}"]
    if words[1] not in VERBS:
        return [f"no verb {words[1]!r}"]
    actions = {o: a for a in _verbs()[words[1]]._actions for o in a.option_strings}
    problems = []
    flags = [f for word in words[2:] if re.match(r"^--?[a-zA-Z]", word) for f in word.split("=")[0].split("/")]
    for flag in flags:
        if flag not in actions:
            problems.append(f"qkv {words[1]} has no {flag}")
        elif actions[flag].help == argparse.SUPPRESS:
            shown = [a for a in actions.values() if a.dest == actions[flag].dest and a.help != argparse.SUPPRESS]
            problems.append(f"{flag} is an old spelling: write {shown[0].option_strings[0]}")
    return problems


def test_the_docs_have_commands_to_check() -> None:
    assert len(COMMANDS) > 150 and sum(whole for _, _, whole in COMMANDS) > 80


@pytest.mark.parametrize(("where", "command", "whole"), COMMANDS, ids=[w for w, _, _ in COMMANDS])
def test_every_documented_command_parses(where, command, whole, capsys) -> None:
    words = shlex.split(command, comments=True)
    if _placeholder(words):
        pytest.skip("a placeholder")
    problems = _flag_problems(words)
    assert not problems, f"{where}: {command}: {problems}"
    if whole and words[1] not in ("--help", "-h", "--version") and "--help" not in words:
        try:
            parse(build_parser(), words[1:])
        except SystemExit:
            pytest.fail(f"{where}: {command}: {capsys.readouterr().err.strip()}")
