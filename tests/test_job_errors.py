"""Bad inputs a user gives the jobs: one clear `error:` line each, a non-zero exit, no traceback,
and nothing written to the lake (the catalog's table pointers are compared before and after)."""

from __future__ import annotations

import json
import sqlite3

import pytest
from support import run_cli


def assert_one_clear_error(result, *expected: str) -> str:
    """The run failed with exactly one `error:` line and no traceback; returns that line."""
    assert result.returncode != 0, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, result.stderr
    for text in expected:
        assert text in errors[0], errors[0]
    return errors[0]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["run", "ingest", "--trigger-seconds", "soon"], "invalid float value: 'soon'"),
        (["run", "cdc", "--server-id", "x1"], "invalid int value: 'x1'"),
        (["run", "streaming", "--jobs", "cdc,clicks"], "--jobs 'cdc,clicks'"),
        (["run", "views", "--max-seconds", "-"], "--max-seconds"),
        (["run", "maintain", "--retain-hours"], "--retain-hours: expected one argument"),
        (["gendata", "--count", "ten"], "invalid int value: 'ten'"),
    ],
)
def test_a_malformed_argument_is_one_error_line_with_exit_2(args: list[str], expected: str) -> None:
    result = run_cli(*args, check=False, timeout=60)
    line = assert_one_clear_error(result, expected, "(see --help)")
    assert result.returncode == 2, line
    assert "usage:" not in result.stderr


def catalog_pointers(catalog_path) -> list[tuple]:
    with sqlite3.connect(catalog_path) as conn:
        return sorted(conn.execute("SELECT * FROM iceberg_tables").fetchall())


def home_with(local_stack, tmp_path, change) -> str:
    """A state dir whose stack.json is the test stack's with one value changed: the job finds the
    real catalog and warehouse, and the bad value."""
    state = json.loads((local_stack.settings.home / "stack.json").read_text())
    change(state)
    (tmp_path / "stack.json").write_text(json.dumps(state))
    return str(tmp_path)


@pytest.mark.stack
def test_an_unreachable_broker_stops_the_ingest_before_it_writes(local_stack, tmp_path) -> None:
    home = home_with(local_stack, tmp_path, lambda s: s["kafka"].update(bootstrap="127.0.0.1:1"))
    before = catalog_pointers(local_stack.settings.catalog_path)
    result = run_cli(
        "run",
        "ingest",
        "--home",
        home,
        "--until-idle",
        "--fact-table",
        "lakehouse.ods_behavior.never_created",
        check=False,
        timeout=120,
    )
    assert_one_clear_error(result, "Kafka at 127.0.0.1:1", "Nothing was written")
    assert result.returncode == 2
    assert catalog_pointers(local_stack.settings.catalog_path) == before


@pytest.mark.stack
def test_a_missing_topic_stops_the_ingest_before_it_writes(local_stack) -> None:
    before = catalog_pointers(local_stack.settings.catalog_path)
    result = run_cli("run", "ingest", "--topic", "no_such_topic", "--until-idle", check=False, timeout=120)
    assert_one_clear_error(result, "'no_such_topic'", "Unknown topic")
    assert catalog_pointers(local_stack.settings.catalog_path) == before


@pytest.mark.stack
def test_a_wrong_cdc_password_is_refused_at_once_and_not_retried(local_stack, tmp_path) -> None:
    home = home_with(local_stack, tmp_path, lambda s: s["mysql"].update(cdc_password="not-the-password"))
    before = catalog_pointers(local_stack.settings.catalog_path)
    denied_before = access_denied_errors(local_stack)
    result = run_cli("run", "cdc", "--home", home, "--until-idle", check=False, timeout=180)
    assert_one_clear_error(result, "refused user 'lakehouse_cdc'", "Access denied")
    assert result.returncode == 2
    # One attempt, not retried: the server refused exactly one login.
    assert access_denied_errors(local_stack) - denied_before == 1
    assert catalog_pointers(local_stack.settings.catalog_path) == before


def access_denied_errors(local_stack) -> int:
    """MariaDB's count of refused logins since it started."""
    line = local_stack.mariadb.admin_sql("SHOW GLOBAL STATUS LIKE 'Access_denied_errors'")
    return int(line.split()[1])
