"""`make test`: the suite as two groups of tests at once.

The suite waits on servers, JVMs and subprocesses far more than it computes (in one process: 16
CPU-minutes over 31 minutes on 2 cores), so two groups share the box well:

- **stack** (`-m "stack and not synth"`): the tests against the embedded stack, one local stack and
  one Spark session between them; their output streams here;
- **others** (`-m "not stack or synth"`): CDK synth, both scanners, the EMR package, the rehearsal
  (on a stack of its own) and the pure logic; logged to `.test-logs/others.log`, printed when both
  have ended.

The markers split the suite in two without overlap, and only the second group synthesizes or builds
`dist/emr`. Arguments go to both pytest runs (`make test PYTEST_ARGS="-k cdc -x"`); one that selects
by marker itself (`-m`) runs once, in one process, as does `TEST_GROUPS=1`. Exit status: 0 when both
passed or one had nothing selected (pytest's 5), else the stack group's failure, else the others'.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LOG = REPO / ".test-logs" / "others.log"
STACK, OTHERS = "stack and not synth", "not stack or synth"
NOTHING_SELECTED = 5


def _code(returncode: int) -> int:
    return 0 if returncode == NOTHING_SELECTED else returncode


def main(argv: list[str]) -> int:
    pytest = [sys.executable, "-m", "pytest"]
    if os.environ.get("TEST_GROUPS") == "1" or any(a.startswith("-m") for a in argv):
        return subprocess.call([*pytest, *argv], cwd=REPO)
    LOG.parent.mkdir(exist_ok=True)
    print(f"make test: the stack tests here, the others at once ({LOG.relative_to(REPO)})", flush=True)
    with LOG.open("w") as log:
        others = subprocess.Popen(
            [*pytest, "-m", OTHERS, *argv], cwd=REPO, stdout=log, stderr=subprocess.STDOUT
        )
        try:
            stack = subprocess.call([*pytest, "-m", STACK, *argv], cwd=REPO)
            rest = others.wait()
        except BaseException:  # an interrupt: the other group goes too
            others.kill()
            others.wait()
            raise
    print(f"\n---- the other tests ({LOG.relative_to(REPO)}) ----", flush=True)
    sys.stdout.write(LOG.read_text(errors="replace"))
    print(f"\nmake test: stack tests exit {stack}, the others exit {rest}", flush=True)
    return _code(stack) or _code(rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
