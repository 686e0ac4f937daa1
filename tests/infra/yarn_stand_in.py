"""A stand-in for the EMR node's `yarn` command: `yarn application -list` prints the applications
given (tab-separated, padded columns, as YARN does) and `yarn application -kill ID` records ID in a
file, or fails. The step commands that kill applications (infra/emr_steps.py, the supervisor's
handover step) are run for real against it."""

from __future__ import annotations

import os
from pathlib import Path

HEADER = ("                Application-Id", "    Application-Name", "Application-Type", "State")


def install(directory: Path, apps: list[tuple[str, str]], kill_fails: bool = False) -> tuple[dict, Path]:
    """Write `yarn` into `directory` listing `apps` ((id, padded name) pairs, all RUNNING SPARK).
    Returns the environment to run a command with, and the file the killed ids are appended to."""
    killed = directory / "killed"
    rows = [HEADER, *((app_id, name, "           SPARK", "RUNNING") for app_id, name in apps)]
    listing = f"Total number of applications:{len(apps)}\\n" + "".join("\\t".join(r) + "\\n" for r in rows)
    kill = "exit 1" if kill_fails else f'echo "$3" >> {killed}'
    yarn = directory / "yarn"
    yarn.write_text(f'#!/usr/bin/env bash\nif [[ $2 == -list ]]; then printf "{listing}"; else {kill}; fi\n')
    yarn.chmod(0o755)
    return {**os.environ, "PATH": f"{directory}:{os.environ['PATH']}"}, killed
