"""Where the embedded stack lives and which ports it uses (fixed defaults, env-var overrides)."""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from jobs.config import STATE_FILE, local_home

DEFAULT_PORTS = {"mysql": 3307, "kafka": 19092, "s3": 18333}
PORT_ENV = {
    "mysql": "LAKEHOUSE_MYSQL_PORT",
    "kafka": "LAKEHOUSE_KAFKA_PORT",
    # SeaweedFS needs several ports: S3 on this one, its master/volume/filer/admin/... on the
    # next six, and each of those + 10000 for gRPC.
    "s3": "LAKEHOUSE_S3_PORT",
}
S3_PORT_SPAN = 7


@dataclass(frozen=True)
class StackSettings:
    home: Path
    mysql_port: int
    kafka_port: int
    s3_port: int
    host: str = "127.0.0.1"

    @classmethod
    def resolve(cls, home: str | os.PathLike[str] | None = None) -> StackSettings:
        """Ports: env var if set, else what the last `up` recorded, else the default."""
        home_path = local_home(home)
        recorded = read_state(home_path).get("ports", {})
        ports = {}
        for part, default in DEFAULT_PORTS.items():
            raw = os.environ.get(PORT_ENV[part]) or recorded.get(part) or default
            try:
                ports[part] = int(raw)
            except ValueError as exc:
                raise ValueError(f"{PORT_ENV[part]}={raw!r} is not a port number") from exc
        return cls(home_path, ports["mysql"], ports["kafka"], ports["s3"])

    @classmethod
    def on_free_ports(cls, home: str | os.PathLike[str]) -> StackSettings:
        """A stack of its own beside any other (tests, benches, the rehearsal): ports nobody holds
        now, none of them inside another's block."""
        mysql, kafka, s3 = free_stack_ports()
        return cls(local_home(home), mysql, kafka, s3)

    def environment(self) -> dict[str, str]:
        """The variables that point `lakehouse` and the jobs (subprocesses) at this stack."""
        return {
            "LAKEHOUSE_HOME": str(self.home),
            **{PORT_ENV[part]: str(port) for part, port in self.ports().items()},
        }

    # Layout of the state directory.
    @property
    def run_dir(self) -> Path:
        return self.home / "run"

    @property
    def log_dir(self) -> Path:
        return self.home / "logs"

    @property
    def mysql_dir(self) -> Path:
        return self.home / "mysql"

    @property
    def s3_dir(self) -> Path:
        return self.home / "s3"

    @property
    def catalog_path(self) -> Path:
        return self.home / "catalog.db"

    @property
    def warehouse(self) -> Path:
        return self.home / "warehouse"

    @property
    def checkpoint_dir(self) -> Path:
        return self.home / "checkpoints"

    @property
    def secrets_file(self) -> Path:
        return self.home / "secrets.json"

    @property
    def state_file(self) -> Path:
        return self.home / STATE_FILE

    def ports(self) -> dict[str, int]:
        return {"mysql": self.mysql_port, "kafka": self.kafka_port, "s3": self.s3_port}


def read_state(home: Path) -> dict:
    path = home / STATE_FILE
    return json.loads(path.read_text()) if path.exists() else {}


def write_private(path: Path, text: str) -> None:
    """Replace `path` with `text`, readable by its owner only (0600) from the first byte on: the
    state file holds the MySQL passwords the jobs read."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # an older tmp file kept its mode
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.replace(tmp, path)


def load_or_create_secrets(settings: StackSettings) -> dict[str, str]:
    """Passwords generated once per state dir and kept there (mode 0600), never in source."""
    path = settings.secrets_file
    if path.exists():
        return json.loads(path.read_text())
    settings.home.mkdir(parents=True, exist_ok=True)
    values = {
        "mysql_app_password": secrets.token_urlsafe(18),
        "mysql_cdc_password": secrets.token_urlsafe(18),
        "s3_access_key": "lakehouse",
        "s3_secret_key": secrets.token_urlsafe(18),
    }
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(values, handle, indent=2)
    return values


def port_bindable(port: int) -> bool:
    """Whether a server could bind `port` on 127.0.0.1 right now."""
    import socket

    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def object_store_ports(base: int) -> list[int]:
    """The ports SeaweedFS binds for S3 port `base`: the block from it, and gRPC's (+ 10000; `weed
    mini` listens on base + 10000 to base + 10004: the whole block's are reserved)."""
    own = [base + i for i in range(S3_PORT_SPAN)]
    return own + [port + 10_000 for port in own]


# Below the kernel's ephemeral range (32768-60999 here), so no outgoing connection is handed a port
# between the pick and the server's bind; SeaweedFS's gRPC ports (+ 10000) stay below it too.
_BLOCK_BASES = range(12_000, 22_000 - S3_PORT_SPAN)
_SINGLE_PORTS = range(12_000, 32_000)


def free_stack_ports() -> tuple[int, int, int]:
    """(MariaDB, broker, SeaweedFS base) ports that are free now, overlap neither each other nor
    the default stack's (which may be started later). SeaweedFS's block is picked first and the two
    single ports outside it: picked apart, the broker was once handed 41005, inside the block at
    41000, and the stack failed to start."""
    taken = {DEFAULT_PORTS["mysql"], DEFAULT_PORTS["kafka"], *object_store_ports(DEFAULT_PORTS["s3"])}

    def free(ports: list[int]) -> bool:
        return all(port not in taken and port_bindable(port) for port in ports)

    s3 = _pick_at_random(_BLOCK_BASES, lambda base: free(object_store_ports(base)), "SeaweedFS port block")
    taken.update(object_store_ports(s3))
    mysql = _pick_at_random(_SINGLE_PORTS, lambda port: free([port]), "local port")
    taken.add(mysql)
    kafka = _pick_at_random(_SINGLE_PORTS, lambda port: free([port]), "local port")
    return mysql, kafka, s3


def _pick_at_random(candidates: range, fits: Callable[[int], bool], what: str) -> int:
    import random

    for _ in range(200):
        choice = random.choice(candidates)
        if fits(choice):
            return choice
    raise RuntimeError(f"no free {what}")
