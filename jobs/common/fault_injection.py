"""Test hook: kill the job (SIGKILL) at a named point, to test recovery at commit boundaries.

`LAKEHOUSE_CRASH_AT=ingest.between-commits:3` kills the process the 3rd time it passes that
point. Unset, as everywhere but in tests, a pass costs one environment lookup.
"""

from __future__ import annotations

import os
import signal
from collections import Counter

ENV_VAR = "LAKEHOUSE_CRASH_AT"
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
