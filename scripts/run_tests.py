"""`make test`: the suite as two groups of tests at once.

The suite waits on servers, JVMs and subprocesses far more than it computes (in one process: 16
CPU-minutes over 31 minutes on 2 cores), so two groups share the box well:

- **stack** (`-m "stack and not synth and not own_stack"`): the tests against the session's stack,
  one local stack and one Spark session between them; their output streams here;
- **others** (`-m "not stack or synth or own_stack"`): CDK synth, both scanners, the EMR package,
  the rehearsal, the tests that bring stacks of their own (the demo, the streaming application's,
  the local stack's; `own_stack`, tests/conftest.py) and the pure logic; logged to
  `.test-logs/others.log`, printed when both have ended.

The markers split the suite in two without overlap, and only the second group synthesizes or builds
`dist/emr`. Arguments go to both pytest runs (`make test PYTEST_ARGS="-k cdc -x"`; each group keeps
its own `.pytest_cache`, so `--lf` finds the failures of both); one that selects by marker itself
(`-m`) runs once, in one process, as does `TEST_GROUPS=1`. Exit status: 0 when both passed or one
had nothing selected (pytest's 5; both: 5), else the stack group's failure, else the others'. Ctrl-C
stops both, each tearing its stack down.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LOG = REPO / ".test-logs" / "others.log"
STACK, OTHERS = "stack and not synth and not own_stack", "not stack or synth or own_stack"
NOTHING_SELECTED = 5


def _code(returncode: int) -> int:
    return 0 if returncode == NOTHING_SELECTED else returncode


def _run(commands: list[tuple[list[str], object]]) -> list[int]:
    """Start each (command, stdout) and wait for all. A Ctrl-C reaches every one of them from the
    terminal (one process group): each pytest then tears its stack down, and this waits for that.
    A SIGTERM to this process is passed on to them as a SIGINT, to the same end."""
    processes = [subprocess.Popen(command, cwd=REPO, stdout=out, stderr=out) for command, out in commands]

    def interrupt(signum, frame) -> None:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGINT)

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # after the start: they must not inherit it
    signal.signal(signal.SIGTERM, interrupt)
    return [process.wait() for process in processes]


def main(argv: list[str]) -> int:
    pytest = [sys.executable, "-m", "pytest"]
    if os.environ.get("TEST_GROUPS") == "1" or any(a.startswith("-m") for a in argv):
        return _run([([*pytest, *argv], None)])[0]
    LOG.parent.mkdir(exist_ok=True)
    print(f"make test: the stack tests here, the others at once ({LOG.relative_to(REPO)})", flush=True)
    with LOG.open("w") as log:
        # each its own cache: `--lf` after a run finds the failures of both
        stack, rest = _run([
            ([*pytest, "-m", STACK, "-o", "cache_dir=.pytest_cache/stack", *argv], None),
            ([*pytest, "-m", OTHERS, "-o", "cache_dir=.pytest_cache/others", *argv], log),
        ])  # fmt: skip
    print(f"\n---- the other tests ({LOG.relative_to(REPO)}) ----", flush=True)
    sys.stdout.write(LOG.read_text(errors="replace"))
    print(f"\nmake test: stack tests exit {stack}, the others exit {rest}", flush=True)
    if stack == rest == NOTHING_SELECTED:
        return NOTHING_SELECTED  # as pytest says when nothing matched
    return _code(stack) or _code(rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
