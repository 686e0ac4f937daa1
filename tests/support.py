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


def kernel_free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def free_port(avoid: frozenset[int] | set[int] = frozenset()) -> int:
    """A port the kernel says is free now, not one of `avoid`."""
    while (port := kernel_free_port()) in avoid:
        pass
    return port


def free_port_base(span: int) -> int:
    """A base port with `span` free ports after it, and after base + 10000 (SeaweedFS gRPC)."""
    for base in range(41000, 50000, 37):
        ports = [*range(base, base + span), *range(base + 10001, base + 10000 + span)]
        if all(port_bindable(p) for p in ports):
            return base
    raise RuntimeError("no free port block")


def stack_ports() -> tuple[int, int, int]:
    """(MariaDB, broker, SeaweedFS base) ports for a stack of its own, none overlapping. The kernel's
    free port is free only until something binds it, and SeaweedFS binds a block of 7 (and their
    gRPC ports, + 10000): in a CI run the broker was handed 41005, inside the block at 41000."""
    s3 = free_port_base(7)
    block = {*range(s3, s3 + 7), *range(s3 + 10_001, s3 + 10_007)}
    mysql = free_port(avoid=block)
    return mysql, free_port(avoid=block | {mysql}), s3


def private_stack_env(home: Path) -> dict[str, str]:
    """Environment for a stack of its own (state dir and ports), apart from the session stack."""
    mysql, kafka, s3 = stack_ports()
    return {
        **os.environ,
        "LAKEHOUSE_HOME": str(home),
        "LAKEHOUSE_MYSQL_PORT": str(mysql),
        "LAKEHOUSE_KAFKA_PORT": str(kafka),
        "LAKEHOUSE_S3_PORT": str(s3),
    }
