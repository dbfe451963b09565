"""Test helpers for loopback servers."""

import socket


def free_port() -> int:
    """A loopback port nothing listens on now (for servers that must be told their port)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
