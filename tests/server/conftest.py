"""Fixtures for the server tests: tiny models trained in a few seconds, served by uvicorn on loopback ports."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

pytest.importorskip("fastapi", reason="the server tests need the server extra: pip install -e '.[server]'")
pytest.importorskip("uvicorn", reason="the server tests need the server extra: pip install -e '.[server]'")
httpx = pytest.importorskip("httpx", reason="the server tests need httpx (the test extra)")

from qkv.loading import load  # noqa: E402
from qkv.model_dir import ModelBundle, save_model_dir  # noqa: E402
from qkv.models import Encoder, EncoderConfig  # noqa: E402
from qkv.server import BackgroundServer, Limits, create_app  # noqa: E402
from qkv.tokenizers import CharTokenizer  # noqa: E402
from qkv.training import TrainConfig, train_language_model, train_translator  # noqa: E402

TEXT = (
    "To be, or not to be, that is the question:\n"
    "Whether 'tis nobler in the mind to suffer\n"
    "The slings and arrows of outrageous fortune,\n"
    "Or to take arms against a sea of troubles\n"
) * 30
WORDS = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]


@dataclass
class Served:
    """A running server, the bundle it serves (a separate copy loaded from the same files) and a client."""

    server: BackgroundServer
    bundle: ModelBundle
    client: httpx.Client

    @property
    def url(self) -> str:
        return self.server.url


@pytest.fixture(scope="session")
def gpt_run(tmp_path_factory) -> str:
    """A tiny character-level GPT (2 layers, 4 heads, context 32), trained for 20 steps."""
    root = tmp_path_factory.mktemp("gpt")
    (root / "text.txt").write_text(TEXT)
    config = TrainConfig(
        data=str(root / "text.txt"),
        out_dir=str(root / "run"),
        preset="gpt-nano",
        steps=20,
        batch_size=4,
        warmup_steps=2,
        eval_interval=20,
        eval_batches=2,
        log_interval=100,
        lr=3e-3,
        model={"context_length": 32},
    )
    return str(train_language_model(config, quiet=True).run_dir)


def train_reversal(root, **settings) -> str:
    """A translator trained 20 steps on a toy reversal task ("one two" -> "TWO ONE"); its run folder."""
    lines = []
    for i in range(300):
        words = [WORDS[(i * 7 + j * 3) % 10] for j in range(2 + i % 3)]
        lines.append(" ".join(words) + "\t" + " ".join(reversed(words)).upper())
    (root / "pairs.tsv").write_text("\n".join(lines) + "\n")
    config = TrainConfig.create(
        task="translate",
        data=str(root / "pairs.tsv"),
        out_dir=str(root / "run"),
        steps=20,
        batch_size=16,
        warmup_steps=2,
        eval_interval=20,
        eval_batches=2,
        bleu_sentences=8,
        log_interval=100,
        **settings,
    )
    return str(train_translator(config, quiet=True).run_dir)


@pytest.fixture(scope="session")
def translator_run(tmp_path_factory) -> str:
    """A tiny translator (1 encoder and 1 decoder layer, 2 heads) for the toy reversal task."""
    model = {"d_model": 32, "n_heads": 2, "d_ff": 64, "n_encoder_layers": 1, "n_decoder_layers": 1}
    return train_reversal(tmp_path_factory.mktemp("translator"), model=model)


@pytest.fixture(scope="session")
def encoder_dir(tmp_path_factory) -> str:
    """A random tiny encoder with a character tokenizer, saved as a model folder."""
    root = tmp_path_factory.mktemp("encoder") / "encoder"
    tokenizer = CharTokenizer.train(TEXT)
    model = Encoder(
        EncoderConfig(vocab_size=tokenizer.vocab_size, d_model=32, n_heads=2, n_layers=2, context_length=64)
    )
    save_model_dir(root, model, tokenizer)
    return str(root)


def error_of(response: httpx.Response, status: int | tuple[int, ...]) -> str:
    """The message of an error response in OpenAI's shape, after checking the shape and the status."""
    statuses = status if isinstance(status, tuple) else (status,)
    assert response.status_code in statuses, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    message = body["error"]["message"]
    assert isinstance(message, str) and len(message) > 10
    return message


def serve(path: str, limits: Limits | None = None, **options) -> Iterator[Served]:
    with BackgroundServer(create_app(load(path), limits, **options)) as server:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            yield Served(server, load(path), client)


@pytest.fixture(scope="session")
def gpt(gpt_run) -> Iterator[Served]:
    yield from serve(gpt_run, Limits(max_prompt_tokens=200, max_tokens=300, max_concurrent=4, queue_timeout=30))


@pytest.fixture(scope="session")
def translator(translator_run) -> Iterator[Served]:
    yield from serve(translator_run)


@pytest.fixture(scope="session")
def encoder(encoder_dir) -> Iterator[Served]:
    yield from serve(encoder_dir)


@pytest.fixture
def busy_gpt(gpt_run) -> Iterator[Served]:
    """One generation at a time (one row of the batch), a short wait for a slot, and room for long generations."""
    yield from serve(gpt_run, Limits(max_tokens=100_000, max_concurrent=1, max_batch=1, queue_timeout=0.3))


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium driven by Playwright, for the browser tests (tests/server/browser_page.py: which Chromium,
    and the skip without it)."""
    from tests.server.browser_page import CHROMIUM, sync_api

    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]
        )
        yield browser
        browser.close()


@pytest.fixture
def page(browser):
    page = browser.new_page(viewport={"width": 1100, "height": 1400})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.set_default_timeout(30_000)
    yield page
    page.close()
    assert not errors, errors  # the page ran without a JavaScript error
