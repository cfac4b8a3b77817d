"""Whether ``qkv serve`` can listen where it was asked, checked before the model loads: a busy port or a host
that is not this machine's becomes one line (exit code 2) instead of uvicorn's log and exit code 3."""

from __future__ import annotations

import errno
import socket

from qkv.errors import QkvError

_HOSTS_FIX = "use 127.0.0.1 (this machine only) or 0.0.0.0 (every network interface)"


def check_address(host: str, port: int) -> None:
    """QkvError unless a listening socket can be bound to ``host``:``port`` now (uvicorn binds it a moment
    later, with SO_REUSEADDR as here, so a port in TIME_WAIT is not refused)."""
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as error:
        reason = getattr(error, "strerror", None) or str(error)
        raise QkvError(f"--host {host} is not a name or address this machine has ({reason}): {_HOSTS_FIX}") from None
    family, kind, proto, _, address = found[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as error:
            raise QkvError(_bind_problem(error, host, port)) from None


def _bind_problem(error: OSError, host: str, port: int) -> str:
    if error.errno == errno.EADDRINUSE:
        return (
            f"port {port} on {host} is in use (another qkv serve?): stop that server, or choose another --port "
            "(--port 0 picks a free one)"
        )
    if error.errno == errno.EADDRNOTAVAIL:
        return f"--host {host} is not an address of this machine: {_HOSTS_FIX}"
    if error.errno == errno.EACCES:
        return f"listening on port {port} needs more privileges (ports below 1024 need root): use e.g. --port 8000"
    return f"cannot listen on {host}:{port} ({error.strerror or error}): choose another --host or --port"
