"""The `lakehouse` command: local stack, ad-hoc SQL, data generator and pipeline jobs."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from jobs.config import ConfigError, LakehouseConfig
from lakehouse.cdk_cli import cdk_environment
from lakehouse.local.process import StackError
from lakehouse.local.settings import StackSettings
from lakehouse.local.stack import LocalStack, redact_passwords

console = Console(stderr=True)
out = Console()


def _fail(message: str) -> None:
    console.print(f"[bold red]error:[/] {message}")
    sys.exit(1)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Near-real-time Iceberg lakehouse: run it locally, query it, feed it."""


# ---- local stack ------------------------------------------------------------------------------


@main.group()
def local() -> None:
    """Start, stop and inspect the embedded local stack (state in $LAKEHOUSE_HOME)."""


@local.command()
@click.option(
    "--keep-topic/--trim-topic",
    default=None,
    help="Keep every batch in the local topic (no retention): replayable from offset 0, but the "
    "broker's reads slow down past ~2,000 batches per partition. The choice is remembered "
    "(`lakehouse demo` keeps it) until --trim-topic; the default is to trim.",
)
def up(keep_topic: bool | None) -> None:
    """Start MariaDB, the local S3, the Kafka broker, the catalog and the topic retention (no-op
    when running)."""
    began = time.monotonic()
    try:
        stack = LocalStack(StackSettings.resolve())
        state = stack.up(
            progress=lambda msg: console.print(f"  {msg}"),
            topic_retention=None if keep_topic is None else not keep_topic,
        )
    except (StackError, ConfigError, ValueError) as exc:
        _fail(str(exc))
    console.print(
        f"[green]local stack up[/] in {time.monotonic() - began:.1f}s "
        f"(state in {state['home']}); see `lakehouse local status`"
    )


@local.command()
@click.option("--purge", is_flag=True, help="Also delete all state (data, logs, catalog).")
def down(purge: bool) -> None:
    """Stop the stack's processes; data is kept unless --purge."""
    try:
        LocalStack(StackSettings.resolve()).down(purge, progress=lambda m: console.print(f"  {m}"))
    except (StackError, ValueError) as exc:
        _fail(str(exc))


@local.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option(
    "--show-secrets", is_flag=True, help="Print the MySQL passwords too (else: where they are kept)."
)
def status(as_json: bool, show_secrets: bool) -> None:
    """Show each part's health; exits 1 when a part is down."""
    stack = LocalStack(StackSettings.resolve())
    secrets = stack.saved_secrets()
    state = stack.describe(secrets)
    state["tables"] = table_freshness(Path(state["home"]) / "metrics.json", time.time())
    if state["kafka"]["healthy"] and state["s3"]["healthy"]:
        from lakehouse.local.broker import slow_reads_warning

        stored = stack.broker.stored_batches(secrets)
        state["kafka"]["stored_batches"] = {str(p): n for p, n in stored.items()}
        state["kafka"]["warning"] = slow_reads_warning(stored, state["topic_retention"]["state"])
    if as_json:
        out.print_json(
            json.dumps(state if show_secrets else redact_passwords(state, stack.settings.state_file))
        )
    else:
        table = Table(title=f"local stack ({state['home']})")
        for column in ("part", "state", "address", "pid", "log"):
            table.add_column(column)
        rows = [
            ("mysql", f"{state['mysql']['host']}:{state['mysql']['port']}", state["mysql"]),
            ("kafka", state["kafka"]["bootstrap"], state["kafka"]),
            ("s3", state["s3"]["endpoint"], state["s3"]),
            ("catalog", state["catalog"]["uri"], state["catalog"]),
        ]
        for name, address, part in rows:
            health = "[green]up[/]" if part["healthy"] else "[red]down[/]"
            table.add_row(name, health, address, str(part.get("pid") or "-"), part.get("log", "-"))
        retention = state["topic_retention"]
        table.add_row(
            "topic retention",
            {"up": "[green]up[/]", "off": "[yellow]off[/]"}.get(retention["state"], "[red]failing[/]"),
            f"keeps unread + newest {retention['keep_batches']:,} batches",
            str(retention["pid"] or "-"),
            retention["log"],
        )
        out.print(table)
        if "stored_batches" in state["kafka"]:
            counts = ", ".join(f"{n:,}" for n in state["kafka"]["stored_batches"].values())
            out.print(f"broker: {counts} stored batches per partition of {state['kafka']['topic']}")
        if state["kafka"].get("warning"):
            out.print(f"[yellow]warning: {state['kafka']['warning']}[/]")
        if state["tables"]:
            out.print(freshness_table(state["tables"]))
    sys.exit(0 if state["healthy"] else 1)


def table_freshness(metrics_file: Path, now: float) -> dict[str, dict]:
    """Per table, from the jobs' last batch (jobs/common/metrics.py): last commit age, records,
    lag (now - newest record applied, at that commit) and, for the clicks, the Kafka offset lag."""
    from jobs.common.metrics import read_local_metrics

    return {
        name: {
            "job": m["job"],
            "last_commit_age_seconds": round(now - m["at"], 1),
            "records_last_batch": m["records_in"],
            "lag_seconds": None if m["lag_seconds"] is None else round(m["lag_seconds"], 1),
            "offset_lag": sum(m["offset_lag"].values()) if m["offset_lag"] else None,
        }
        for name, m in sorted(read_local_metrics(metrics_file).items())
    }


def freshness_table(tables: dict[str, dict]) -> Table:
    table = Table(title="tables (the jobs' last batch)")
    for column in ("table", "job", "last commit", "records", "lag", "Kafka offset lag"):
        table.add_column(column)
    for name, t in tables.items():
        lag = "-" if t["lag_seconds"] is None else f"{t['lag_seconds']:.1f}s"
        offsets = "-" if t["offset_lag"] is None else f"{t['offset_lag']:,}"
        age = f"{t['last_commit_age_seconds']:.0f}s ago"
        table.add_row(name, t["job"], age, f"{t['records_last_batch']:,}", lag, offsets)
    return table


# ---- ad-hoc SQL -------------------------------------------------------------------------------


@main.command()
@click.argument("query")
@click.option("--engine", type=click.Choice(["duckdb", "spark"]), default="duckdb", show_default=True)
@click.option(
    "--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table", show_default=True
)
def sql(query: str, engine: str, fmt: str) -> None:
    """Run QUERY over the local lake; tables are `namespace.table` (e.g. dim_db.products)."""
    from lakehouse import adhoc_sql

    try:
        config = LakehouseConfig.local()
        if engine == "duckdb":
            ext_dir = StackSettings.resolve().home / "duckdb_extensions"
            result = adhoc_sql.query_duckdb(config, query, ext_dir)
        else:
            result = adhoc_sql.query_spark(config, query)
    except ConfigError as exc:
        _fail(str(exc))
    except Exception as exc:  # noqa: BLE001 - any engine error is shown, not a traceback
        _fail(f"{engine} query failed: {exc}")
    if fmt == "table":
        out.print(adhoc_sql.rich_table(result))
    else:
        click.echo(adhoc_sql.render(result, fmt))


@main.command()
@click.option("--seconds", type=float, default=120.0, show_default=True, help="streaming phase length")
@click.option("--rate", type=float, default=200.0, show_default=True, help="clicks per second")
def demo(seconds: float, rate: float) -> None:
    """Run the source system's scenario end to end on the embedded stack (`make demo`)."""
    from lakehouse.demo import DemoOptions, run_demo
    from lakehouse.job_processes import JobFailed

    if seconds <= 0 or rate <= 0:
        _fail("--seconds and --rate must be positive")
    try:
        run_demo(out, DemoOptions(seconds=seconds, rate=rate))
    except KeyboardInterrupt:
        out.print("[yellow]demo interrupted; the jobs are stopped, the stack is still up[/]")
        sys.exit(130)
    except (StackError, ConfigError, JobFailed, RuntimeError) as exc:
        _fail(str(exc))


# ---- pipeline ---------------------------------------------------------------------------------

PASS_THROUGH = {"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []}


@main.command(context_settings=PASS_THROUGH)
@click.argument("job", required=False)
@click.argument("job_args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def run(ctx: click.Context, job: str | None, job_args: tuple[str, ...]) -> None:
    """Run a pipeline JOB (listed below, from jobs/registry.py); `lakehouse run JOB --help` lists
    its options."""
    from jobs.registry import JOBS

    if job in (None, "--help", "-h"):
        click.echo(ctx.get_help())
        click.echo("\nJobs:")
        for registered in JOBS.values():
            click.echo(f"  {registered.name:<10} {registered.kind.value:<11} {registered.summary}")
        return

    if job not in JOBS:
        raise click.BadParameter(f"{job!r} is not one of {', '.join(JOBS)}", param_hint="JOB")
    sys.exit(JOBS[job].main()(list(job_args)) or 0)


@main.command(context_settings=PASS_THROUGH)
@click.argument("verify_args", nargs=-1, type=click.UNPROCESSED)
def verify(verify_args: tuple[str, ...]) -> None:
    """Reconcile every table with its source: exit 0 all match, 1 a mismatch, 2 cannot run
    (`lakehouse verify --help`; the same as `lakehouse run verify`)."""
    from jobs.registry import job

    sys.exit(job("verify").main()(list(verify_args)) or 0)


@main.command(name="replay-rejects", context_settings=PASS_THROUGH)
@click.argument("replay_args", nargs=-1, type=click.UNPROCESSED)
def replay_rejects(replay_args: tuple[str, ...]) -> None:
    """Land the rejects that pass today's validation in the fact table, each once
    (`lakehouse replay-rejects --help`; the same as `lakehouse run replay`)."""
    from jobs.registry import job

    sys.exit(job("replay").main()(list(replay_args)) or 0)


# ---- AWS ---------------------------------------------------------------------------------------


@main.group(name="aws")
def aws_group() -> None:
    """Check and operate an AWS environment (boto3; --profile/--region as for the AWS CLI)."""


def _aws_session(region: str | None, profile: str | None):
    """(boto3 session, account id), or one clear error line."""
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, ProfileNotFound

    try:
        session = boto3.Session(profile_name=profile, region_name=region)
        if not session.region_name:
            _fail("no AWS region: pass --region or set AWS_DEFAULT_REGION / the profile's region")
        return session, session.client("sts").get_caller_identity()["Account"]
    except NoCredentialsError:
        _fail("no AWS credentials: set AWS_PROFILE (or pass --profile) or run `aws configure`")
    except ProfileNotFound as error:
        _fail(f"{error}: pass an existing --profile (see `aws configure list-profiles`)")
    except (ClientError, BotoCoreError) as error:
        _fail(f"cannot use these credentials: {error}")


aws_env_option = click.option(
    "--env", "env_name", type=click.Choice(["dev", "prod"]), default="dev", show_default=True
)
aws_region_option = click.option("--region", help="default: the profile's region")
aws_profile_option = click.option("--profile", help="AWS profile (default: the usual credential chain)")


@aws_group.command()
@aws_env_option
@aws_region_option
@aws_profile_option
@click.option(
    "--pin-azs",
    is_flag=True,
    help="write the AZs chosen by zone ID into cdk.context.json (dev: also you, as a lake reader)",
)
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def preflight(env_name: str, region: str | None, profile: str | None, pin_azs: bool, as_json: bool) -> None:
    """Check an account/region before the first `cdk deploy` and say what to fix."""
    from infra.config import DeploymentConfig
    from lakehouse.aws import preflight as checks

    session, account = _aws_session(region, profile)
    config = DeploymentConfig.for_env(env_name)
    bucket = f"{config.name_prefix}-artifacts-{account}-{session.region_name}"
    warehouse = f"{config.name_prefix}-warehouse-{account}-{session.region_name}"
    results, azs = checks.run_checks(session, env_name, config, bucket, warehouse)
    if pin_azs and len(azs) == config.network.max_azs:
        checks.pin_azs(Path("cdk.context.json"), account, session.region_name, azs)
    reader, not_pinned = checks.caller_role_arn(session) if pin_azs and env_name == "dev" else (None, "")
    if reader:
        checks.pin_lake_reader(Path("cdk.context.json"), reader)
    if as_json:
        out.print_json(json.dumps({"account": account, "region": session.region_name, "azs": azs,
                                   "checks": [c.__dict__ for c in results]}))  # fmt: skip
    else:
        table = Table(title=f"preflight: {env_name} in {account} / {session.region_name}")
        for column in ("check", "", "found", "to fix"):
            table.add_column(column)
        for check in results:
            table.add_row(check.name, "[green]ok[/]" if check.ok else "[red]FIX[/]", check.found, check.fix)
        out.print(table)
        if pin_azs:
            out.print(f"pinned {azs} in cdk.context.json" if len(azs) == config.network.max_azs else
                      "AZs not pinned: not enough usable zones")  # fmt: skip
        if reader:
            out.print(f"pinned {reader} as a dev lake reader: Athena queries run as you")
        elif pin_azs and env_name == "dev":
            out.print(f"not pinned as a lake reader: {not_pinned}. Athena reads the tables as the caller, "
                      "and the warehouse bucket lets only roles named in lake_readers read: add your role's "
                      "ARN (with its path) to lake_readers in cdk.json (docs/security.md)")  # fmt: skip
    if not all(check.ok for check in results):
        sys.exit(1)


@aws_group.command(name="plan-upgrade")
@aws_env_option
@aws_region_option
@aws_profile_option
@click.option(
    "--assembly",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="a synthesized cloud assembly (default: `cdk synth -c env=<env>` into cdk.out/<env>)",
)
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def plan_upgrade(
    env_name: str, region: str | None, profile: str | None, assembly: Path | None, as_json: bool
) -> None:
    """Before `cdk deploy`: what this version replaces or deletes in the deployed stacks and what to
    do first; exit 1 when a resource holding data would go, 2 when no plan can be made."""
    from lakehouse.aws import upgrade_plan

    try:
        session, account = _aws_session(region, profile)
    except SystemExit:  # the reason is printed: no plan, which is not a refusal
        sys.exit(2)
    repo = Path(upgrade_plan.__file__).resolve().parents[2]
    cdk = repo / "node_modules" / ".bin" / "cdk"
    if not cdk.exists():
        console.print(f"[red]error:[/] the CDK CLI is not installed in {repo}: run `make setup` there")
        sys.exit(2)
    run_cdk = upgrade_plan.cdk_runner(cdk, repo, cdk_environment(repo, session.region_name))
    try:
        if assembly is None:
            assembly = repo / "cdk.out" / env_name
            console.print(f"cdk synth -c env={env_name} -o {assembly}")
            run_cdk(["synth", "-q", "-c", f"env={env_name}", "-o", str(assembly),
                     *(["--profile", profile] if profile else [])])  # fmt: skip
        plan = upgrade_plan.plan_against_deployed(
            session.client("cloudformation"), assembly, run_cdk, env_name
        )
    except upgrade_plan.PlanError as error:
        console.print(f"[red]error:[/] {error}")
        sys.exit(2)
    if as_json:
        rows = [{**row.change.__dict__, "holds": row.holds, "refuses": row.refuses, "first": row.first}
                for row in plan.rows]  # fmt: skip
        out.print_json(json.dumps({"rows": rows, "not_deployed": plan.not_deployed, "refuses": plan.refuses}))
        sys.exit(1 if plan.refuses else 0)
    table = Table(title=f"plan-upgrade: {env_name} in {account} / {session.region_name}")
    for column in ("stack", "resource", "type", "change", "holds data", "do first"):
        table.add_column(column, overflow="fold")
    for row in plan.rows:
        change = row.change
        table.add_row(
            change.stack.removeprefix("Lakehouse-"),
            f"{change.path} ({change.logical_id})" if change.path else change.logical_id,
            change.resource_type,
            change.impact,
            f"[red]{row.holds}[/]" if row.refuses else (row.holds or "no"),
            row.first,
        )
    out.print(table)
    if plan.not_deployed:
        out.print(f"not deployed yet (created): {', '.join(plan.not_deployed)}")
    if plan.refuses:
        out.print(
            "[red]refused[/]: a resource holding data would be replaced or removed (infra/README, 'Upgrade')"
        )
        sys.exit(1)
    out.print(
        "nothing holding data is replaced or removed" if plan.rows else "nothing is replaced or removed"
    )


def _park_command(parking: bool):
    def command(env_name: str, region: str | None, profile: str | None) -> None:
        import subprocess

        from infra.config import DeploymentConfig
        from lakehouse.aws import park

        try:  # prod is refused before anything is asked of AWS
            config = DeploymentConfig.for_env(env_name, parked=parking)
        except ConfigError as error:
            _fail(str(error))
        session, account = _aws_session(region, profile)

        repo = Path(park.__file__).resolve().parents[2]
        cdk = repo / "node_modules" / ".bin" / "cdk"
        if not cdk.exists():
            _fail(f"the CDK CLI is not installed in {repo}: run `make setup` there")

        def run_cdk(args) -> None:
            command = [str(cdk), *args, *(["--profile", profile] if profile else [])]
            console.print(f"  $ {' '.join(command[1:])}")
            done = subprocess.run(
                command, cwd=repo, env=cdk_environment(repo, session.region_name), check=False
            )
            if done.returncode:
                raise park.ParkError(f"cdk {args[0]} failed (exit {done.returncode}): see its output above")

        verb = "parking" if parking else "unparking"
        console.print(f"{verb} {env_name} in {account} / {session.region_name}")
        try:
            action = park.park if parking else park.unpark
            action(session, config, run_cdk, lambda m: console.print(f"  {m}"))
        except (park.ParkError, ConfigError) as error:
            _fail(str(error))

    return command


for _name, _parking, _help in (
    ("park", True, "Park dev: no cluster, NAT or endpoints, RDS stopped; the lake, catalog and MSK stay."),
    ("unpark", False, "Start RDS and deploy the app again: a new cluster resumes every job."),
):
    aws_group.command(name=_name, help=_help)(
        aws_env_option(aws_region_option(aws_profile_option(_park_command(_parking))))
    )


def _operate(env_name: str, region: str | None, profile: str | None):
    """(session, config, stack outputs) of a deployed environment, or one clear error line."""
    from infra.config import DeploymentConfig
    from lakehouse.aws import operate

    session, _ = _aws_session(region, profile)
    config = DeploymentConfig.for_env(env_name)
    try:
        _, outputs = operate.stack_outputs(session, config)
    except operate.OperateError as error:
        _fail(str(error))
    return session, config, outputs


def _operate_command(function):
    return aws_env_option(aws_region_option(aws_profile_option(function)))


@aws_group.command(name="status")
@_operate_command
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def aws_status(env_name: str, region: str | None, profile: str | None, as_json: bool) -> None:
    """Stacks, cluster, pipeline steps, MSK brokers and each table's freshness (from the metrics)."""
    from lakehouse.aws import operate

    session, config, _ = _operate(env_name, region, profile)
    try:
        found = operate.status(session, config)
    except operate.OperateError as error:
        _fail(str(error))
    if as_json:
        out.print_json(json.dumps(found.__dict__, default=str))
        return
    stacks = Table(title=f"{env_name}: stacks")
    stacks.add_column("stack")
    stacks.add_column("status")
    for name, state in found.stacks.items():
        stacks.add_row(name, state)
    out.print(stacks)
    cluster = found.cluster
    out.print(f"cluster: {cluster.get('id', 'none (parked)')} {cluster.get('state', '')}")
    out.print(f"MSK bootstrap (IAM): {found.bootstrap_brokers or 'unknown'}")
    steps = Table(title="pipeline steps (newest first)")
    for column in ("job", "step", "state"):
        steps.add_column(column)
    for step in found.steps[:20]:
        steps.add_row(step["job"], step["id"], step["state"])
    out.print(steps)
    tables = Table(title="tables (last hour of metrics)")
    for column in ("table", "job", "last commit", "records", "lag"):
        tables.add_column(column)
    for name, t in found.tables.items():
        age = (
            "none in the last hour"
            if t["last_commit_age_seconds"] is None
            else f"{t['last_commit_age_seconds']}s ago"
        )
        lag = "-" if t["lag_seconds"] is None else f"{t['lag_seconds']:.1f}s"
        tables.add_row(name, t["job"], age, f"{t['records_last_hour']:,}", lag)
    out.print(tables)


@aws_group.command(name="logs")
@_operate_command
@click.argument("job_or_step")
@click.option("--stdout", "stream", flag_value="stdout", help="the step's stdout instead of stderr")
@click.option("--follow", is_flag=True, help="print what is new every 60 s until Ctrl-C")
def aws_logs(env_name, region, profile, job_or_step: str, stream: str | None, follow: bool) -> None:
    """A step's stderr (JOB: its newest step, or a step id s-...) from the EMR log bucket."""
    from lakehouse.aws import operate

    session, config, outputs = _operate(env_name, region, profile)
    shown = 0
    while True:
        try:
            text = operate.step_log(session, config, outputs, job_or_step, stream or "stderr")
        except operate.OperateError as error:
            if not follow or shown:
                _fail(str(error))
            console.print(str(error))
            text = ""
        click.echo(text[shown:], nl=False)
        shown = len(text)
        if not follow:
            return
        time.sleep(60)


@aws_group.command(name="submit")
@_operate_command
@click.argument("job")
@click.option("--count", type=int, help="gendata: records to send")
@click.option("--rate", type=int, help="gendata: events per second")
def aws_submit(env_name, region, profile, job: str, count: int | None, rate: int | None) -> None:
    """Run a batch JOB now (report, maintain, verify, replay, gendata) through its state machine."""
    from lakehouse.aws import operate

    session, config, outputs = _operate(env_name, region, profile)
    payload = {k: str(v) for k, v in (("count", count), ("rate", rate)) if v is not None}
    if job == "gendata" and "count" not in payload:
        _fail("gendata needs --count N (and optionally --rate R)")
    try:
        arn = operate.submit(session, config, outputs, job, payload)
    except operate.OperateError as error:
        _fail(str(error))
    out.print(f"started {job}: {arn}")


@aws_group.command(name="sql")
@_operate_command
@click.argument("query")
@click.option(
    "--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table", show_default=True
)
def aws_sql(env_name, region, profile, query: str, fmt: str) -> None:
    """Run QUERY through Athena over the Glue catalog (tables `dim_db.products`, ...)."""
    import csv
    import io

    from lakehouse.aws import operate

    session, config, _ = _operate(env_name, region, profile)
    try:
        columns, rows = operate.athena_query(session, config, query)
    except operate.OperateError as error:
        _fail(str(error))
    if fmt == "json":
        out.print_json(json.dumps([dict(zip(columns, row, strict=True)) for row in rows]))
    elif fmt == "csv":
        buffer = io.StringIO()
        csv.writer(buffer).writerows([columns, *rows])
        click.echo(buffer.getvalue(), nl=False)
    else:
        table = Table()
        for column in columns:
            table.add_column(column)
        for row in rows:
            table.add_row(*[value if value is not None else "null" for value in row])
        out.print(table)


@aws_group.command(name="request-resync")
@_operate_command
@click.argument("tables", nargs=-1, required=True)
def aws_request_resync(env_name, region, profile, tables: tuple[str, ...]) -> None:
    """Ask the running CDC job to re-snapshot TABLES (dim_db.<table>) beside the stream."""
    from lakehouse.aws import operate

    session, config, outputs = _operate(env_name, region, profile)
    try:
        step_id = operate.request_resync(session, config, outputs, list(tables))
    except operate.OperateError as error:
        _fail(str(error))
    out.print(
        f"step {step_id} marks {', '.join(tables)} for a re-snapshot; the running CDC job takes each "
        f"within about 30 s of the step's end, after any copy before it (`lakehouse aws logs {step_id}`: "
        "the step's outcome; the CDC job's log names the request)"
    )


@aws_group.command(name="stop")
@_operate_command
@click.argument("job")
def aws_stop(env_name, region, profile, job: str) -> None:
    """Cancel a job's running step (a streaming job is started again by the supervisor)."""
    from lakehouse.aws import operate

    session, config, outputs = _operate(env_name, region, profile)
    try:
        cancelled = operate.stop(session, config, outputs, job)
    except operate.OperateError as error:
        _fail(str(error))
    out.print(f"cancelled {', '.join(cancelled)}")


@main.command(context_settings=PASS_THROUGH)
@click.argument("gendata_args", nargs=-1, type=click.UNPROCESSED)
def gendata(gendata_args: tuple[str, ...]) -> None:
    """Produce ClickEvents to Kafka; `lakehouse gendata --help` lists the options."""
    from jobs.registry import JOBS

    sys.exit(JOBS["gendata"].main()(list(gendata_args)) or 0)


if __name__ == "__main__":
    main()
