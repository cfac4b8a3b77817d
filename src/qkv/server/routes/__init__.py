"""The HTTP routes, one module per kind of endpoint, each a FastAPI router of module-level handlers.

A handler reads the :class:`~qkv.server.service.Service` from the app (:func:`service_of`), checks the request
once, and hands the model work down the ladder (the analysis views, a scheduler, the translation batches); it
never reaches back up. :mod:`qkv.server.app` mounts :data:`ROUTERS`.
"""

from qkv.server.routes import chat, completions, meta, tokens, translations, views

ROUTERS = [meta.router, completions.router, chat.router, translations.router, views.router, tokens.router]

__all__ = ["ROUTERS"]
