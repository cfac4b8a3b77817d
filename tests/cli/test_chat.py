"""qkv chat driven through stdin, as a script drives it: one answer per line, the same text qkv.chat gives for the
same conversation, /reset forgets it, and bad input is one line."""

from __future__ import annotations

import io

import qkv
from qkv.cli import main

SETTINGS = dict(temperature=0, max_new_tokens=12)


def chat_cli(monkeypatch, capsys, folder, lines: str, *flags: str) -> tuple[int, list[str], str]:
    monkeypatch.setattr("sys.stdin", io.StringIO(lines))
    code = main(["chat", str(folder), "--temperature", "0", "--max-new-tokens", "12", *flags])
    out, err = capsys.readouterr()
    return code, out.splitlines(), err


def test_piped_lines_are_user_turns_and_the_answers_are_qkv_chats(monkeypatch, capsys, smol_hf_dir) -> None:
    code, answers, err = chat_cli(monkeypatch, capsys, smol_hf_dir, "Hi there\n\nWhat is two plus two?\n",
                                  "--system", "Be brief.")  # fmt: skip
    assert code == 0, err
    bundle = qkv.load(smol_hf_dir)
    history = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    first = qkv.chat(bundle, history, **SETTINGS).text
    history += [{"role": "assistant", "content": first}, {"role": "user", "content": "What is two plus two?"}]
    second = qkv.chat(bundle, history, **SETTINGS).text
    assert "\n".join(answers) == first + "\n" + second  # each answer, then a newline


def test_prompt_lookup_gives_the_same_answers(monkeypatch, capsys, smol_hf_dir, checked_drafts) -> None:
    lines = "Say: red green blue red green blue\nAgain!\n"
    plain = chat_cli(monkeypatch, capsys, smol_hf_dir, lines)
    assert not checked_drafts
    drafted = chat_cli(monkeypatch, capsys, smol_hf_dir, lines, "--prompt-lookup", "4")
    assert checked_drafts  # drafts were checked
    assert plain[0] == drafted[0] == 0 and drafted[1] == plain[1] and len(plain[1]) == 2
    code, _, err = chat_cli(monkeypatch, capsys, smol_hf_dir, lines, "--prompt-lookup", "4", "--temperature", "0.7")
    assert code == 2 and err.count("\n") == 1 and "--temperature 0.7 changes" in err


def test_reset_forgets_the_conversation(monkeypatch, capsys, smol_hf_dir) -> None:
    code, answers, _ = chat_cli(monkeypatch, capsys, smol_hf_dir, "Hello\n/reset\nHello\n")
    assert code == 0
    text = "\n".join(answers)
    bundle = qkv.load(smol_hf_dir)
    alone = qkv.chat(bundle, [{"role": "user", "content": "Hello"}], **SETTINGS).text
    assert text == alone + "\n" + alone  # the second Hello starts afresh


def test_bad_input_is_one_line(monkeypatch, capsys, smol_hf_dir, tmp_path) -> None:
    code, _, err = chat_cli(monkeypatch, capsys, smol_hf_dir, "Hi\n", "--min-p", "2")
    assert code == 2 and err.count("\n") == 1 and "min_p=2.0 must be in [0, 1]" in err
    template = tmp_path / "chat.jinja"
    template.write_text("")
    code, _, err = chat_cli(monkeypatch, capsys, smol_hf_dir, "Hi\n", "--chat-template", str(template))
    assert code == 2 and err.count("\n") == 1 and "chat.jinja" in err
