"""The CDC fuzzer (tests/cdc_fuzz.py), bounded and derandomized: `make test` runs a few sequences;
`make fuzz` (CDC_FUZZ_EXAMPLES, CDC_FUZZ_STEPS) runs many, with fresh randomness."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import cdc_fuzz
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test
from support import LAKEHOUSE_BIN, REPO
from test_cdc_sync import catch_up, fresh_source_database

from jobs.cdc.sync import CdcSync
from jobs.cdc.table_selection import TableSelection

EXAMPLES = int(os.environ.get("CDC_FUZZ_EXAMPLES", "4"))
STEPS = int(os.environ.get("CDC_FUZZ_STEPS", "16"))
FUZZING = "CDC_FUZZ_EXAMPLES" in os.environ  # `make fuzz`: fresh randomness, every run different
# Kills -9 of the job run as a process, per sequence (each costs a JVM start: `make fuzz` only).
KILLS = int(os.environ.get("CDC_FUZZ_KILLS", "0"))


def run_killed(server_id: int, when: str, seconds: float) -> str:
    """`lakehouse run cdc` over the fuzzer's database, killed -9 4 + 4 x `seconds` after it started
    (`when` "starting": its JVM, the snapshots of new tables) or `seconds` after its first batch
    ("applying": after the MERGE warm-ups; if no batch came within 30 s, then); says where."""
    job = subprocess.Popen(
        [LAKEHOUSE_BIN, "run", "cdc", "--include", f"{cdc_fuzz.DATABASE}.*", "--server-id", str(server_id),
         "--trigger-seconds", "0.5"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    lines: list[str] = []
    applying = threading.Event()

    def read() -> None:
        for line in job.stderr:
            lines.append(line.rstrip())
            if "cdc batch:" in line:
                applying.set()

    def tail() -> str:
        return "\n".join(lines[-30:])

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        if when == "applying":  # (nothing to apply: killed 30 s on, in its warm-up or idle)
            deadline = time.monotonic() + 30
            while not applying.wait(0.5) and time.monotonic() < deadline:
                assert job.poll() is None, "the job ended by itself:\n" + tail()
        time.sleep(seconds if when == "applying" else 4 + 4 * seconds)  # its JVM starts in about 8 s
        assert job.poll() is None, "the job ended by itself:\n" + tail()
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
        job.wait(60)
        reader.join(10)
    where = "after its first batch" if applying.is_set() else "before any batch"
    return f"killed {where}; its last line: {lines[-1][:160]}" if lines else "killed before it logged"


@pytest.mark.stack
@pytest.mark.timeout(3600 if FUZZING else 600)
def test_cdc_keeps_every_table_equal_to_its_source_or_says_why(spark, lake_config, local_stack):
    from lakehouse.local.mariadb import APP_USER, CDC_USER
    from lakehouse.local.settings import load_or_create_secrets

    secrets = load_or_create_secrets(local_stack.settings)

    def connect_app():
        return local_stack.mariadb.connect(APP_USER, secrets["mysql_app_password"])

    def connect_observer():  # reads the binlog's end too, as CDC's user may
        return local_stack.mariadb.connect(CDC_USER, secrets["mysql_cdc_password"])

    def make_sync(server_id: int, resync: tuple[str, ...] = ()) -> CdcSync:
        selection = TableSelection.from_args(lake_config, (), (f"{cdc_fuzz.DATABASE}.*",), ())
        return CdcSync(
            spark, lake_config, selection, server_id=server_id, snapshot_reader_process=False, resync=resync
        ).start()

    fresh_source_database(local_stack, cdc_fuzz.DATABASE)  # the grants outlive its DROP DATABASE
    machine = cdc_fuzz.cdc_machine(
        spark, lake_config, connect_app, connect_observer, catch_up, make_sync, run_killed, KILLS
    )
    cdc_fuzz.STATEMENTS.clear()
    cdc_fuzz.STOPPED.clear()
    cdc_fuzz.KEPT_COMPARED.clear()
    try:
        run_state_machine_as_test(
            machine,
            settings=settings(
                max_examples=EXAMPLES,
                stateful_step_count=STEPS,
                deadline=None,
                derandomize=not FUZZING,
                suppress_health_check=list(HealthCheck),
                print_blob=True,
            ),
            _min_steps=STEPS // 2,  # not only the short sequences a derandomized run starts with
        )
    finally:
        local_stack.mariadb.admin_sql(f"DROP DATABASE IF EXISTS {cdc_fuzz.DATABASE}")
        not_statements = ("quiet", "restart", "--resync", "crash", "kill -9")
        statements = sum(n for k, n in cdc_fuzz.STATEMENTS.items() if not k.startswith(not_statements))
        print(f"\ncdc fuzz: {EXAMPLES} sequences of up to {STEPS} steps, {statements} statements")
        for kind, count in sorted(cdc_fuzz.STATEMENTS.items()):
            print(f"  {count:5d}  {kind}")
        for reason, count in sorted(cdc_fuzz.STOPPED.items()):
            print(f"  stopped {count:3d}x: {reason}")
        for kept_as_of, count in sorted(cdc_fuzz.KEPT_COMPARED.items()):
            print(f"  dropped tables kept as of {kept_as_of}, equal to the source there: {count}")
    assert statements >= EXAMPLES  # every sequence ran statements, each ended at a checked quiet point
