"""Background processes the project owns, tracked by pid files under the state directory."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


class StackError(RuntimeError):
    """A local-stack problem; the message says what to do next."""


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def tail(path: Path, lines: int = 15) -> str:
    if not path.exists():
        return f"(no log at {path})"
    text = path.read_text(errors="replace").splitlines()
    return "\n".join(text[-lines:])


@dataclass(frozen=True)
class ManagedProcess:
    """One server process: its command line, pid file and log file."""

    name: str
    run_dir: Path
    log_dir: Path
    # A substring of /proc/PID/cmdline that proves the pid is ours (guards against pid reuse).
    signature: str

    @property
    def pid_file(self) -> Path:
        return self.run_dir / f"{self.name}.pid"

    @property
    def log_file(self) -> Path:
        return self.log_dir / f"{self.name}.log"

    def pid(self) -> int | None:
        """The live pid of this process, or None. A stale pid file is removed."""
        if not self.pid_file.exists():
            return None
        try:
            pid = int(self.pid_file.read_text().strip())
            os.kill(pid, 0)
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            stat = Path(f"/proc/{pid}/stat").read_text()
            # cmdline is briefly empty right after exec; a non-empty one must be ours, since a
            # recycled pid belongs to someone else (stale pid file).
            alive = (not cmdline or self.signature in cmdline) and ") Z " not in stat
        except (ValueError, OSError):
            alive = False
        if not alive:
            self.pid_file.unlink(missing_ok=True)
            return None
        return pid

    def is_running(self) -> bool:
        return self.pid() is not None

    def start(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> int:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with self.log_file.open("ab") as log:
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
                cwd=cwd,
                start_new_session=True,  # survives the CLI exiting; not killed by Ctrl-C on `up`
            )
        self.pid_file.write_text(str(proc.pid))
        return proc.pid

    def wait_until(self, ready: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.is_running():
                raise StackError(
                    f"{self.name} exited while starting. Log {self.log_file}:\n{tail(self.log_file)}"
                )
            try:
                if ready():
                    return
            except Exception:  # noqa: BLE001 - not ready yet, whatever the reason
                pass
            time.sleep(0.2)
        raise StackError(
            f"{self.name} did not become ready ({what}) within {timeout:.0f}s. "
            f"Log {self.log_file}:\n{tail(self.log_file)}"
        )

    def stop(self, timeout: float = 20.0) -> bool:
        """SIGTERM, then SIGKILL after `timeout`. Returns whether a process was stopped."""
        pid = self.pid()
        if pid is None:
            return False
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.pid() is not None:
            time.sleep(0.1)
        if self.pid() is not None:
            os.kill(pid, signal.SIGKILL)
            while self.pid() is not None:
                time.sleep(0.05)
        self.pid_file.unlink(missing_ok=True)
        return True
