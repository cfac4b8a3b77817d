"""check_address (qkv.server.address): a busy port or a host this machine does not have is one line, before the
model loads."""

from __future__ import annotations

import socket

import pytest

from qkv.errors import QkvError
from qkv.server.address import check_address


def test_a_free_port_passes_and_a_busy_one_is_one_line() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(QkvError, match=f"port {port} on 127.0.0.1 is in use") as error:
            check_address("127.0.0.1", port)
        assert "\n" not in str(error.value) and "--port 0" in str(error.value)
    check_address("127.0.0.1", 0)  # any free port


@pytest.mark.parametrize("host", ["no-such-host.invalid", "203.0.113.7"])
def test_a_host_this_machine_does_not_have_is_one_line(host: str) -> None:
    with pytest.raises(QkvError, match=f"--host {host} is not") as error:
        check_address(host, 0)
    assert "127.0.0.1" in str(error.value) and "\n" not in str(error.value)
