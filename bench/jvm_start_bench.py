"""How long a local Spark job takes to start, with and without the JVM class archive `make setup`
builds (lakehouse/local/class_archive.py): a fresh process building its session, then running the
first Iceberg statements (DDL, insert, MERGE, aggregation, a maintenance procedure). Three runs each,
alternating, on a scratch catalog; no stack needed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RUNS = 3


def run() -> list[dict]:
    from jobs.common.spark_session import LOCAL_CLASS_ARCHIVE

    if not LOCAL_CLASS_ARCHIVE.is_file():
        raise SystemExit(f"no class archive at {LOCAL_CLASS_ARCHIVE}: run `make setup` first")
    rows = []
    for number in range(1, RUNS + 1):
        for archive in (False, True):
            with tempfile.TemporaryDirectory(prefix="jvm-start-") as scratch:
                command = [
                    sys.executable,
                    "-m",
                    "bench.jvm_start_bench",
                    scratch,
                    "with" if archive else "without",
                ]
                began = time.monotonic()
                result = subprocess.run(command, capture_output=True, text=True, timeout=300, check=True)
                took = time.monotonic() - began
            timings = json.loads(result.stdout.strip().splitlines()[-1])
            rows.append(
                {
                    "class archive": "with" if archive else "without",
                    "run": number,
                    "session (s)": f"{timings['session']:.1f}",
                    "first statements (s)": f"{timings['statements']:.1f}",
                    "process (s)": f"{took:.1f}",
                }
            )
    return rows


def _child(scratch: str, archive: str) -> None:
    began = time.monotonic()
    from jobs.common.spark_session import (
        LOCAL_CLASS_ARCHIVE,
        LOCAL_DRIVER_JAVA_OPTIONS,
        class_archive_options,
    )
    from lakehouse.local.class_archive import exercise, scratch_session

    options = (
        LOCAL_DRIVER_JAVA_OPTIONS,
        *(class_archive_options(LOCAL_CLASS_ARCHIVE) if archive == "with" else ()),
    )
    spark = scratch_session(Path(scratch), " ".join(options))
    session = time.monotonic()
    exercise(spark)
    statements = time.monotonic()
    spark.stop()
    print(json.dumps({"session": session - began, "statements": statements - session}))


if __name__ == "__main__":
    _child(*sys.argv[1:3])
