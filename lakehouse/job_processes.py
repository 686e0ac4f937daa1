"""Run pipeline jobs as child processes (`python -m jobs.<job>`, as an EMR step runs `emr_step.py <job>`).

Each child logs to its own file; `JobProcesses` notices a child that died, says which and shows
the end of its log, and stops the others with SIGTERM (the jobs finish and commit their batch).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from jobs.registry import job as registered_job
from lakehouse.local.process import StackError

REPO_ROOT = Path(__file__).resolve().parent.parent


class JobFailed(StackError):
    """A job child process exited on its own; the message carries the end of its log."""


@dataclass
class Job:
    name: str
    argv: list[str]
    log_path: Path
    process: subprocess.Popen
    ready_pattern: str  # a log line the job prints once it is consuming

    def log_tail(self, lines: int = 15) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def log_matches(self, pattern: str) -> re.Match | None:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return re.search(pattern, text)


class JobProcesses:
    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.jobs: dict[str, Job] = {}

    def start(self, name: str, *args: str, ready_pattern: str) -> Job:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name}.log"
        argv = [sys.executable, "-m", registered_job(name).package, *args]
        with log_path.open("w") as log:
            # Own session: a terminal Ctrl-C reaches this process only, which then stops the
            # children in order instead of all of them racing.
            process = subprocess.Popen(
                argv, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        job = Job(name, argv, log_path, process, ready_pattern)
        self.jobs[name] = job
        return job

    def check(self) -> None:
        """Raise JobFailed if a job exited while it should be running."""
        for job in self.jobs.values():
            code = job.process.poll()
            if code is not None:
                raise JobFailed(
                    f"job {job.name} exited with code {code}; end of {job.log_path}:\n{job.log_tail()}"
                )

    def wait_ready(self, timeout: float) -> None:
        """Wait until every job has logged its ready line; fail if one dies meanwhile."""
        deadline = time.monotonic() + timeout
        pending = list(self.jobs)
        while pending:
            self.check()
            pending = [n for n in pending if not self.jobs[n].log_matches(self.jobs[n].ready_pattern)]
            if pending and time.monotonic() > deadline:
                names = ", ".join(pending)
                raise JobFailed(f"jobs {names} not ready after {timeout:.0f}s; see {self.log_dir}")
            time.sleep(0.5)

    def stop(self, timeout: float = 90) -> dict[str, int]:
        """SIGTERM every job, wait for them to commit and exit, SIGKILL what hangs; exit codes.

        SIGTERM goes to the job's Python process only: its Spark JVM is in the same process group and
        must outlive the final commit (it exits with its parent).
        """
        for job in self.jobs.values():
            if job.process.poll() is None:
                job.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        codes: dict[str, int] = {}
        for name, job in self.jobs.items():
            try:
                codes[name] = job.process.wait(max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(job.process.pid, signal.SIGKILL)
                codes[name] = job.process.wait()
        self.jobs.clear()
        return codes


def run_job(name: str, *args: str, timeout: float = 900, width: int = 120) -> subprocess.CompletedProcess:
    """Run a one-shot job (report, maintenance) to completion, output captured; `width` is the
    terminal width its tables are rendered for."""
    return subprocess.run(
        [sys.executable, "-m", registered_job(name).package, *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        start_new_session=True,
        env={**os.environ, "COLUMNS": str(width)},
    )
