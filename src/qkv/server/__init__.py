"""Serving a model over HTTP: OpenAI's completions API (logprobs, echo, n, stop, streaming), translation, the
next-token distribution and attention weights as JSON (the numbers ``qkv next`` and ``qkv attention``
print), and a web playground that shows them (``qkv serve RUN_DIR``; docs/serve.md).

>>> import qkv
>>> from qkv.server import Limits, create_app
>>> app = create_app(qkv.load("runs/shakespeare"), Limits(max_concurrent=2))  # doctest: +SKIP

Needs the ``server`` extra (fastapi, uvicorn, pydantic): ``pip install -e ".[server]"``.
"""

from qkv.server.app import create_app
from qkv.server.background import BackgroundServer
from qkv.server.errors import ServiceError
from qkv.server.guard import allowed_hosts
from qkv.server.limits import Limits
from qkv.server.service import Service

__all__ = ["BackgroundServer", "Limits", "Service", "ServiceError", "allowed_hosts", "create_app"]
