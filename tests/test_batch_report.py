"""The daily member-level report: the pure transform on in-memory frames, and the job against real
Iceberg tables in the session's local catalog (its own source and report tables, so it never touches
the real dimensions other tests use).

The expected numbers below are worked out by hand from the dataset, never computed from it.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest
from support import run_cli

from jobs.common.lake_tables import fact_table_ddl, products_table_ddl
from jobs.report.__main__ import main, parse_args, settings_from_args
from jobs.report.job import (
    REPORT_COLUMNS,
    MissingSourceTable,
    ReportSettings,
    member_daily_report,
    run_report,
)

pytestmark = pytest.mark.stack

DAY = date(2024, 5, 1)
OTHER_DAY = date(2024, 4, 30)
CLICKS_TABLE = "lakehouse.ods_behavior.report_test_clicks"
MEMBERS_TABLE = "lakehouse.dim_db.report_test_members"
PRODUCTS_TABLE = "lakehouse.dim_db.report_test_products"
REPORT_TABLE = "lakehouse.ads_behavior.report_test_daily"
CLI_REPORT_TABLE = "lakehouse.ads_behavior.report_test_daily_cli"


def at(day: date, hh: int = 0, mm: int = 0, ss: int = 0, us: int = 0) -> datetime:
    return datetime(day.year, day.month, day.day, hh, mm, ss, us, tzinfo=UTC)


UPDATED = at(date(2024, 1, 1))
MEMBERS = [  # userid, memberLevel; ux and uy are unknown users
    ("u1", 1),
    ("u2", 1),
    ("u3", 2),
    ("u4", 3),  # no clicks: level 3 must not appear
]
PRODUCTS = [  # productId, current price; p9 is an unknown product
    ("p1", Decimal("1.5000")),
    ("p2", Decimal("2.2500")),
    ("p3", None),  # known, without a price
]
CLICKS = [  # uid, productId, cookieId, expendTime, eventTime
    ("u1", "p1", "c1", 10, at(DAY)),  # first instant of the day: included
    ("u1", "p2", "c1", 20, at(DAY, 12)),
    ("u1", "p1", "c9", 5, at(DAY, 13)),
    ("u2", "p1", "c2", 30, at(DAY, 23, 59, 59, 999999)),  # last instant: included
    ("u3", "p9", "c3", 40, at(DAY, 8)),  # unknown product: no value, unpriced
    ("u3", "p3", "c3", 60, at(DAY, 9)),  # product without a price: no value, unpriced
    ("ux", "p2", "c4", 50, at(DAY, 10)),  # unknown user -> null level
    ("uy", "p1", "c4", 70, at(DAY, 11)),  # unknown user, same cookie as ux
    ("u1", "p1", "c1", 1000, at(OTHER_DAY, 23, 59, 59, 999999)),  # the day before: excluded
    ("u3", "p1", "c3", 7, at(OTHER_DAY, 12)),  # the day before: excluded
    ("u2", "p2", "c2", 2000, at(DAY + timedelta(days=1))),  # the day after: excluded
]

# (memberLevel, events, distinct_users, distinct_cookies, total_expend_time, avg_expend_time,
#  view_value, unpriced_events)
EXPECTED_DAY = [
    (1, 4, 2, 3, 65, 16.25, Decimal("6.7500"), 0),  # 1.5 + 2.25 + 1.5 + 1.5
    (2, 2, 1, 1, 100, 50.0, Decimal("0.0000"), 2),
    (None, 2, 2, 1, 120, 60.0, Decimal("3.7500"), 0),  # 2.25 + 1.5
]
EXPECTED_OTHER_DAY = [
    (1, 1, 1, 1, 1000, 1000.0, Decimal("1.5000"), 0),
    (2, 1, 1, 1, 7, 7.0, Decimal("1.5000"), 0),
]


def by_level(rows: list[tuple]) -> list[tuple]:
    return sorted(rows, key=lambda r: (r[0] is None, r[0] or 0))


def report_rows(frame, day: date) -> list[tuple]:
    """The report's figures for `day` (generated_at left out: it is the run's time)."""
    rows = frame.where(frame.report_date == day).collect()
    return by_level([tuple(r[c] for c in REPORT_COLUMNS[1:-1]) for r in rows])


def stored(spark, day: date, table: str = REPORT_TABLE) -> list[tuple]:
    return report_rows(spark.table(table), day)


# ---- the pure transform ------------------------------------------------------------------------------


def test_member_daily_report_on_in_memory_frames(spark) -> None:
    clicks = spark.createDataFrame(
        CLICKS, "uid string, productId string, cookieId string, expendTime int, eventTime timestamp"
    )
    # Stale duplicates (older update_time) must neither win nor multiply the clicks.
    members = spark.createDataFrame(
        [(uid, level, UPDATED) for uid, level in MEMBERS] + [("u3", 1, at(date(2023, 1, 1)))],
        "userid string, memberLevel int, update_time timestamp",
    )
    products = spark.createDataFrame(
        [(pid, price, UPDATED) for pid, price in PRODUCTS] + [("p1", Decimal("99.0000"), None)],
        "productId string, product_price decimal(10,4), update_time timestamp",
    )

    report = member_daily_report(clicks, members, products, DAY)

    assert report.columns == list(REPORT_COLUMNS)
    types = {f.name: f.dataType.simpleString() for f in report.schema}
    assert types["memberLevel"] == "int"
    assert types["events"] == types["distinct_users"] == types["total_expend_time"] == "bigint"
    assert types["avg_expend_time"] == "double"
    assert types["view_value"] == "decimal(20,4)"
    assert report_rows(report, DAY) == EXPECTED_DAY
    assert report_rows(member_daily_report(clicks, members, products, OTHER_DAY), OTHER_DAY) == (
        EXPECTED_OTHER_DAY
    )
    assert member_daily_report(clicks, members, products, date(2024, 6, 1)).count() == 0


# ---- the job against Iceberg tables ----------------------------------------------------------------


@pytest.fixture
def sources(spark) -> ReportSettings:
    """Fresh source tables holding the dataset, and an empty report table."""
    for table in (CLICKS_TABLE, MEMBERS_TABLE, PRODUCTS_TABLE, REPORT_TABLE):
        spark.sql(f"DROP TABLE IF EXISTS {table}")
    for statement in fact_table_ddl(CLICKS_TABLE) + products_table_ddl(PRODUCTS_TABLE):
        spark.sql(statement)
    spark.sql(
        f"""CREATE TABLE {MEMBERS_TABLE} (userid string NOT NULL, name string, show_params string,
                                        memberLevel int, update_time timestamp)
            USING iceberg TBLPROPERTIES ('format-version'='2')"""
    )
    fact_schema = spark.table(CLICKS_TABLE).schema
    fact_rows = [
        (1, uid, pid, cookie, expend, when, None, None, when.strftime("%Y%m%d"), 0, offset, when)
        for offset, (uid, pid, cookie, expend, when) in enumerate(CLICKS)
    ]
    spark.createDataFrame(fact_rows, fact_schema).writeTo(CLICKS_TABLE).append()
    spark.createDataFrame(
        [(uid, f"name-{uid}", None, level, UPDATED) for uid, level in MEMBERS],
        spark.table(MEMBERS_TABLE).schema,
    ).writeTo(MEMBERS_TABLE).append()
    spark.createDataFrame(
        [(pid, f"name-{pid}", None, price, UPDATED) for pid, price in PRODUCTS],
        spark.table(PRODUCTS_TABLE).schema,
    ).writeTo(PRODUCTS_TABLE).append()
    return ReportSettings(DAY, CLICKS_TABLE, MEMBERS_TABLE, PRODUCTS_TABLE, REPORT_TABLE)


def test_report_is_written_and_a_rerun_replaces_only_its_day(spark, sources: ReportSettings) -> None:
    other = replace(sources, day=OTHER_DAY)
    # The day is read as an eventTime range pushed into the Iceberg scan (prunes to its partition).
    plan = (
        member_daily_report(
            spark.table(CLICKS_TABLE), spark.table(MEMBERS_TABLE), spark.table(PRODUCTS_TABLE), DAY
        )
        ._jdf.queryExecution()
        .executedPlan()
        .toString()
    )
    day_start_us = 1714521600 * 1_000_000  # 2024-05-01T00:00:00Z
    assert f"eventTime >= {day_start_us}, eventTime < {day_start_us + 86_400_000_000}" in plan

    result = run_report(spark, sources)
    run_report(spark, other)

    assert by_level([tuple(r[c] for c in REPORT_COLUMNS[1:-1]) for r in result.rows]) == EXPECTED_DAY
    assert stored(spark, DAY) == EXPECTED_DAY
    assert stored(spark, OTHER_DAY) == EXPECTED_OTHER_DAY
    spec = spark.sql(f"SELECT * FROM {REPORT_TABLE}.partitions").schema["partition"].dataType
    assert spec.fieldNames() == ["report_date"]
    assert dict(spark.sql(f"SHOW TBLPROPERTIES {REPORT_TABLE}").collect())["format-version"] == "2"
    other_day_before = spark.table(REPORT_TABLE).where(f"report_date = '{OTHER_DAY}'").collect()

    # Same inputs, run again: the same rows, no duplicates.
    run_report(spark, sources)
    assert stored(spark, DAY) == EXPECTED_DAY

    # The current dimension counts: u3 moved to level 1, so level 2 has no clicks left and its
    # stale row must go.
    spark.sql(f"UPDATE {MEMBERS_TABLE} SET memberLevel = 1 WHERE userid = 'u3'")
    run_report(spark, sources)
    assert stored(spark, DAY) == [
        (1, 6, 3, 4, 165, 27.5, Decimal("6.7500"), 2),
        (None, 2, 2, 1, 120, 60.0, Decimal("3.7500"), 0),
    ]

    # No clicks at all for the day: the day's rows are cleared.
    spark.sql(f"DELETE FROM {CLICKS_TABLE} WHERE dt = '{DAY:%Y%m%d}'")
    assert run_report(spark, sources).rows == []
    assert stored(spark, DAY) == []

    # The other day was never rewritten (same generated_at).
    assert spark.table(REPORT_TABLE).where(f"report_date = '{OTHER_DAY}'").collect() == other_day_before


def test_missing_source_table_names_the_job_to_run(spark, sources: ReportSettings) -> None:
    missing_clicks = ReportSettings(
        DAY, "lakehouse.ods_behavior.report_test_nope", MEMBERS_TABLE, PRODUCTS_TABLE, REPORT_TABLE
    )
    with pytest.raises(
        MissingSourceTable, match=r"report_test_nope does not exist: run `lakehouse run ingest`"
    ):
        run_report(spark, missing_clicks)
    missing_dims = ReportSettings(
        DAY,
        CLICKS_TABLE,
        "lakehouse.dim_db.report_test_nope",
        "lakehouse.dim_db.report_test_nada",
        REPORT_TABLE,
    )
    with pytest.raises(MissingSourceTable, match=r"report_test_nada does not exist: run `lakehouse run cdc`"):
        run_report(spark, missing_dims)


def test_cli_writes_and_prints_the_day(spark, sources: ReportSettings) -> None:
    spark.sql(f"DROP TABLE IF EXISTS {CLI_REPORT_TABLE}")
    result = run_cli(
        "run",
        "report",
        "--date",
        DAY.isoformat(),
        "--clicks-table",
        CLICKS_TABLE,
        "--members-table",
        MEMBERS_TABLE,
        "--products-table",
        PRODUCTS_TABLE,
        "--report-table",
        CLI_REPORT_TABLE,
    )
    assert stored(spark, DAY, CLI_REPORT_TABLE) == EXPECTED_DAY
    assert "member daily report 2024-05-01" in result.stdout
    assert "6.7500" in result.stdout and "null" in result.stdout
    assert f"report 2024-05-01: wrote 3 rows (8 events) to {CLI_REPORT_TABLE}" in result.stderr

    missing = run_cli(
        "run", "report", "--clicks-table", "lakehouse.ods_behavior.report_test_nope", check=False
    )
    assert missing.returncode == 2, missing.stderr
    assert "does not exist: run `lakehouse run ingest` first" in missing.stderr
    assert "Traceback" not in missing.stderr and missing.stderr.count("error:") == 1, missing.stderr


# ---- arguments ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["2024-13-01", "2024-02-30", "20240501", "2024-5-1", "yesterday"])
def test_bad_date_exits_2_with_a_clear_message(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--date", value])
    assert exited.value.code == 2
    assert f"argument --date: {value!r} is not a" in capsys.readouterr().err


def test_date_defaults_to_today_in_utc(lake_config) -> None:
    before = datetime.now(UTC).date()
    day = settings_from_args(parse_args([]), lake_config).day
    assert before <= day <= datetime.now(UTC).date()
