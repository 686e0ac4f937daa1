"""Test hooks at named points of a job, to test recovery and races at commit boundaries.

- `LAKEHOUSE_CRASH_AT=ingest.between-commits:3` kills the process (SIGKILL) the 3rd time it passes
  that point.
- `LAKEHOUSE_RENDEZVOUS=ingest.before-commit:/dir:2` makes each process that reaches that point
  (the first time) leave a file in /dir and wait until 2 processes are there (2 min at most), so two
  jobs race for the same commit for certain, not by luck of timing.
- `LAKEHOUSE_PAUSE_AT=cdc.snapshot-chunk.t:/dir:6,11` makes a process stop the 6th and the 11th
  time it reaches that point, leave the file /dir/cdc.snapshot-chunk.t-6 and go on once a test has done
  its work at that moment and deleted the file (2 min at most): a test can act between two steps of
  another process (a child process included) at points it names.

Unset, as everywhere but in tests, a pass costs one environment lookup.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from pathlib import Path

ENV_VAR = "LAKEHOUSE_CRASH_AT"
RENDEZVOUS_ENV_VAR = "LAKEHOUSE_RENDEZVOUS"
PAUSE_ENV_VAR = "LAKEHOUSE_PAUSE_AT"
RENDEZVOUS_TIMEOUT_SECONDS = 120.0
_passes: Counter[str] = Counter()


def crash_point(name: str) -> None:
    wanted = os.environ.get(ENV_VAR)
    if not wanted:
        return
    point, _, nth = wanted.partition(":")
    if point != name:
        return
    _passes[name] += 1
    if _passes[name] >= int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)


def rendezvous(name: str) -> None:
    wanted = os.environ.get(RENDEZVOUS_ENV_VAR)
    if not wanted:
        return
    point, directory, count = wanted.split(":")
    if point != name or _passes[f"rendezvous:{name}"]:
        return
    _passes[f"rendezvous:{name}"] += 1
    meeting = Path(directory)
    (meeting / str(os.getpid())).touch()
    deadline = time.monotonic() + RENDEZVOUS_TIMEOUT_SECONDS
    while len(list(meeting.iterdir())) < int(count) and time.monotonic() < deadline:
        time.sleep(0.05)


def pause_point(name: str) -> None:
    wanted = os.environ.get(PAUSE_ENV_VAR)
    if not wanted:
        return
    point, directory, passes = wanted.split(":")
    if point != name:
        return
    _passes[f"pause:{name}"] += 1
    nth = _passes[f"pause:{name}"]
    if str(nth) not in passes.split(","):
        return
    marker = Path(directory) / f"{name}-{nth}"
    marker.touch()
    deadline = time.monotonic() + RENDEZVOUS_TIMEOUT_SECONDS
    while marker.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
