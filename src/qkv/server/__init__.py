"""Serving a model over HTTP: an OpenAI-style completions API, translation, the next-token distribution and
attention weights as JSON, and a web playground that shows them (``qkv serve RUN_DIR``; docs/serve.md).

>>> from qkv.cli.common import load_any
>>> from qkv.server import Limits, create_app
>>> app = create_app(load_any("runs/shakespeare"), Limits(max_concurrent=2))  # doctest: +SKIP

Needs the ``server`` extra (fastapi, uvicorn, pydantic): ``pip install -e ".[server]"``.
"""

from qkv.server.app import create_app
from qkv.server.background import BackgroundServer
from qkv.server.service import Limits, Service, ServiceError

__all__ = ["BackgroundServer", "Limits", "Service", "ServiceError", "create_app"]
