"""Helpers for tests that drive the real `lakehouse` command in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from lakehouse.local.settings import StackSettings

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


def private_stack_env(home: Path) -> dict[str, str]:
    """Environment for a stack of its own (state dir and ports), apart from the session stack."""
    return {**os.environ, **StackSettings.on_free_ports(home).environment()}
