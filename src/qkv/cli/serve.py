"""Serve a model over HTTP, with a web playground where you watch it think.

Open the printed address in a browser: type a prompt and see the next-token distribution, move the
temperature, top-k and top-p controls and watch it reshape, generate and see tokens arrive one by one, and
look at the attention of every layer and head. The API (OpenAI's /v1/completions and /v1/models,
/v1/translations, /v1/next-token, /v1/attention, /tokenize, /detokenize, /v1/model, /health) is described
in docs/serve.md and at /docs.

The server listens on 127.0.0.1 (this machine only) unless --host says otherwise; it has no authentication.
It answers only requests addressed to it by a localhost name or the --host address (--allow-host adds
names), so a web page cannot reach it through a DNS name that points at this machine.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from qkv.cli.common import (
    add_device_arguments,
    add_model_argument,
    add_quantize_argument,
    add_step_argument,
    load_options,
    model_path,
    use_device,
)
from qkv.cli.options import seconds
from qkv.errors import QkvError
from qkv.loading import load

if TYPE_CHECKING:
    from qkv.server import Limits


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_argument(parser, what="a run directory, or a pretrained model folder or Hub name")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine)")
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    parser.add_argument("--max-prompt-tokens", type=int, default=1024, help="longest prompt accepted (1024)")
    parser.add_argument("--max-tokens", type=int, default=512, help="largest max_tokens a request may ask for (512)")
    _add_scheduling_arguments(parser)
    _add_request_bounds(parser)
    parser.add_argument("--chat-template", default=None, metavar="FILE",
                        help="a Jinja chat template for /v1/chat/completions instead of the model's own")  # fmt: skip
    add_step_argument(parser)
    add_device_arguments(parser)
    add_quantize_argument(parser)
    parser.add_argument(
        "--log-level", default="info", choices=("debug", "info", "warning", "error"),
        help="the server's log: info (the default) has one line per request with its timings; warning, error: problems",
    )  # fmt: skip


def _add_scheduling_arguments(parser: argparse.ArgumentParser) -> None:
    """How requests share the model: the scheduler, the batch and its KV cache pool, the waits."""
    parser.add_argument(
        "--scheduler", choices=("batched", "sequential"), default="batched",
        help="batched (default): one decoding loop steps every running completion together (continuous "
        "batching), and waiting translations are translated together; sequential: each alone, at most "
        "--max-concurrent at once",
    )  # fmt: skip
    parser.add_argument(
        "--max-batch", type=int, default=16,
        help="batched: most sequences decoded together, the KV cache pool's rows (16); others wait. "
        "Translations: most decoder rows (sentences x beam) in one batch",
    )  # fmt: skip
    parser.add_argument(
        "--packed-weights", action=argparse.BooleanOptionalAction, default=True,
        help="batches and prefills multiply a copy of each float32 matrix in oneDNN's blocked layout, made on "
        "first use (default; faster); --no-packed-weights keeps one copy of the weights in memory",
    )  # fmt: skip
    parser.add_argument(
        "--kv-memory", type=float, default=0, metavar="MB",
        help="batched: bound the KV cache pool to this many MiB (default: --max-batch rows)",
    )  # fmt: skip
    parser.add_argument(
        "--kv-tokens", type=int, default=0,
        help="batched: bound the KV cache pool to this many cache positions (default: --max-batch rows)",
    )  # fmt: skip
    parser.add_argument(
        "--prompt-lookup", type=int, default=0, metavar="K",
        help="greedy requests (temperature 0, no penalties) draft up to K tokens a step from their own text, "
        "checked in that step: the same answers in fewer steps where they repeat the prompt (default 0: off)",
    )  # fmt: skip
    parser.add_argument(
        "--max-concurrent", type=int, default=2,
        help="sequential: generations running at once; and translations/analyses at once (default 2)",
    )  # fmt: skip
    parser.add_argument(
        "--queue-timeout",
        type=seconds,
        default=10.0,
        metavar="DURATION",
        help="how long a request waits for a free slot before 503: 10s (the default), 500ms, 1m; a number is seconds",
    )


def _add_request_bounds(parser: argparse.ArgumentParser) -> None:
    """What one request may ask for and who may ask: completions per prompt, logprobs, body size, host names."""
    parser.add_argument("--max-n", type=int, default=8, help="most completions per prompt a request may ask for (8)")
    parser.add_argument(
        "--max-logprobs", type=int, default=5, help="most top alternatives per token in logprobs (5, as OpenAI)"
    )
    parser.add_argument(
        "--max-request-bytes", type=int, default=1_048_576,
        help="largest request body; a bigger one is refused before it is read (1048576 = 1 MiB)",
    )  # fmt: skip
    parser.add_argument(
        "--allow-host", action="append", default=[], metavar="NAME",
        help="also answer requests whose Host header is NAME (repeatable; '*' for any name)",
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from qkv.layers.linear import use_packed_weights
        from qkv.server import allowed_hosts, create_app
        from qkv.server.model_thread import release_openmp_threads
    except ImportError as error:
        raise QkvError(
            f"qkv serve needs the server extra ({error.name} is missing): pip install -e '.[server]'"
        ) from None
    limits = _limits(args)
    if not 0 <= args.port <= 65535:
        raise QkvError(f"--port {args.port} is not a port number: use 1-65535, or 0 for a free one")
    from qkv.chat_templates import read_template_file
    from qkv.server.address import check_address

    check_address(args.host, args.port)  # a busy port or a foreign --host: one line, before the model loads
    template = read_template_file(args.chat_template) if args.chat_template else None
    bundle = load(model_path(args), device=use_device(args), **load_options(args))
    hosts = allowed_hosts(args.host, args.allow_host)
    app = create_app(bundle, limits, hosts=hosts, scheduler=args.scheduler, step=args.step, chat_template=template)
    _log_requests(args.log_level)
    service = app.state.service
    shown = f"[{args.host}]" if ":" in args.host else args.host
    print(f"qkv serve: {service.name}, {service.info().description}", file=sys.stderr)
    if args.port:
        print(
            f"qkv serve: playground at http://{shown}:{args.port}/  (API docs at /docs; Ctrl-C stops)", file=sys.stderr
        )
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(
            f"note: listening on {args.host} with no authentication: anyone who can reach it can use it",
            file=sys.stderr,
        )
    if args.host not in ("127.0.0.1", "localhost", "::1") or args.allow_host:
        print(f"qkv serve: answering requests for {', '.join(hosts)} (--allow-host adds names)", file=sys.stderr)
    use_packed_weights(args.packed_weights)
    release_openmp_threads()  # this thread loaded the model and now only serves HTTP: one OpenMP master left
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, timeout_graceful_shutdown=3)
    return 0


def _limits(args: argparse.Namespace) -> Limits:
    """The server's limits from the flags; a bad value is one line naming its flag."""
    from qkv.server import Limits

    try:
        return Limits(
            args.max_prompt_tokens,
            args.max_tokens,
            args.max_concurrent,
            args.queue_timeout,
            max_n=args.max_n,
            max_logprobs=args.max_logprobs,
            max_request_bytes=args.max_request_bytes,
            max_batch=args.max_batch,
            kv_tokens=args.kv_tokens,
            kv_memory_mb=args.kv_memory,
            prompt_lookup=args.prompt_lookup,
        )
    except ValueError as error:  # "max_batch must be at least 1, got 0": the setting's flag first
        name, _, rest = str(error).partition(" ")
        flag = {"kv_memory_mb": "--kv-memory"}.get(name, "--" + name.replace("_", "-"))
        raise QkvError(f"{flag} {rest}") from None


def _log_requests(level: str) -> None:
    """One line per completion on stderr (qkv.server.metrics' logger), at --log-level info or debug."""
    import logging

    logger = logging.getLogger("qkv.serve")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(level.upper())
    logger.propagate = False
