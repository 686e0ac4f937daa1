"""Shared bench plumbing: a throwaway local stack on its own home and free ports, and result rows."""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def private_stack(prefix: str, topic_retention: bool = True) -> Iterator:
    """A LocalStack in a temp home, so a bench never touches the user's stack; purged afterwards.
    BENCH_LOG_DIR=DIR keeps its logs (the servers' and the jobs') in DIR/<prefix>-<time> first."""
    home = Path(tempfile.mkdtemp(prefix=f"lakehouse-bench-{prefix}-"))
    from lakehouse.local.settings import StackSettings
    from lakehouse.local.stack import LocalStack

    settings = StackSettings.on_free_ports(home)
    os.environ.update(settings.environment())
    stack = LocalStack(settings)
    try:
        stack.up(topic_retention=topic_retention)
        yield stack
    finally:
        stack.down()
        _keep_logs(settings.log_dir, prefix)
        stack.down(purge=True)


def _keep_logs(log_dir: Path, prefix: str) -> None:
    keep = os.environ.get("BENCH_LOG_DIR")
    if keep and log_dir.exists():
        target = Path(keep) / f"{prefix}-{time.strftime('%Y%m%dT%H%M%S')}"
        try:
            shutil.copytree(log_dir, target)
            print(f"bench logs kept in {target}")
        except OSError as exc:  # the stack is purged all the same, the bench's own error kept
            print(f"warning: bench logs not kept in {target}: {exc}")


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
