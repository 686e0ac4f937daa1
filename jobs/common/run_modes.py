"""Run modes shared by the streaming jobs: continuous, --until-idle, --max-seconds, SIGTERM."""

from __future__ import annotations

import argparse
import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunMode:
    trigger_seconds: float = 1.0
    until_idle: bool = False
    idle_seconds: float = 3.0  # quiet period that counts as "caught up" with --until-idle
    max_seconds: float | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RunMode:
        return cls(args.trigger_seconds, args.until_idle, args.idle_seconds, args.max_seconds)


def add_run_mode_args(parser: argparse.ArgumentParser, default_trigger: float = 1.0) -> None:
    group = parser.add_argument_group("run mode")
    group.add_argument(
        "--trigger-seconds",
        type=float,
        default=default_trigger,
        help=f"micro-batch interval (default {default_trigger}s)",
    )
    group.add_argument(
        "--until-idle", action="store_true", help="stop once nothing new arrived for --idle-seconds"
    )
    group.add_argument("--idle-seconds", type=float, default=3.0)
    group.add_argument("--max-seconds", type=float, help="stop after this long")


class StopRequest:
    """Set by SIGTERM/SIGINT; the loop finishes (and commits) the current batch, then exits."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def install(self) -> StopRequest:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, _frame: object) -> None:
        log.info("received %s: finishing the current batch", signal.Signals(signum).name)
        self._event.set()

    def set(self) -> None:
        self._event.set()

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    def wait(self, seconds: float) -> bool:
        return self._event.wait(max(0.0, seconds))


def run_batches(
    run_batch: Callable[[], int],
    mode: RunMode,
    stop: StopRequest,
    upstream_done: Callable[[], bool] | None = None,
    busy: Callable[[], bool] = lambda: False,
) -> int:
    """Call `run_batch` (returns records handled) per trigger until the mode says stop.

    With --until-idle and `upstream_done` (a job fed by another in the same application), idle
    counts only from when the upstream job finished: everything it committed is then handled; nor
    while `busy()` (work between the batches, CDC's re-snapshot beside the stream).
    Returns the total records handled. A batch is never interrupted: stop is checked between them.
    """
    started = time.monotonic()
    last_data = started
    upstream_done_at = None if upstream_done else started
    total = 0
    while True:
        if upstream_done_at is None and upstream_done():
            upstream_done_at = time.monotonic()
        batch_started = time.monotonic()
        handled = run_batch()
        total += handled
        now = time.monotonic()
        if handled or busy():
            last_data = now
        if stop.requested:
            break
        if mode.max_seconds is not None and now - started >= mode.max_seconds:
            break
        idle_since = max(last_data, upstream_done_at if upstream_done_at is not None else now)
        if mode.until_idle and not handled and now - idle_since >= mode.idle_seconds:
            break
        if not handled or now - batch_started < mode.trigger_seconds:
            stop.wait(mode.trigger_seconds - (now - batch_started))
    return total
