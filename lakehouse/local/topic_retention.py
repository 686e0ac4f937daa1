"""Retention for the local click topic, which tansu does not have.

tansu keeps each produced batch as one object and lists a partition's objects from the oldest on
every fetch, so reads slow down with everything ever produced (issue 26: click latency p50 36 ms at
1.9k objects, 17 s at 9.5k). MSK expires records by age; here the lake is the durable copy of what
was read, so a batch may go once the ingest has committed every record of it to both the click
table and the rejects table (the lower of their stored offsets). The newest `keep_batches` of each
partition stay anyway, to read back what was sent recently. Unread records are never deleted: a
producer that runs while the ingest is stopped still piles batches up until the ingest catches up.

`python -m lakehouse.local.topic_retention --home H` runs it as a process of the local stack.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from jobs.common.lake_tables import FACT_TABLE, OFFSETS_KEY, REJECTS_TABLE, offsets_from_summary
from jobs.config import CLICK_TOPIC
from lakehouse.local.broker import batch_keys, watermark_key
from lakehouse.local.process import ManagedProcess
from lakehouse.local.settings import StackSettings

log = logging.getLogger("topic_retention")
MODULE = "lakehouse.local.topic_retention"  # what the stack runs (`python -m`)

# One S3 LIST page is 1,000 keys; a partition below that costs the broker one page per fetch.
KEEP_BATCHES = 500
INTERVAL_SECONDS = 2.0
_DELETE_PAGE = 1000  # S3 DeleteObjects takes at most 1,000 keys


@dataclass(frozen=True)
class RetentionSettings:
    topic: str = CLICK_TOPIC
    # The tables whose stored offsets (`lakehouse.kafka.offsets`) say what the lake has read.
    tables: tuple[str, ...] = (".".join(FACT_TABLE), ".".join(REJECTS_TABLE))
    keep_batches: int = KEEP_BATCHES
    interval_seconds: float = INTERVAL_SECONDS


def base_offset(key: str) -> int:
    """`.../records/00000000000000000042.batch` -> 42 (the offset of the batch's first record)."""
    return int(key.rsplit("/", 1)[1].split(".", 1)[0])


def expired_batches(keys: Iterable[str], read_up_to: int, keep: int) -> list[str]:
    """The batch keys whose every record lies below `read_up_to` (a batch ends where the next one
    begins), oldest first, leaving the newest `keep` batches in place."""
    ordered = sorted(keys, key=base_offset)
    deletable = len(ordered) - keep
    expired = []
    for key, following in zip(ordered, ordered[1:], strict=False):
        if len(expired) >= deletable or base_offset(following) > read_up_to:
            break
        expired.append(key)
    return expired


def lake_read_offsets(per_table: list[dict[int, int]]) -> dict[int, int]:
    """Per partition, the next offset every table has stored (the lowest of theirs). A partition
    one table has no offsets for is absent: nothing of it has surely been read."""
    if not per_table:
        return {}
    shared = set.intersection(*(set(offsets) for offsets in per_table))
    return {p: min(offsets[p] for offsets in per_table) for p in sorted(shared)}


def stored_offsets(catalog, table: str, topic: str) -> dict[int, int]:
    """The offsets the newest snapshot in the table's current history stored ({}: none, or no
    such table yet)."""
    from pyiceberg.exceptions import NoSuchTableError
    from pyiceberg.table.snapshots import ancestors_of

    try:
        loaded = catalog.load_table(table)
    except NoSuchTableError:
        return {}
    for snapshot in ancestors_of(loaded.current_snapshot(), loaded.metadata):
        value = snapshot.summary.additional_properties.get(OFFSETS_KEY) if snapshot.summary else None
        if value is not None:
            return offsets_from_summary(value, topic)
    return {}


def lake_reader(catalog, settings: RetentionSettings) -> Callable[[], dict[int, int]]:
    """What the lake has read of the topic, from `catalog`'s tables (see lake_read_offsets)."""
    return lambda: lake_read_offsets([stored_offsets(catalog, t, settings.topic) for t in settings.tables])


class TopicRetention:
    """Deletes the local topic's batches the lake has read (see the module docstring)."""

    def __init__(
        self, s3, bucket: str, lake_read: Callable[[], dict[int, int]], settings: RetentionSettings
    ) -> None:
        self.s3 = s3
        self.bucket = bucket
        self.lake_read = lake_read  # per partition, the next offset the lake has not read
        self.settings = settings
        self._done_up_to: dict[int, int] = {}  # per partition, the bound of the last full pass

    def run_once(self) -> dict[int, int]:
        """One pass: per partition, the number of batches deleted."""
        read = self.lake_read()
        deleted = {}
        for partition, read_up_to in read.items():
            if self._done_up_to.get(partition) == read_up_to:
                continue  # nothing was read since the last pass: no listing needed
            high = self._high_watermark(partition)
            if high is None or read_up_to > high:
                # The lake claims more than the topic ever held: the topic was recreated (the
                # ingest stops on that). Its new records are unread; leave them all.
                log.warning(
                    "%s[%d]: the lake stored offset %d but the topic's high watermark is %s; "
                    "deleting nothing (recreated topic?)",
                    self.settings.topic, partition, read_up_to, high,
                )  # fmt: skip
                continue
            keys = batch_keys(self.s3, self.bucket, self.settings.topic, partition)
            expired = expired_batches(keys, read_up_to, self.settings.keep_batches)
            self._delete(expired)
            self._done_up_to[partition] = read_up_to
            if expired:
                deleted[partition] = len(expired)
                log.info(
                    "%s[%d]: deleted %d batches below offset %d (read by the lake)",
                    self.settings.topic, partition, len(expired), read_up_to,
                )  # fmt: skip
        return deleted

    def run_until(self, stop: threading.Event, on_pass: Callable[[], None] = lambda: None) -> None:
        """A pass every interval until `stop`, `on_pass` after each that completed; a failed pass
        (store or catalog busy or down) is logged and retried at the next one."""
        failing = False
        while not stop.is_set():
            try:
                self.run_once()
                on_pass()
                if failing:
                    log.info("retention passes succeed again")
                failing = False
            except Exception as exc:  # noqa: BLE001 - keep running: the next pass may succeed
                if not failing:  # the whole story once, not every 2 s while the store is down
                    log.exception(
                        "retention pass failed; retrying every %.0fs", self.settings.interval_seconds
                    )
                else:
                    log.debug("retention pass failed again: %s", exc)
                failing = True
            stop.wait(self.settings.interval_seconds)

    def _high_watermark(self, partition: int) -> int | None:
        try:
            body = self.s3.get_object(Bucket=self.bucket, Key=watermark_key(self.settings.topic, partition))[
                "Body"
            ]
        except self.s3.exceptions.NoSuchKey:
            return None
        return json.loads(body.read()).get("high")

    def _delete(self, keys: list[str]) -> None:
        for start in range(0, len(keys), _DELETE_PAGE):
            page = [{"Key": key} for key in keys[start : start + _DELETE_PAGE]]
            response = self.s3.delete_objects(Bucket=self.bucket, Delete={"Objects": page, "Quiet": True})
            if response.get("Errors"):
                first = response["Errors"][0]
                raise RuntimeError(f"could not delete {first.get('Key')}: {first.get('Message')}")


# A running process that has not completed a pass for this long is failing (see its log); a new
# one gets as long for its first pass (imports, catalog open).
STALE_SECONDS = 30.0


def retention_state(running: bool, since_pass: float | None, since_start: float | None) -> str:
    """ "off" (no process), "up" (a pass completed lately, or it has only just started), or
    "failing" (running, but no pass completed for STALE_SECONDS)."""
    if not running:
        return "off"
    if since_pass is not None and since_pass <= STALE_SECONDS:
        return "up"
    if since_pass is None and since_start is not None and since_start <= STALE_SECONDS:
        return "up"
    return "failing"


class RetentionProcess:
    """The retention loop as a process of the local stack (pid file and log beside the others;
    a file touched after every completed pass, so status can tell running from working)."""

    def __init__(self, settings: StackSettings) -> None:
        self.settings = settings
        self.process = ManagedProcess("topic-retention", settings.run_dir, settings.log_dir, MODULE)
        self.last_pass_file = settings.run_dir / "topic-retention.last-pass"

    def start(self) -> None:
        """Start unless running. Not waited for: it needs nothing to be ready, nothing waits on it."""
        if not self.process.is_running():
            self.last_pass_file.unlink(missing_ok=True)
            self.process.start([sys.executable, "-m", MODULE, "--home", str(self.settings.home)])

    def stop(self) -> bool:
        return self.process.stop()

    def mark_pass(self) -> None:
        self.last_pass_file.touch()

    def describe(self, now: float) -> dict:
        running = self.process.is_running()
        since_pass = _age(self.last_pass_file, now)
        since_start = _age(self.process.pid_file, now)
        return {
            "running": running,
            "state": retention_state(running, since_pass, since_start),
            "seconds_since_pass": None if since_pass is None else round(since_pass, 1),
            "keep_batches": KEEP_BATCHES,
            "pid": self.process.pid(),
            "log": str(self.process.log_file),
        }


def _age(path: Path, now: float) -> float | None:
    try:
        return max(0.0, now - path.stat().st_mtime)
    except FileNotFoundError:
        return None


def main(argv: list[str] | None = None) -> int:
    from lakehouse.local.catalog import pyiceberg_catalog
    from lakehouse.local.object_store import BROKER_BUCKET
    from lakehouse.local.stack import LocalStack

    parser = argparse.ArgumentParser(prog="python -m lakehouse.local.topic_retention", description=__doc__)
    parser.add_argument("--home", type=Path, required=True, help="the local stack's state directory")
    parser.add_argument("--interval", type=float, default=INTERVAL_SECONDS, help="seconds between passes")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    stack = LocalStack(StackSettings.resolve(args.home))
    s3 = stack.object_store.client(stack.saved_secrets())
    catalog = pyiceberg_catalog(stack.settings.catalog_path, stack.settings.warehouse)
    # KEEP_BATCHES, fixed: `lakehouse local status` reports it.
    settings = RetentionSettings(interval_seconds=args.interval)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    log.info(
        "keeping the newest %d batches per partition of %s, and every unread one",
        settings.keep_batches,
        settings.topic,
    )
    retention = TopicRetention(s3, BROKER_BUCKET, lake_reader(catalog, settings), settings)
    retention.run_until(stop, on_pass=stack.retention.mark_pass)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
