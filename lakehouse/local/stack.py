"""The embedded local stack: MariaDB, SeaweedFS + tansu broker, and the SQLite Iceberg catalog."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from jobs.config import CATALOG_NAME, CLICK_TOPIC, SOURCE_DATABASE
from lakehouse.local import catalog
from lakehouse.local.broker import Broker
from lakehouse.local.mariadb import APP_USER, CDC_USER, MariaDb
from lakehouse.local.object_store import ObjectStore
from lakehouse.local.process import StackError, port_in_use
from lakehouse.local.settings import PORT_ENV, StackSettings, load_or_create_secrets, write_private
from lakehouse.local.topic_retention import RetentionProcess

Progress = Callable[[str], None]


class LocalStack:
    def __init__(self, settings: StackSettings) -> None:
        self.settings = settings
        self.mariadb = MariaDb(settings)
        self.object_store = ObjectStore(settings)
        self.broker = Broker(settings, self.object_store)
        self.retention = RetentionProcess(settings)

    # ---- lifecycle ----------------------------------------------------------------------------

    def up(self, progress: Progress = lambda _: None, topic_retention: bool | None = None) -> dict:
        """Start whatever is not running; a second call changes nothing. `topic_retention` False:
        the broker keeps every batch (replayable; reads slow down, see topic_retention.py); None:
        as the last `up` that chose (default on), so the demo does not undo `up --keep-topic`."""
        self._check_ports()
        keep_topic_marker = self.settings.run_dir / "keep-topic"
        if topic_retention is None:
            topic_retention = not keep_topic_marker.exists()
        elif topic_retention:
            keep_topic_marker.unlink(missing_ok=True)
        else:
            keep_topic_marker.parent.mkdir(parents=True, exist_ok=True)
            keep_topic_marker.touch()
        secrets = load_or_create_secrets(self.settings)
        steps = [
            ("mariadb", lambda: self.mariadb.start(secrets)),
            ("seaweedfs", lambda: self.object_store.start(secrets)),
            ("tansu", lambda: self.broker.start(secrets)),
            ("catalog", lambda: catalog.ensure_catalog(self.settings.catalog_path, self.settings.warehouse)),
        ]
        if topic_retention:  # after the catalog: it reads the tables' stored offsets
            steps.append(("topic retention", self.retention.start))
        elif self.retention.stop():
            progress("topic retention stopped")
        for name, start in steps:
            began = time.monotonic()
            start()
            progress(f"{name} ready ({time.monotonic() - began:.1f}s)")
        self.settings.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        state = self.describe(secrets)
        write_private(self.settings.state_file, json.dumps(state, indent=2))
        return state

    def _check_ports(self) -> None:
        """A port that someone else holds gives a clear error naming the env var to change."""
        wanted = [
            ("mysql", self.mariadb.process, [self.settings.mysql_port]),
            ("kafka", self.broker.process, [self.settings.kafka_port]),
            ("s3", self.object_store.process, self.object_store.ports()),
        ]
        for part, process, ports in wanted:
            if process.is_running():
                continue
            for port in ports:
                if port_in_use(port):
                    raise StackError(
                        f"port {port} ({part}) is already in use by another process. "
                        f"Stop that process or choose other ports, e.g. "
                        f"`export {PORT_ENV[part]}=<free port>` and run `lakehouse local up` again."
                    )

    def down(self, purge: bool = False, progress: Progress = lambda _: None) -> None:
        """Stop the project's own processes (broker first, the store it writes to last)."""
        for name, stop in (
            ("topic retention", self.retention.stop),
            ("tansu", self.broker.stop),
            ("seaweedfs", self.object_store.stop),
            ("mariadb", self.mariadb.stop),
        ):
            progress(f"{name} {'stopped' if stop() else 'was not running'}")
        if purge and self.settings.home.exists():
            shutil.rmtree(self.settings.home)
            progress(f"removed {self.settings.home}")

    # ---- status -------------------------------------------------------------------------------

    def saved_secrets(self) -> dict[str, str]:
        """The passwords of the first `up` ({} before it)."""
        path = self.settings.secrets_file
        return json.loads(path.read_text()) if path.exists() else {}

    def describe(self, secrets: dict[str, str] | None = None) -> dict:
        """The status document, passwords included: the state file (mode 0600) holds it for the
        jobs; `lakehouse local status --json` prints it with `redact_passwords`."""
        if secrets is None:
            secrets = self.saved_secrets()
        s = self.settings
        parts = {
            "mysql": bool(secrets) and self.mariadb.healthy(secrets),
            "s3": self.object_store.healthy(),
            "kafka": self.broker.healthy(),
            "catalog": s.catalog_path.exists()
            and set(catalog.namespaces(s.catalog_path)) >= {"dim_db", "ods_behavior", "ads_behavior"},
        }
        return {
            "mysql": {
                "host": s.host,
                "port": s.mysql_port,
                "user": APP_USER,
                "password": secrets.get("mysql_app_password"),
                "database": SOURCE_DATABASE,
                "cdc_user": CDC_USER,
                "cdc_password": secrets.get("mysql_cdc_password"),
                # The CA that signed MariaDB's certificate: clients verify the server against it.
                "ssl_ca": str(self.mariadb.tls_dir / "ca.pem"),
                "healthy": parts["mysql"],
                "pid": self.mariadb.process.pid(),
                "log": str(s.log_dir / "mariadb-error.log"),
            },
            "kafka": {
                "bootstrap": f"{s.host}:{s.kafka_port}",
                "topic": CLICK_TOPIC,
                "healthy": parts["kafka"],
                "pid": self.broker.process.pid(),
                "log": str(self.broker.process.log_file),
            },
            "s3": {
                "endpoint": self.object_store.endpoint,
                "healthy": parts["s3"],
                "pid": self.object_store.process.pid(),
                "log": str(self.object_store.process.log_file),
            },
            # Optional: without it the stack works, and reads slow down as batches pile up.
            "topic_retention": self.retention.describe(time.time()),
            "catalog": {
                "name": CATALOG_NAME,
                "uri": f"sqlite:///{s.catalog_path}",
                "warehouse": str(s.warehouse),
                "sqlite_path": str(s.catalog_path),
                "healthy": parts["catalog"],
            },
            "home": str(s.home),
            "checkpoint_dir": str(s.checkpoint_dir),
            "ports": s.ports(),
            "healthy": all(parts.values()),
        }

    def status(self) -> dict:
        return self.describe()


def require_running(settings: StackSettings) -> None:
    """Fail fast with the fix when a job is started against a stack that is down."""
    state = LocalStack(settings).status()
    down = [part for part in ("mysql", "kafka", "catalog") if not state[part]["healthy"]]
    if down:
        raise StackError(f"local stack is not running ({', '.join(down)} down): run `lakehouse local up`")


PASSWORD_KEYS = ("password", "cdc_password")


def redact_passwords(state: dict, state_file: Path) -> dict:
    """`state` with the MySQL passwords replaced by where they are kept (a status printed to a
    terminal or a CI log must not carry them)."""
    mysql = dict(state["mysql"])
    for key in PASSWORD_KEYS:
        if mysql.get(key):
            mysql[key] = f"<redacted: in {state_file} (mode 0600), or status --show-secrets>"
    return {**state, "mysql": mysql}
