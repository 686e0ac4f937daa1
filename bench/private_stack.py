"""Shared bench plumbing: a throwaway local stack on its own home and free ports, and result rows."""

from __future__ import annotations

import contextlib
import os
import socket
import statistics
import tempfile
from collections.abc import Iterator
from pathlib import Path


def _free_port_base(start: int, span: int) -> int:
    for base in range(start, start + 5000, 100):
        if all(socket.socket().connect_ex(("127.0.0.1", p)) != 0 for p in range(base, base + span)):
            return base
    raise RuntimeError("no free ports for the bench stack")


@contextlib.contextmanager
def private_stack(prefix: str, topic_retention: bool = True) -> Iterator:
    """A LocalStack in a temp home, so a bench never touches the user's stack; purged afterwards."""
    home = Path(tempfile.mkdtemp(prefix=f"lakehouse-bench-{prefix}-"))
    os.environ.update(
        {
            "LAKEHOUSE_HOME": str(home),
            "LAKEHOUSE_MYSQL_PORT": str(_free_port_base(15306, 1)),
            "LAKEHOUSE_KAFKA_PORT": str(_free_port_base(25092, 1)),
            "LAKEHOUSE_S3_PORT": str(_free_port_base(26333, 7)),
        }
    )
    from lakehouse.local.settings import StackSettings
    from lakehouse.local.stack import LocalStack

    stack = LocalStack(StackSettings.resolve(home))
    stack.up(topic_retention=topic_retention)
    try:
        yield stack
    finally:
        stack.down(purge=True)


def percentiles(samples: list[float]) -> tuple[float, float]:
    """(p50, p95) of samples, NaN when there are none."""
    if not samples:
        return float("nan"), float("nan")
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[int(0.95 * (len(ordered) - 1))]


def row(metric: str, measured: str, target: str = "-", met: bool | None = None, before: str = "-") -> dict:
    """One result row; every bench prints the same five columns. `before`: the figure an issue
    recorded before the work it asked for (issue 13's "now" column), for comparison."""
    return {
        "metric": metric,
        "before": before,
        "target": target,
        "measured": measured,
        "met": "-" if met is None else met,
    }
