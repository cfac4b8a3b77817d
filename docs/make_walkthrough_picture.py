"""Draw docs/images/walkthrough.png: the playground's walk-through of a GPT, screenshotted in headless Chromium.

    python docs/make_walkthrough_picture.py RUN_DIR ["prompt"]

RUN_DIR is any GPT run or model folder (the committed picture: `qkv train --preset gpt-nano --data
tinyshakespeare/input.txt --steps 200 --warmup-steps 20 --seed 1337`, about 80 s on 2 CPU cores). It serves
the model on a loopback port, opens the playground, types the prompt, opens the walk-through and saves the
section as a PNG. Needs Debian's chromium and the playwright package (the test extra).
"""

from __future__ import annotations

import sys
from pathlib import Path

from playwright.sync_api import sync_playwright

import qkv
from qkv.server import BackgroundServer, create_app

OUT = Path(__file__).resolve().parent / "images" / "walkthrough.png"


def main(run: str, prompt: str = "ROMEO: To be") -> None:
    with BackgroundServer(create_app(qkv.load(run), name=Path(run).name)) as server, sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1000, "height": 1200})
        page.goto(server.url + "/")
        page.wait_for_selector("body[data-ready='1']")
        page.fill("#prompt", prompt)
        page.click("#show-walkthrough")
        page.wait_for_selector("#walkthrough-view[data-state='shown']")
        page.wait_for_selector("#wt-final .bar-row")
        page.select_option("#wt-block-1 select.wt-head", "1")
        canvas = page.locator("#wt-block-1 canvas.wt-attention-map")
        g = {k: float(v) for k, v in canvas.evaluate("c => ({...c.dataset})").items()}
        last = int(g["rows"]) - 1
        canvas.click(position={"x": g["labelW"] + g["cellW"] * 0.5, "y": g["labelH"] + g["cellH"] * (last + 0.5)})
        page.locator("#walkthrough-section").screenshot(path=str(OUT))
        browser.close()
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main(*sys.argv[1:])
