"""`qkv lens ... --html FILE`: the playground's walk-through as one standalone page, and one line for input that
cannot work."""

from __future__ import annotations

import json

import pytest

from qkv.cli import main
from tests.cli.test_interpretability_commands import fails, runs  # noqa: F401  (module fixture)


def test_lens_html_writes_the_walkthrough_page(capsys, runs, tmp_path) -> None:  # noqa: F811
    page = tmp_path / "walk.html"
    assert main(["lens", runs["gpt"], "the fox", "--no-plot", "--top", "2", "--html", str(page), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["html"] == str(page)
    text = page.read_text(encoding="utf-8")
    inlined = json.loads(text.split('id="walkthrough-data">')[1].split("</script>")[0])
    assert inlined["tokens"] == data["tokens"] and len(inlined["blocks"]) == 2
    assert [[t["token"] for t in at] for at in inlined["blocks"][1]["lens"]] == [
        [t["token"] for t in at] for at in data["top"][2]
    ]  # the page's lens is `qkv lens`'s (row 2 = after block 1)
    assert "QkvWalkthrough.render" in text and "<script src" not in text and "<link" not in text  # offline
    assert main(["lens", runs["gpt"], "the fox", "--no-plot", "--html", str(tmp_path / "b.html")]) == 0
    assert "wrote " in capsys.readouterr().out and (tmp_path / "b.html").is_file()


@pytest.mark.parametrize(
    "argv,message",
    [
        (["lens", "TRANSLATOR", "the fox", "--html", "w.html"], "the walk-through needs a language model"),
        (["lens", "GPT", "the fox", "--html", "w.html", "--top", "0"], "--top 0 must be at least 1"),
        (["lens", "GPT", "the fox " * 9, "--html", "w.html"], "the model's context takes at most 32"),
    ],
)
def test_lens_html_bad_input_is_one_line(capsys, runs, tmp_path, monkeypatch, argv, message) -> None:  # noqa: F811
    monkeypatch.chdir(tmp_path)
    names = {"GPT": runs["gpt"], "TRANSLATOR": runs["translator"]}
    assert message in fails(capsys, *[names.get(a, a) for a in argv])
    assert not (tmp_path / "w.html").exists()
