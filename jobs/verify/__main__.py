"""Job `verify`: reconcile every table with its source; exit 0 all match, 1 a mismatch, 2 cannot run.

Checks (each reads pinned snapshots, so the jobs may keep running meanwhile):
  kafka -> clicks     every offset the ingest stored is in clickevent or its rejects, exactly once
  mysql -> dimension  each CDC table equals its MySQL table (changes in flight explained by the binlog)
  clicks -> views     product_views equals the GROUP BY of the clicks up to its watermark
Each mismatch comes with a hint; with --repair, the clicks' and dimensions' findings are repaired
(clicks_repair.py, repair.py) and checked again.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Sequence

from jobs.common.job_args import (
    JobArgumentParser,
    add_environment_args,
    config_from_args,
    reports_config_errors,
)
from jobs.config import ConfigError, LakehouseConfig
from jobs.verify.findings import (
    CheckResult,
    as_json,
    exit_code,
    guarded,
    metric_data,
    redacted,
    render,
    timed,
)

log = logging.getLogger("verify")

VERIFY_SERVER_ID = 4290  # its own binlog reader beside CDC's (4201)
CLICKS, VIEWS = "ods_behavior.clickevent", "ads_behavior.product_views"
# Every run's full findings, as JSON, beside the tables: the lake's read guard covers them (the EMR
# logs bucket, where the step's stdout goes, has none), and `lakehouse verify` prints the path.
FINDINGS_FOLDER = "_lakehouse/verify"


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = JobArgumentParser(prog="lakehouse verify", description=__doc__.strip().splitlines()[0])
    add_environment_args(parser)
    parser.add_argument(
        "--tables",
        action="append",
        default=[],
        metavar="TABLE[,TABLE]",
        help=f"only these: {CLICKS} (the Kafka check), {VIEWS}, dim_db.<table> (default: all)",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument(
        "--repair",
        action="store_true",
        help="repair what the click and dimension checks find (missing offsets read again from the "
        "topic, duplicates removed; the differing keys, from the source), beside the running ingest and "
        "CDC, then check again; views are not repaired (their hint says how)",
    )
    parser.add_argument(
        "--server-id",
        type=int,
        default=VERIFY_SERVER_ID,
        help=f"replication client id of verify's binlog reader (default {VERIFY_SERVER_ID}; one per reader)",
    )
    args = parser.parse_args(list(argv))
    args.tables = [t.strip() for group in args.tables for t in group.split(",") if t.strip()]
    return args


def _wanted(tables: list[str], name: str) -> bool:
    short = name.split(".")[-1]
    return not tables or any(t in (name, short, f"lakehouse.{name}") for t in tables)


def click_tables(config: LakehouseConfig):
    from jobs.common.lake_tables import FACT_TABLE, PRODUCTS_TABLE, REJECTS_TABLE, VIEWS_TABLE
    from jobs.verify.clicks_repair import ClickTables

    return ClickTables(
        fact=config.table(*FACT_TABLE),
        rejects=config.table(*REJECTS_TABLE),
        views=config.table(*VIEWS_TABLE),
        products=config.table(*PRODUCTS_TABLE),
        topic=config.kafka.topic,
    )


def repaired_clicks(spark, config: LakehouseConfig) -> CheckResult:
    """The click check with its repair (`repair_rounds`); a repair that mended nothing ends it: what
    remains is not repairable here (its notes say why)."""
    from jobs.common.kafka_client import kafka_client_config
    from jobs.verify.clicks_repair import repair_clicks

    def repair(plan) -> tuple[str, int]:
        outcome = repair_clicks(spark, plan, click_tables(config), lambda: kafka_client_config(config.kafka))
        return outcome.note(), outcome.rows

    return repair_rounds(lambda repairs: verify_clicks(spark, config, repairs), repair, stop_at_nothing=True)


def repair_rounds(check, repair, stop_at_nothing: bool = False) -> CheckResult:
    """Check, repair what is wrong, check again (`repair.ROUNDS` checks at most): the result of the
    last check, with what was repaired in its notes. `check(repairs)` appends its repair plan to
    `repairs` (None: the last check, plan nothing); `repair(plan)` returns (its note, how many keys
    or rows it repaired). `stop_at_nothing`: a repair of nothing ends the rounds."""
    from jobs.verify.repair import ROUNDS

    began, done, repaired = time.monotonic(), [], 0
    for round_ in range(ROUNDS):
        repairs: list = []
        result = check(repairs if round_ < ROUNDS - 1 else None)
        if not repairs:
            break
        (plan,) = repairs
        try:
            note, count = repair(plan)
        except Exception as exc:  # noqa: BLE001 - the findings stand; the repair says why it failed
            result.notes.append(f"repair failed: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}")
            break
        done.append(note)
        repaired += count
        if stop_at_nothing and not count:
            break
    result.notes = [*done, *result.notes]
    result.repaired = repaired
    result.seconds = round(time.monotonic() - began, 2)
    return result


def verify_clicks(spark, config: LakehouseConfig, repairs: list | None = None) -> CheckResult:
    from jobs.common.kafka_client import kafka_client_config
    from jobs.common.lake_tables import (
        FACT_TABLE,
        OFFSETS_KEY,
        REJECTS_TABLE,
        load_iceberg_table,
        offsets_from_summary,
    )
    from jobs.common.snapshot_progress import main_snapshot, progress_as_of
    from jobs.ingest.kafka_source import BrokerUnavailable, TopicMetadata
    from jobs.verify.clicks import check_clicks, lost_ranges

    fact_table, rejects_table = config.table(*FACT_TABLE), config.table(*REJECTS_TABLE)
    if not spark.catalog.tableExists(fact_table):
        return CheckResult("kafka -> clicks", CLICKS, error=f"{fact_table} does not exist: run the ingest")

    def pinned(table: str):
        snapshot = main_snapshot(spark, table)
        if snapshot is None:
            return None, {}
        stored = offsets_from_summary(progress_as_of(spark, table, snapshot, OFFSETS_KEY), config.kafka.topic)
        return spark.sql(f"SELECT * FROM {table} VERSION AS OF {snapshot}"), stored

    fact, fact_stored = pinned(fact_table)
    has_rejects = spark.catalog.tableExists(rejects_table)
    rejects, rejects_stored = pinned(rejects_table) if has_rejects else (None, {})
    if fact is None:
        return CheckResult("kafka -> clicks", CLICKS, notes=["the click table is empty"])
    metadata = TopicMetadata(lambda: kafka_client_config(config.kafka))
    try:
        earliest = {
            p: metadata.earliest_offset(config.kafka.topic, p) for p in set(fact_stored) | set(rejects_stored)
        }
    except BrokerUnavailable as exc:
        return CheckResult("kafka -> clicks", CLICKS, error=f"Kafka cannot tell what the topic holds: {exc}")
    finally:
        metadata.close()
    properties = dict(load_iceberg_table(spark, fact_table).properties())
    accepted = lost_ranges(properties, config.kafka.topic)
    return check_clicks(
        spark, fact, rejects, fact_stored, rejects_stored, earliest, CLICKS, accepted, repairs
    )


def verify_views(spark, config: LakehouseConfig) -> CheckResult:
    from jobs.common.lake_tables import FACT_TABLE, VIEWS_TABLE
    from jobs.common.progress_keys import VIEWS_CLICK_OFFSETS, VIEWS_CLICKS_SNAPSHOT
    from jobs.common.snapshot_progress import main_snapshot, progress_as_of, progress_summary_as_of
    from jobs.verify.views import check_views
    from jobs.views.job import watermark_from_summary

    views_table, fact_table = config.table(*VIEWS_TABLE), config.table(*FACT_TABLE)
    if not spark.catalog.tableExists(views_table) or not spark.catalog.tableExists(fact_table):
        return CheckResult("clicks -> views", VIEWS, error="the view or the click table does not exist yet")
    snapshot = main_snapshot(spark, views_table)
    if snapshot is None:
        return CheckResult("clicks -> views", VIEWS, notes=["the view is empty"])
    _, watermark = watermark_from_summary(progress_as_of(spark, views_table, snapshot, VIEWS_CLICK_OFFSETS))
    views = spark.sql(f"SELECT * FROM {views_table} VERSION AS OF {snapshot}")
    # The clicks as the view last counted them, replayed rows included; by the watermark alone
    # when that snapshot is not known (a view of an earlier version) or expired.
    stored = progress_summary_as_of(spark, views_table, snapshot, VIEWS_CLICK_OFFSETS) or {}
    counted = stored.get(VIEWS_CLICKS_SNAPSHOT)  # from the commit of the watermark, or unknown
    notes = []
    clicks = spark.table(fact_table)
    if counted is not None:
        try:
            clicks = spark.sql(f"SELECT * FROM {fact_table} VERSION AS OF {int(counted)}")
            clicks.schema  # noqa: B018 - resolves the snapshot now: an expired one fails here
        except Exception:  # noqa: BLE001 - expired: compare by the watermark
            clicks = spark.table(fact_table)
            notes.append(
                f"the click snapshot the view counted through ({counted}) is expired: compared by offsets"
            )
    result = check_views(clicks, views, watermark, VIEWS)
    result.notes += notes
    return result


def cdc_tables(spark, config: LakehouseConfig) -> list[tuple[str, tuple[str, str]]]:
    """(target, (schema, table)) of every CDC table: those naming their source (a table property CDC
    sets, in any namespace), and dim_db tables with a stored binlog position that predate it."""
    from jobs.cdc.snapshot import STAGING_SUFFIX
    from jobs.cdc.target_table import synced_source

    found = []
    for (namespace,) in spark.sql(f"SHOW NAMESPACES IN {config.catalog.name}").collect():
        qualified = f"{config.catalog.name}.{namespace}"
        for row in spark.sql(f"SHOW TABLES IN {qualified}").collect():
            name, target = row["tableName"], f"{qualified}.{row['tableName']}"
            if STAGING_SUFFIX in name:
                continue
            source = synced_source(spark, target, config.mysql.database)
            if source is not None:
                schema, _, table = source.partition(".")
                found.append((target, (schema, table)))
    return sorted(found)


def verify_dimensions(
    spark, config: LakehouseConfig, tables: list[str], server_id: int, repair: bool = False
) -> list[CheckResult]:
    import pymysql

    from jobs.cdc import source_db
    from jobs.verify.dimensions import check_dimension

    wanted = [(t, s) for t, s in cdc_tables(spark, config) if _wanted(tables, ".".join(t.split(".")[-2:]))]
    if not wanted:
        return []
    credentials = source_db.cdc_credentials(config)
    try:
        conn = source_db.connect(config, credentials)
    except (ConfigError, pymysql.err.OperationalError) as exc:  # every dimension check cannot run
        return [
            CheckResult("mysql -> dimension", ".".join(t.split(".")[-2:]), error=f"MySQL unreachable: {exc}")
            for t, _ in wanted
        ]
    try:
        settings = source_db.connection_settings(config, credentials)
        is_mariadb = source_db.is_mariadb(conn)
        results = []
        for target, source in wanted:
            arguments = (spark, conn, target, source, settings, server_id, is_mariadb)
            results.append(
                repaired_dimension(arguments, settings, server_id, is_mariadb)
                if repair
                else timed(check_dimension, *arguments)
            )
        return results
    finally:
        conn.close()


def repaired_dimension(arguments: tuple, settings: dict, server_id: int, is_mariadb: bool) -> CheckResult:
    """The dimension check with its repair (`repair_rounds`)."""
    from jobs.cdc.reconcile import changed_keys
    from jobs.verify.dimensions import check_dimension
    from jobs.verify.repair import repair_dimension

    spark, source = arguments[0], arguments[3]

    def repair(plan) -> tuple[str, int]:
        def changed_since(start, end, key=plan.source.key):
            return changed_keys(settings, server_id, source, key, start, end, is_mariadb)

        outcome = repair_dimension(spark, plan, changed_since)
        return outcome.note(), outcome.written + outcome.deleted

    return repair_rounds(lambda repairs: check_dimension(*arguments, repairs=repairs), repair)


def run_checks(
    spark, config: LakehouseConfig, tables: list[str], server_id: int, repair: bool = False
) -> list[CheckResult]:
    results = []
    if _wanted(tables, CLICKS):
        clicks = repaired_clicks if repair else verify_clicks
        results.append(guarded("kafka -> clicks", CLICKS, clicks, spark, config))
    results += verify_dimensions(spark, config, tables, server_id, repair)
    if _wanted(tables, VIEWS):
        results.append(guarded("clicks -> views", VIEWS, verify_views, spark, config))
    return results


def findings_uri(spark, config: LakehouseConfig, started: float) -> str:
    catalog = config.catalog
    warehouse = catalog.warehouse or spark.conf.get(f"spark.sql.catalog.{catalog.name}.warehouse")
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(started))
    return f"{warehouse.rstrip('/')}/{FINDINGS_FOLDER}/verify-{stamp}-{os.getpid()}.json"  # two runs a second


def store_findings(spark, config: LakehouseConfig, started: float, results: list[CheckResult]) -> str | None:
    """Write the findings beside the tables with the cluster's file system (S3 on EMR, a folder
    locally); where they went, or None when they could not be written."""
    uri = None
    try:
        uri = findings_uri(spark, config, started)
        path = spark._jvm.org.apache.hadoop.fs.Path(uri)
        stream = path.getFileSystem(spark._jsc.hadoopConfiguration()).create(path, True)
        try:
            stream.write(bytearray(as_json(results).encode()))
        finally:
            stream.close()
        return uri
    except Exception as exc:  # noqa: BLE001 - the verdict stands; only the examples go unlisted
        log.warning("could not store the findings at %s: %s", uri, (str(exc) or repr(exc)).splitlines()[0])
        return None


def printable(results: list[CheckResult], config: LakehouseConfig, stored_at: str | None) -> list:
    """What verify prints: on AWS its stdout lands in the EMR logs bucket, so no row values there."""
    return results if config.is_local else redacted(results, stored_at)


def publish(config: LakehouseConfig, results: list[CheckResult]) -> None:
    """The mismatch counts to CloudWatch (the alarm's input); a failure here changes no verdict."""
    import boto3

    try:
        boto3.client("cloudwatch", region_name=config.region).put_metric_data(
            Namespace=f"Lakehouse/{config.env}", MetricData=metric_data(results)
        )
    except Exception as exc:  # noqa: BLE001 - the results are printed either way
        log.warning("could not publish %s to CloudWatch: %s", "ReconcileMismatches", exc)


@reports_config_errors
def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(sys.argv[1:] if argv is None else argv)
    config = config_from_args(args)

    from jobs.common.spark_session import build_spark, stop_spark

    spark = build_spark(config, "verify")
    started = time.time()
    try:
        results = run_checks(spark, config, args.tables, args.server_id, args.repair)
        stored_at = store_findings(spark, config, started, results) if results else None
    except Exception as exc:  # noqa: BLE001 - e.g. the catalog unreachable: no verdict, not a mismatch
        log.error("verify cannot run: %s: %s", type(exc).__name__, exc)
        return 2
    finally:
        stop_spark(spark)
    if not results:
        raise ConfigError(f"--tables {','.join(args.tables)}: no such table to verify")
    results = printable(results, config, stored_at)
    if not config.is_local:
        publish(config, results)
    if args.json:
        print(as_json(results, stored_at))
    else:
        from rich.console import Console

        # Step logs are no terminal: rich would wrap the table at 80 columns.
        render(results, Console() if sys.stdout.isatty() else Console(width=140))
        if stored_at:
            print(f"verify: findings stored at {stored_at}")
    return exit_code(results)


if __name__ == "__main__":
    sys.exit(main())
