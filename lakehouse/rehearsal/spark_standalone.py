"""A Spark standalone cluster on 127.0.0.1 (one master, one worker process), from the node's Spark
install: executors are JVMs of their own that unpack `spark.archives` in their work directory."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path


class ClusterError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class StandaloneCluster:
    spark_home: Path
    work_dir: Path
    env: dict[str, str]  # the node's environment (executors inherit the worker's)
    cores: int = 2
    memory: str = "2g"
    master_port: int = 0

    def __post_init__(self) -> None:
        self.master_port = self.master_port or free_port()
        self._processes: list[subprocess.Popen] = []

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.master_port}"

    def start(self, timeout: float = 90) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        spark_class = str(self.spark_home / "bin" / "spark-class")
        master_log = self.work_dir / "master.log"
        worker_log = self.work_dir / "worker.log"
        self._spawn(
            [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
             "--port", str(self.master_port), "--webui-port", str(free_port())],
            master_log,
        )  # fmt: skip
        self._spawn(
            [spark_class, "org.apache.spark.deploy.worker.Worker", self.url, "--host", "127.0.0.1",
             "--cores", str(self.cores), "--memory", self.memory, "--webui-port", str(free_port()),
             "--work-dir", str(self.work_dir / "worker")],
            worker_log,
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if "Successfully registered with master" in _read(worker_log):
                return
            for process in self._processes:
                if process.poll() is not None:
                    raise ClusterError(
                        f"a Spark standalone process exited {process.returncode}: see {self.work_dir}"
                    )
            time.sleep(0.3)
        raise ClusterError(
            f"the Spark worker did not register with the master in {timeout:.0f}s: see {worker_log}"
        )

    def _spawn(self, command: list[str], log: Path) -> None:
        env = {**self.env, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_NO_DAEMONIZE": "1"}
        with log.open("ab") as out:
            self._processes.append(
                subprocess.Popen(
                    command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
                )
            )

    def stop(self) -> None:
        for process in reversed(self._processes):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in self._processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        self._processes.clear()


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""
