"""Helpers for tests that drive the real `lakehouse` command in a subprocess."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from lakehouse.local.settings import port_bindable

REPO = Path(__file__).resolve().parent.parent
LAKEHOUSE_BIN = str(Path(sys.prefix) / "bin" / "lakehouse")


def run_cli(*args: str, check: bool = True, timeout: float = 300, **kwargs) -> subprocess.CompletedProcess:
    """Run the installed `lakehouse` command with the test stack's environment."""
    result = subprocess.run(
        [LAKEHOUSE_BIN, *args], capture_output=True, text=True, timeout=timeout, cwd=REPO, **kwargs
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"lakehouse {' '.join(args)} exited {result.returncode}\n"
            f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
        )
    return result


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def free_port_base(span: int) -> int:
    """A base port with `span` free ports after it, and after base + 10000 (SeaweedFS gRPC)."""
    for base in range(41000, 50000, 37):
        ports = [*range(base, base + span), *range(base + 10001, base + 10000 + span)]
        if all(port_bindable(p) for p in ports):
            return base
    raise RuntimeError("no free port block")


def private_stack_env(home: Path) -> dict[str, str]:
    """Environment for a stack of its own (state dir and ports), apart from the session stack."""
    return {
        **os.environ,
        "LAKEHOUSE_HOME": str(home),
        "LAKEHOUSE_MYSQL_PORT": str(free_port()),
        "LAKEHOUSE_KAFKA_PORT": str(free_port()),
        "LAKEHOUSE_S3_PORT": str(free_port_base(7)),
    }
