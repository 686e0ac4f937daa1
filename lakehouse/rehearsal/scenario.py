"""`make rehearse`: run what the EMR cluster would run, from the synthesized dev assembly and the
packaged artifact only, on this machine.

1. The deployment: every BucketDeployment's objects into folders standing in for S3; the Glue
   databases as namespaces of a local JDBC catalog; the MSK topic on the local broker; the CDC
   secret in a moto server standing in for Secrets Manager (CloudWatch too).
2. The node: a clean CPython 3.11 and Spark under a temporary root, the cluster's classifications
   rendered into `spark-defaults.conf` / `spark-env.sh`, the bootstrap actions run with their
   template arguments, then a Spark standalone master and worker.
3. The steps, with their template arguments (values substituted, see `substitutions.py`): gendata
   (its state machine), the supervisor's streaming step(s) until the lake holds what went in, the
   step `lakehouse aws request-resync` adds (answered by the running CDC job with a copy), then
   report, maintain and verify (their state machines; verify exits 1 on a mismatch). One line per
   step: arguments, result, time.
4. The verdict: the lake compared with the topic and the source tables, as multisets, by the
   rehearsal's own readers (independent of verify's).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from lakehouse.rehearsal import checks, watched_metrics
from lakehouse.rehearsal.assembly import AssemblyError, CloudAssembly, Resolver, require_resolved
from lakehouse.rehearsal.emr_node import (
    EmrNode,
    NodeError,
    cluster_configurations,
    install_iceberg_jars,
    install_python,
    install_spark,
    install_trino,
    node_environment,
    render_spark_defaults,
    render_spark_env,
    run_bootstrap_actions,
    wait_for_file,
    write_command,
    write_spark_conf,
)
from lakehouse.rehearsal.glue import glue_namespaces
from lakehouse.rehearsal.local_s3 import LocalS3
from lakehouse.rehearsal.moto_server import MotoServer
from lakehouse.rehearsal.spark_standalone import ClusterError, StandaloneCluster
from lakehouse.rehearsal.steps import StepDefinition, batch_steps, streaming_steps
from lakehouse.rehearsal.substitutions import (
    PSEUDO_PARAMETERS,
    REHEARSAL_REGION,
    LocalEndpoints,
    Substitutions,
)

Log = Callable[[str], None]
# One executor of both cores per application: each executor JVM starts and unpacks the ~110 MB
# archive on its own, so two of one core each cost this 2-core box more than they give.
WORKER_CORES, WORKER_MEMORY, EXECUTOR_MEMORY, EXECUTOR_CORES = 2, "3g", "2g", 2
MALFORMED = (b"{not json", b'{"uid": "u1"}', b"[1, 2, 3]")  # sent beside gendata's clicks


class RehearsalFailed(RuntimeError):
    pass


@dataclass(frozen=True)
class StepRun:
    job: str
    args: list[str]
    exit_code: int
    seconds: float
    log_dir: Path


@dataclass
class Rehearsal:
    assembly_dir: Path
    work_dir: Path
    clicks: int = 2000
    rate: int = 1000
    log: Log = print

    def run(self) -> int:
        from lakehouse.local.process import StackError
        from lakehouse.local.settings import StackSettings
        from lakehouse.local.stack import LocalStack

        began = time.monotonic()
        assembly = CloudAssembly(self.assembly_dir)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        stack = LocalStack(StackSettings.on_free_ports(self.work_dir / "local-stack"))
        moto = MotoServer(self.work_dir / "moto.log")
        cluster: StandaloneCluster | None = None
        self.runs: list[StepRun] = []
        try:
            # MSK keeps records by age (168 h), not by what the lake read: no local topic retention,
            # and the verdict reads the whole topic back.
            state = stack.up(topic_retention=False)
            moto.start()
            self.subs = self._substitutions(stack, state, moto)
            self.resolver = Resolver(assembly, PSEUDO_PARAMETERS, self.subs.resource_value)
            s3 = LocalS3(self.subs.local.s3_root)
            s3.deploy_all(assembly, self.resolver, self.log)
            node = self._node(assembly, s3, moto)
            self._catalog_and_topic(assembly, stack)
            worker_env = node_environment(node, self._aws_env(moto))  # executors inherit it
            cluster = StandaloneCluster(
                node.spark_home, self.work_dir / "spark-standalone", worker_env,
                cores=WORKER_CORES, memory=WORKER_MEMORY,
                master_port=int(self.subs.local.spark_master.rsplit(":", 1)[1]),
            )  # fmt: skip
            cluster.start()
            self.log(f"spark standalone: master {cluster.url}, worker {WORKER_CORES} cores / {WORKER_MEMORY}")
            problems = self._scenario(assembly, s3, node, stack, state, moto)
        except (RuntimeError, StackError, AssemblyError, NodeError, ClusterError, OSError) as error:
            self.log(f"REHEARSAL FAILED: {error}")
            return 1
        finally:
            # Each stand-in goes even if another one fails to stop.
            for stop in (cluster.stop if cluster is not None else None, moto.stop, stack.down):
                try:
                    if stop is not None:
                        stop()
                except Exception as error:  # noqa: BLE001 - reported; the others still stop
                    self.log(f"cleanup: {type(error).__name__}: {error}")
        self._print_summary(time.monotonic() - began)
        for problem in problems:
            self.log(f"MISMATCH: {problem}")
        self.log(f"rehearsal {'FAILED' if problems else 'passed'} in {time.monotonic() - began:.0f}s")
        return 1 if problems else 0

    # ---- the deployment ------------------------------------------------------------------------

    def _substitutions(self, stack, state: dict, moto: MotoServer) -> Substitutions:
        from lakehouse.rehearsal.spark_standalone import free_port

        made: dict[str, str] = {}

        def make_secret(resource) -> str:
            if resource.logical_id in made:
                return made[resource.logical_id]
            generated = resource.properties.get("GenerateSecretString", {})
            template = self.resolver.resolve(resource.stack, generated.get("SecretStringTemplate", "{}"))
            secret = json.loads(template)
            # The generated password and the user name are the local CDC user's.
            password_key = generated.get("GenerateStringKey", "password")
            secret.update(
                {"username": state["mysql"]["cdc_user"], password_key: state["mysql"]["cdc_password"]}
            )
            made[resource.logical_id] = moto.create_secret(
                resource.logical_id, json.dumps(secret), REHEARSAL_REGION
            )
            return made[resource.logical_id]

        local = LocalEndpoints(
            s3_root=self.work_dir / "s3",
            node_root=self.work_dir / "node",
            mysql_host=state["mysql"]["host"],
            mysql_port=int(state["mysql"]["port"]),
            mysql_ca=state["mysql"]["ssl_ca"],
            kafka_bootstrap=state["kafka"]["bootstrap"],
            catalog_jdbc_uri=f"jdbc:sqlite:{self.work_dir / 'catalog.db'}",
            spark_master=f"spark://127.0.0.1:{free_port()}",
            executor_memory=EXECUTOR_MEMORY,
            executor_cores=EXECUTOR_CORES,
        )
        return Substitutions(local=local, make_secret=make_secret)

    def _aws_env(self, moto: MotoServer) -> dict[str, str]:
        self.subs.record(
            "AWS credentials and endpoints", "the EMR instance profile (IMDS), AWS endpoints",
            f"static test credentials, AWS_ENDPOINT_URL={moto.endpoint}",
            "IAM: every permission the instance role has or lacks",
        )  # fmt: skip
        return {"AWS_ENDPOINT_URL": moto.endpoint, **moto.credentials}

    def _node(self, assembly: CloudAssembly, s3: LocalS3, moto: MotoServer) -> EmrNode:
        from jobs.common.spark_session import local_spark_jars

        root = self.subs.local.node_root
        configurations = cluster_configurations(assembly, self.resolver)
        install_python(root)
        install_spark(root)
        classpath = install_iceberg_jars(root, local_spark_jars())
        defaults = render_spark_defaults(
            configurations,
            self.subs,
            iceberg_classpath=classpath,
            catalog_jdbc_uri=self.subs.local.catalog_jdbc_uri,
        )
        exports = render_spark_env(configurations, self.subs)
        bin_dir = root / "rehearsal-bin"
        bin_dir.mkdir(parents=True, exist_ok=True)
        node = EmrNode(root=root, spark_defaults=defaults, spark_env=exports, bin_dir=bin_dir)
        write_spark_conf(node.conf_dir, defaults, exports)
        write_command(
            bin_dir, "yarn",
            'if [[ "$1 $2" == "application -list" ]]; then exit 0; fi\n'
            'echo "rehearsal: no YARN here (yarn $*)" >&2; exit 1\n',
        )  # fmt: skip
        write_command(
            bin_dir, "spark-submit", f'exec {sys.executable} -m lakehouse.rehearsal.yarn_cluster_mode "$@"\n'
        )
        write_command(bin_dir, "systemctl", f'echo "systemctl $*" >> {root}/systemctl.log\n')
        run_bootstrap_actions(assembly, self.resolver, self.subs, s3, node, self.log)
        install_trino(root)  # EMR installs the applications after the bootstrap actions
        catalog_file = root / "etc/trino/conf/catalog/lakehouse.properties"
        if not wait_for_file(catalog_file, 30):
            raise RehearsalFailed(f"configure-catalogs never wrote {catalog_file}")
        self.log(f"bootstrap waiter wrote {catalog_file.relative_to(root)} once Trino was installed")
        return node

    def _catalog_and_topic(self, assembly: CloudAssembly, stack) -> None:
        from lakehouse.local.catalog import ensure_catalog

        namespaces = glue_namespaces(assembly, self.resolver, self.subs)
        ensure_catalog(self.work_dir / "catalog.db", self.work_dir, namespaces)
        topic = assembly.only("AWS::MSK::Topic")
        name, partitions = topic.properties["TopicName"], int(topic.properties["PartitionCount"])
        stack.broker.ensure_topic(name, partitions)
        if stack.broker.topic_partitions(name) != partitions:
            raise RehearsalFailed(
                f"topic {name} exists on the local broker with other than {partitions} partitions"
            )
        self.topic, self.partitions = name, partitions
        self.log(f"catalog namespaces {sorted(namespaces)}; topic {name} ({partitions} partitions)")

    # ---- the steps -----------------------------------------------------------------------------

    def _scenario(self, assembly, s3, node: EmrNode, stack, state: dict, moto: MotoServer) -> list[str]:
        inputs = {"gendata": {"count": str(self.clicks), "rate": str(self.rate)}}
        batch = batch_steps(assembly, self.resolver, inputs)
        streaming = streaming_steps(assembly, self.resolver, s3)
        env = node_environment(node, self._aws_env(moto))
        self._run_step(batch["gendata"], env)
        bad = self._send_malformed(state["kafka"]["bootstrap"])
        topic = checks.read_topic(state["kafka"]["bootstrap"], self.topic, self.partitions)
        self.log(f"topic read back: {len(topic)} records ({len(bad)} malformed)")
        if len(topic) != self.clicks + len(bad):
            raise RehearsalFailed(f"gendata sent {len(topic) - len(bad)} records, not {self.clicks}")
        running = [self._start_step(step, env) for step in streaming]
        failure: BaseException | None = None
        try:
            self._wait_for_lake(topic, bad, state, running)
            self._request_a_resync(streaming, env, running)
        except BaseException as error:  # stop the steps first, then report what went wrong
            failure = error
        for step, process, began in running:
            try:
                self._stop_streaming(step, process, began)
            except RehearsalFailed as stop_failure:  # carries the step's log: report both
                failure = RehearsalFailed(f"{failure}\n{stop_failure}") if failure else stop_failure
        if failure is not None:
            raise failure
        self.report_days = {datetime.now(UTC).date()}  # the step reports the day it starts on (UTC)
        self._run_step(batch["report"], env)
        self._run_step(batch["maintain"], env)
        # The product's own reconciliation (exit 1 on a mismatch), as `-c verify_repair=true` deploys
        # it (the template's step plus --repair; tests/infra/test_infra_jobs.py: the only difference),
        # over a dimension row deleted behind CDC's back and click rows deleted behind the ingest's:
        # the step must put exactly those back.
        verify = batch["verify"]
        if "--repair" not in verify.args:
            verify = dataclasses.replace(verify, args=[*verify.args, "--repair"])
        self._delete_a_dimension_row(state)
        deleted_clicks = self._delete_some_clicks()
        self._run_step(verify, env)
        problems = self._verify(topic, bad, state)
        problems += self._verify_step_checked(deleted_clicks)
        published = moto.metrics("Lakehouse/dev", REHEARSAL_REGION)
        (self.work_dir / "published-metrics.json").write_text(json.dumps(published, indent=1, default=str))
        if not published:
            problems.append("no job metric reached CloudWatch (moto) in namespace Lakehouse/dev")
        # Every alarm and dashboard metric of the templates is one a job published here.
        problems += watched_metrics.unpublished(assembly.templates, "Lakehouse/dev", published)
        watched = {metric for _, metric in watched_metrics.watched(assembly.templates, "Lakehouse/dev")}
        self.log(f"alarms and dashboard watch {len(watched)} job metrics; {len(published)} published")
        return problems

    def localized_args(self, step: StepDefinition) -> list[str]:
        out = []
        for position, arg in enumerate(step.args):
            previous = step.args[position - 1] if position else ""
            if previous in ("--kafka-auth", "--mysql-ssl-ca"):
                out.append(self.subs.step_argument(previous, arg))
            elif previous == "--conf" and "=" in arg:
                key, _, value = arg.partition("=")
                value = self.subs.localize(value)
                value = self.subs.node_path(value) if value.startswith("/usr/") else value
                out.append(f"{key}={self.subs.spark_size(key, value)}")
            else:
                value = self.subs.localize(arg)
                out.append(self.subs.node_path(value) if value.startswith("/usr/") else value)
        require_resolved(step.name, out)
        return out

    def _start_step(self, step: StepDefinition, env: dict[str, str]):
        if step.jar != "command-runner.jar":
            raise RehearsalFailed(
                f"{step.name}: only command-runner.jar steps can be rehearsed, not {step.jar}"
            )
        args = self.localized_args(step)
        log_dir = self._step_dir(step.job)
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log(f"step {step.name} ({step.source}): {_abridged(args)}")
        with (log_dir / "stdout").open("wb") as stdout, (log_dir / "stderr").open("wb") as stderr:
            process = subprocess.Popen(
                args, cwd=log_dir, env=env, start_new_session=True, stdout=stdout, stderr=stderr
            )
        return step, process, time.monotonic()

    def _run_step(self, step: StepDefinition, env: dict[str, str], timeout: float = 600) -> None:
        step, process, began = self._start_step(step, env)
        try:
            code = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            code = process.wait()
        self._finished(step, process.args, code, began)

    def _step_dir(self, job: str) -> Path:
        return self.work_dir / "steps" / job

    def _step_output(self, job: str) -> str:
        """A step's stdout and stderr (Spark's client mode merges the Python driver's stderr into
        spark-submit's stdout)."""
        return "".join(
            (self._step_dir(job) / name).read_text(errors="replace") for name in ("stdout", "stderr")
        )

    def _finished(self, step: StepDefinition, args, code: int, began: float) -> None:
        run = StepRun(step.job, list(args), code, time.monotonic() - began, self._step_dir(step.job))
        self.runs.append(run)
        self.log(f"step {step.name}: exit {code} in {run.seconds:.1f}s")
        stderr = self._step_output(step.job)
        if code != 0:
            # Spark's own INFO lines bury the job's error: show the rest.
            lines = [
                line for line in stderr.splitlines() if not re.match(r"\d\d/\d\d/\d\d [\d:]+ INFO ", line)
            ]
            tail = "\n".join(lines[-25:])
            raise RehearsalFailed(
                f"step {step.name} exited {code}; its log ends:\n{tail}\n(log: {run.log_dir})"
            )
        origins = re.findall(r"emr_step: running (\S+) from (\S+)", stderr)
        outside = [path for _, path in origins if not re.search(r"/driver-[^/]+/pyenv/jobs/", path)]
        if not origins or outside:
            raise RehearsalFailed(
                f"step {step.name}: the job was not imported from the step's unpacked archive: {origins}"
            )

    def _stop_streaming(self, step: StepDefinition, process: subprocess.Popen, began: float) -> None:
        """What YARN does to a killed application: SIGTERM to the driver (it commits and exits)."""
        drivers = [pid for pid in _descendants(process.pid) if b"emr_step.py" in _cmdline(pid)]
        for pid in drivers:
            os.kill(pid, signal.SIGTERM)
        try:
            code = process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            code = process.wait()
        self._finished(step, process.args, code, began)

    def _send_malformed(self, bootstrap: str) -> set[tuple[int, int]]:
        from confluent_kafka import Producer

        delivered: set[tuple[int, int]] = set()
        producer = Producer({"bootstrap.servers": bootstrap})
        for value in MALFORMED:
            producer.produce(self.topic, value, on_delivery=lambda err, msg: delivered.add(
                (msg.partition(), msg.offset())) if err is None else None)  # fmt: skip
        producer.flush(30)
        if len(delivered) != len(MALFORMED):
            raise RehearsalFailed("the local broker did not acknowledge the malformed records")
        return delivered

    # ---- the verdict ---------------------------------------------------------------------------

    def _wait_for_lake(self, topic, bad, state: dict, running, timeout: float = 420) -> None:
        """Until every record is in the lake and a source change made after the CDC snapshot (so
        it comes through the binlog) is applied."""
        price = None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            exited = [step.name for step, process, _ in running if process.poll() is not None]
            if exited:  # reported (exit code, log) when the steps are stopped
                raise RehearsalFailed(
                    f"streaming step {', '.join(exited)} ended before the lake was up to date"
                )
            lake = self._lake()
            if price is None:
                if lake.get("dim_db.products") and lake.get("dim_db.user_member"):  # both snapshots done
                    price = self._change_a_price(state)
                    self.log(f"after the CDC snapshot: products 1 price -> {price} in MySQL")
                time.sleep(1)
                continue
            landed = len(lake.get("ods_behavior.clickevent", [])) + len(
                lake.get("ods_behavior.clickevent_rejects", [])
            )
            products = {str(r["productId"]): r for r in lake.get("dim_db.products", [])}
            applied = "1" in products and products["1"]["product_price"] == price
            views = sum(int(r["views"]) for r in lake.get("ads_behavior.product_views", []))
            if landed >= len(topic) and applied and views >= len(topic) - len(bad):
                self.log(f"lake caught up: {landed} records, price change applied, {views} views counted")
                return
            time.sleep(2)
        raise RehearsalFailed(f"the streaming step did not bring the lake up to date in {timeout:.0f}s")

    def _request_a_resync(self, streaming: list[StepDefinition], env: dict[str, str], running,
                          timeout: float = 300) -> None:  # fmt: skip
        """`lakehouse aws request-resync dim_db.products`: its step, built from the deployed streaming
        steps as the command builds it, run beside the streaming step; the running CDC job must take
        the request and answer it with a copy swapped in (its log says so; a copy that failed would
        answer it too, with its line)."""
        from jobs.cdc.target_table import RESYNC_DONE_PROPERTY, RESYNC_REQUEST_PROPERTY
        from lakehouse.aws.operate import REQUEST_RESYNC_STEP, request_resync_args

        table = "dim_db.products"
        args = request_resync_args([{"args": step.args} for step in streaming], [table])
        step = StepDefinition("cdc-request-resync", REQUEST_RESYNC_STEP, "command-runner.jar", args,
                              "lakehouse aws request-resync")  # fmt: skip
        began = time.monotonic()
        self._run_step(step, env)
        requested = self._catalog().load_table(table).properties.get(RESYNC_REQUEST_PROPERTY)
        if requested is None:
            raise RehearsalFailed(f"step {step.name} left no request on {table}")
        swapped = f"re-snapshotted beside the stream (requested {requested})"
        while True:
            for streaming_step, process, _ in running:
                if process.poll() is not None:
                    raise RehearsalFailed(f"step {streaming_step.name} ended ({process.returncode}) before "
                                          f"it answered the request on {table}")  # fmt: skip
            if self._catalog().load_table(table).properties.get(RESYNC_DONE_PROPERTY) == requested:
                logs = "".join(self._step_output(s.job) for s, _, _ in running)
                if swapped not in logs:
                    raise RehearsalFailed(f"the CDC job answered the request on {table} without a copy "
                                          f"swapped in (no '{swapped}' in its log)")  # fmt: skip
                self.log(f"{table}: re-snapshot {requested} taken by the running CDC job and swapped in "
                         f"{time.monotonic() - began:.0f}s after the request step started")  # fmt: skip
                return
            if time.monotonic() - began > timeout:
                raise RehearsalFailed(f"the running CDC job did not answer the request {requested} on "
                                      f"{table} in {timeout:.0f}s")  # fmt: skip
            time.sleep(2)

    def _change_a_price(self, state: dict):
        from decimal import Decimal

        connection = _mysql(state)
        try:
            with connection.cursor() as cursor:
                cursor.execute("UPDATE products SET product_price = product_price + 1 WHERE productId = '1'")
                # a member too, so CDC publishes figures for both tables the alarms watch
                cursor.execute(
                    "UPDATE user_member SET memberLevel = memberLevel % 5 + 1 ORDER BY userid LIMIT 1"
                )
                cursor.execute("SELECT product_price FROM products WHERE productId = '1'")
                (price,) = cursor.fetchone()
            connection.commit()
        finally:
            connection.close()
        return Decimal(price)

    def _catalog(self):
        """The rehearsal's catalog (the one its steps commit to), for the checks' own reads and damage."""
        from lakehouse.local.catalog import pyiceberg_catalog

        return pyiceberg_catalog(self.work_dir / "catalog.db", self.work_dir)

    def _lake(self) -> dict[str, list[dict]]:
        from pyiceberg.exceptions import NoSuchTableError

        catalog = self._catalog()
        tables = {}
        for namespace in catalog.list_namespaces():
            for identifier in catalog.list_tables(namespace):
                try:
                    table = catalog.load_table(identifier)
                except NoSuchTableError:  # a CDC snapshot's staging table, renamed since it was listed
                    continue
                tables[".".join(identifier)] = table.scan().to_arrow().to_pylist()
        return tables

    def _delete_a_dimension_row(self, state: dict) -> None:
        from pyiceberg.expressions import EqualTo

        table = self._catalog().load_table("dim_db.user_member")
        with _mysql(state) as connection, connection.cursor() as cursor:
            cursor.execute("SELECT MIN(userid) FROM user_member")
            (userid,) = cursor.fetchone()
        table.delete(EqualTo("userid", userid))
        self.log(f"deleted dim_db.user_member's row of userid {userid} behind CDC's back (verify repairs it)")

    def _delete_some_clicks(self) -> int:
        """Delete five fact rows near partition 0's end (the broker still holds those records, whatever
        its retention did to older ones); how many rows went."""
        from pyiceberg.expressions import And, EqualTo, GreaterThanOrEqual, LessThanOrEqual

        table = self._catalog().load_table("ods_behavior.clickevent")
        in_partition = EqualTo("kafka_partition", 0)
        rows = table.scan(row_filter=in_partition, selected_fields=("kafka_offset",)).to_arrow().to_pylist()
        victims = sorted(r["kafka_offset"] for r in rows)[-10:-5]
        if len(victims) < 5:
            raise RehearsalFailed(f"partition 0 of the click table holds {len(rows)} rows: too few to delete")
        first = GreaterThanOrEqual("kafka_offset", victims[0])
        table.delete(And(in_partition, And(first, LessThanOrEqual("kafka_offset", victims[-1]))))
        self.log(f"deleted the click rows of partition 0 at offsets {victims} behind the ingest's back "
                 "(verify reads them again)")  # fmt: skip
        return len(victims)

    def _verify(self, topic, bad, state: dict) -> list[str]:
        lake = self._lake()
        facts = lake.get("ods_behavior.clickevent", [])
        problems = checks.check_clicks(topic, bad, facts, lake.get("ods_behavior.clickevent_rejects", []))
        with _mysql(state) as connection, connection.cursor() as cursor:
            for table, columns in (("products", ("productId", "name", "product_price")),
                                   ("user_member", ("userid", "name", "memberLevel"))):  # fmt: skip
                cursor.execute(f"SELECT {', '.join(columns)} FROM {table}")
                source = [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]
                problems += checks.check_dimension(table, source, lake.get(f"dim_db.{table}", []), columns)
        problems += checks.check_views(facts, lake.get("ads_behavior.product_views", []))
        problems += checks.check_report(
            facts, lake.get("ads_behavior.member_daily_report", []), self.report_days
        )
        self.log(
            f"verified: {len(facts)} facts + {len(lake.get('ods_behavior.clickevent_rejects', []))} rejects "
            f"against {len(topic)} topic records; dimensions against MySQL; views; report"
        )
        return problems

    def _verify_step_checked(self, deleted_clicks: int) -> list[str]:
        """The verify step's own verdict lines: every check ran and compared something (how much of
        the topic it compares depends on the local broker's retention; the rehearsal's own readers
        compare everything)."""
        output = (self._step_dir("verify") / "stdout").read_text(errors="replace")
        lines = re.findall(
            r"^verify: (.+): (ok|mismatch|cannot run) "
            r"\((\d+) compared, \d+ mismatches(?:, (\d+) repaired)?\)$",
            output,
            re.M,
        )
        for what, status, compared, repaired in lines:
            self.log(f"verify step: {what}: {status}, {compared} compared, {repaired or 0} repaired")
        found = {what: (status, int(compared)) for what, status, compared, _ in lines}
        repaired = {what: int(count or 0) for what, _, _, count in lines}
        expected = (
            "kafka -> clicks ods_behavior.clickevent",
            "mysql -> dimension dim_db.products",
            "mysql -> dimension dim_db.user_member",
            "clicks -> views ads_behavior.product_views",
        )
        problems = [
            f"verify step: {what} did not run clean on something (found {found.get(what)})"
            for what in expected
            if found.get(what, ("", 0))[0] != "ok" or found[what][1] < 1
        ]
        wanted = {
            "mysql -> dimension dim_db.user_member": 1,
            "kafka -> clicks ods_behavior.clickevent": deleted_clicks,
        }
        if repaired != {what: wanted.get(what, 0) for what in found}:
            problems.append(
                f"verify step: repaired {repaired}, not the one deleted user_member row and the "
                f"{deleted_clicks} deleted click rows"
            )
        # The full findings go beside the tables (the stdout above is in the EMR logs bucket).
        stored = re.search(r"^verify: findings stored at (\S+)$", output, re.M)
        if stored is None:
            return [*problems, "verify step: did not store its findings beside the tables"]
        path = LocalS3(self.subs.local.s3_root).path_of(stored.group(1))
        if not path.is_file() or json.loads(path.read_text())["exit_code"] != 0:
            problems.append(f"verify step: no clean findings file at {stored.group(1)}")
        else:
            self.log(f"verify step: findings stored at {stored.group(1)}")
        return problems

    def _print_summary(self, seconds: float) -> None:
        self.log("")
        self.log("substitutions (AWS -> local, by value; keys unchanged):")
        for sub in self.subs.records.values():
            self.log(f"  {sub.what}: {sub.aws} -> {sub.local}  [unproven: {sub.unproven}]")
        self.log("")
        self.log(f"{'step':<12} {'exit':>4} {'seconds':>8}  arguments")
        for run in self.runs:
            self.log(f"{run.job:<12} {run.exit_code:>4} {run.seconds:>8.1f}  {_abridged(run.args)}")


def _mysql(state: dict):
    import pymysql

    m = state["mysql"]
    return pymysql.connect(
        host=m["host"], port=int(m["port"]), user=m["user"], password=m["password"], database=m["database"],
        ssl_ca=m["ssl_ca"], ssl_verify_cert=True,
    )  # fmt: skip


def _abridged(args: list[str]) -> str:
    """The step's arguments without the YARN-replacing prelude's script text."""
    shown = [a if len(a) < 120 else a[:40] + "…" for a in args]
    return " ".join(shown)


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        for child in children.get(current, []):
            found.append(child)
            todo.append(child)
    return found


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="make rehearse", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--assembly", type=Path, default=Path("cdk.out/dev"), help="synthesized dev cloud assembly"
    )
    parser.add_argument("--work-dir", type=Path, help="default: a temporary directory, removed afterwards")
    parser.add_argument("--clicks", type=int, default=2000)
    parser.add_argument("--rate", type=int, default=1000)
    args = parser.parse_args(argv)
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="lakehouse-rehearsal-"))
    try:
        return Rehearsal(args.assembly, work_dir, clicks=args.clicks, rate=args.rate,
                         log=lambda line: print(line, flush=True)).run()  # fmt: skip
    finally:
        if args.work_dir is None:
            shutil.rmtree(work_dir, ignore_errors=True)
