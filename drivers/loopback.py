"""A free loopback port for a server another process (or a later call) will bind.

``bind(("127.0.0.1", 0))`` hands out a port from the kernel's ephemeral range
(``net.ipv4.ip_local_port_range``, 32768-60999 by default), the same range every
outgoing connection takes its local port from: between picking a port that way and a
server binding it, any ``connect()`` on the host may take it, and the server fails with
``EADDRINUSE`` (seen: a webhook the API server was told to call on a port picked at the
start of a test module, taken by then). :func:`free_port` picks below that range instead,
at random (several runs share a machine), and checks the port is free by binding it.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOW = 10000  # above the well-known and most registered service ports


def _ephemeral_low() -> int:
    try:
        return int(_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = "127.0.0.1") -> int:
    """A port on ``host`` that is free now and outside the ephemeral range."""
    high = _ephemeral_low() - 1
    if high <= LOW:  # a host whose ephemeral range starts low: the kernel's choice
        return _kernel_port(host)
    for _ in range(200):
        port = random.randint(LOW, high)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    return _kernel_port(host)


def _kernel_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
