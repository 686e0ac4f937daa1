"""`lakehouse local up|down|status` against real processes, on a private stack of this module.

The session stack (conftest) is shared by the job tests; lifecycle tests that stop, purge or
block ports run on their own state dir and ports so they cannot disturb it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
import uuid
from pathlib import Path

import pymysql
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from support import private_stack_env, run_cli


@pytest.fixture(scope="module")
def private_env(tmp_path_factory):
    env = private_stack_env(tmp_path_factory.mktemp("private-stack"))
    run_cli("local", "up", env=env)
    yield env
    run_cli("local", "down", "--purge", env=env, check=False)


def _status(env) -> tuple[int, dict]:
    result = run_cli("local", "status", "--json", "--show-secrets", env=env, check=False)
    return result.returncode, json.loads(result.stdout)


def _tls(state: dict) -> dict:
    """PyMySQL arguments that verify the local server against the stack's CA."""
    return {"ssl_ca": state["mysql"]["ssl_ca"], "ssl_verify_cert": True, "ssl_verify_identity": True}


def _mysql(state: dict, user_key: str = "user", password_key: str = "password", **extra):
    m = state["mysql"]
    return pymysql.connect(
        host=m["host"],
        port=m["port"],
        user=m[user_key],
        password=m[password_key],
        database=m["database"],
        **{**_tls(state), **extra},
    )


def test_status_json_has_the_documented_shape_and_is_healthy(private_env):
    code, state = _status(private_env)
    assert code == 0
    assert state["healthy"] is True
    assert set(state["mysql"]) >= {"host", "port", "user", "password", "database", "cdc_user", "cdc_password"}
    assert state["mysql"]["host"] == "127.0.0.1"
    assert state["mysql"]["port"] == int(private_env["LAKEHOUSE_MYSQL_PORT"])
    assert state["mysql"]["database"] == "user_db"
    assert state["kafka"] == {**state["kafka"], "topic": "clicktopic"}
    assert state["kafka"]["bootstrap"] == f"127.0.0.1:{private_env['LAKEHOUSE_KAFKA_PORT']}"
    home = private_env["LAKEHOUSE_HOME"]
    assert state["catalog"]["name"] == "lakehouse"
    assert state["catalog"]["uri"] == f"sqlite:///{home}/catalog.db"
    assert state["catalog"]["warehouse"] == f"{home}/warehouse"


def test_the_passwords_stay_in_owner_only_files_and_out_of_status_and_ps(private_env, monkeypatch):
    import stat
    import subprocess

    home = Path(private_env["LAKEHOUSE_HOME"])
    for name in ("stack.json", "secrets.json"):
        assert stat.S_IMODE((home / name).stat().st_mode) == 0o600, name
    _, with_secrets = _status(private_env)
    passwords = [with_secrets["mysql"][k] for k in ("password", "cdc_password")]
    assert all(passwords)
    printed = run_cli("local", "status", "--json", env=private_env, check=False).stdout
    assert not any(p in printed for p in passwords)
    assert json.loads(printed)["mysql"]["password"].startswith("<redacted: in ")

    # The admin statements (CREATE/ALTER USER ... IDENTIFIED BY) go in on stdin, not argv.
    from lakehouse.local.mariadb import MariaDb

    calls = []
    monkeypatch.setattr(
        subprocess,
        "run",
        lambda args, **kw: calls.append((args, kw)) or subprocess.CompletedProcess(args, 0, "1\n", ""),
    )
    MariaDb.admin_sql(
        type("M", (), {"socket": home / "mysql.sock"})(), f"ALTER USER x IDENTIFIED BY '{passwords[0]}'"
    )
    ((argv, kwargs),) = calls
    assert not any(passwords[0] in arg for arg in argv) and passwords[0] in kwargs["input"]


def test_human_status_is_a_table(private_env):
    result = run_cli("local", "status", env=private_env)
    for part in ("mysql", "kafka", "s3", "catalog"):
        assert part in result.stdout
    assert "down" not in result.stdout


def test_second_up_is_a_no_op(private_env):
    _, before = _status(private_env)
    result = run_cli("local", "up", env=private_env)
    _, after = _status(private_env)
    pids = [(before[p]["pid"], after[p]["pid"]) for p in ("mysql", "kafka", "s3")]
    assert all(b == a and b for b, a in pids), pids
    assert "local stack up" in result.stderr


def test_seed_rows_are_loaded_once(private_env):
    run_cli("local", "up", env=private_env)  # seeding again must not duplicate or fail
    _, state = _status(private_env)
    with _mysql(state) as conn, conn.cursor() as cur:
        cur.execute("SELECT productId, name, product_price FROM products ORDER BY productId")
        products = cur.fetchall()
        cur.execute("SELECT userid, memberLevel FROM user_member ORDER BY userid")
        members = cur.fetchall()
    assert [p[0] for p in products] == [str(i) for i in range(1, 10)]
    assert products[2][1] == "test03" and str(products[2][2]) == "11.1100"
    assert sorted(members) == sorted(
        [("513248", 1), ("10952", 2), ("555655", 3), ("795098", 4), ("603670", 5)]
    )


def test_binlog_is_row_based_with_full_images_and_metadata_in_utc(private_env):
    _, state = _status(private_env)
    with _mysql(state) as conn, conn.cursor() as cur:
        cur.execute(
            "SELECT @@log_bin, @@binlog_format, @@binlog_row_image, @@binlog_row_metadata, "
            "@@time_zone, @@gtid_strict_mode, @@bind_address"
        )
        assert cur.fetchone() == (1, "ROW", "FULL", "FULL", "+00:00", 1, "127.0.0.1")


def test_binlog_and_commits_are_durable_on_every_commit(private_env):
    # Else a crash can lose a binlog tail that the CDC job already applied to the lake.
    _, state = _status(private_env)
    with _mysql(state) as conn, conn.cursor() as cur:
        cur.execute("SELECT @@sync_binlog, @@innodb_flush_log_at_trx_commit")
        assert cur.fetchone() == (1, 1)


def _binlog_rows(state: dict, table: str) -> list[dict]:
    from pymysqlreplication import BinLogStreamReader
    from pymysqlreplication.row_event import WriteRowsEvent

    m = state["mysql"]
    with _mysql(state, "cdc_user", "cdc_password") as conn, conn.cursor() as cur:
        cur.execute("SHOW BINARY LOGS")
        oldest = cur.fetchone()[0]
    stream = BinLogStreamReader(
        connection_settings={
            "host": m["host"],
            "port": m["port"],
            "user": m["cdc_user"],
            "passwd": m["cdc_password"],
            **_tls(state),
        },
        server_id=4999,
        resume_stream=True,
        log_file=oldest,
        log_pos=4,
        blocking=False,
        only_events=[WriteRowsEvent],
        only_tables=[table],
    )
    try:
        return [row["values"] for event in stream for row in event.rows]
    finally:
        stream.close()


def test_mariadb_kill_9_keeps_committed_rows_and_their_binlog(private_env):
    _, state = _status(private_env)
    with _mysql(state) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE IF NOT EXISTS crash_test (id INT PRIMARY KEY, v VARCHAR(16))")
        cur.execute("DELETE FROM crash_test")
        conn.commit()
        for i in range(200):
            cur.execute("INSERT INTO crash_test VALUES (%s, %s)", (i, f"v{i}"))
            conn.commit()
        cur.execute("SELECT @@gtid_binlog_pos")
        gtid_before = cur.fetchone()[0]
    # kill -9 of the server: no shutdown, only what reached the disk (or the OS) survives.
    os.kill(state["mysql"]["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 30
    while _status(private_env)[0] == 0:
        assert time.monotonic() < deadline, "MariaDB still reported up after kill -9"
        time.sleep(0.2)
    run_cli("local", "up", env=private_env)
    code, state = _status(private_env)
    assert code == 0
    with _mysql(state) as conn, conn.cursor() as cur:
        cur.execute("SELECT id, v FROM crash_test")
        assert sorted(cur.fetchall()) == [(i, f"v{i}") for i in range(200)]
        cur.execute("SELECT @@gtid_binlog_pos")
        gtid_after = cur.fetchone()[0]
    # `local up` writes its bootstrap statements after the restart; nothing before them is missing.
    assert int(gtid_after.rsplit("-", 1)[1]) >= int(gtid_before.rsplit("-", 1)[1]), (gtid_before, gtid_after)
    written = [(r["id"], r["v"]) for r in _binlog_rows(state, "crash_test")]
    assert set(written) >= {(i, f"v{i}") for i in range(200)}  # the binlog still holds every row


def test_cdc_user_has_exactly_the_privileges_rds_gives_it(private_env):
    """The local CDC user is the RDS one (infra/seed_data.py): binlog, SELECT on the source database,
    the snapshot barrier row; it cannot write the source, lock, or FLUSH."""
    _, state = _status(private_env)
    with _mysql(state, "cdc_user", "cdc_password") as conn, conn.cursor() as cur:
        cur.execute("SHOW GRANTS FOR CURRENT_USER()")
        grants = [row[0] for row in cur.fetchall()]
        cur.execute("SELECT count(*) FROM user_db.products")
        assert cur.fetchone()[0] >= 1
        cur.execute(
            "INSERT INTO lakehouse_meta.cdc_snapshot_barrier (id, written_at) VALUES (1, NOW(6)) "
            "ON DUPLICATE KEY UPDATE written_at = NOW(6)"
        )
        refused = {}
        for what, statement in {
            "write the source": "INSERT INTO user_db.products (productId, name) VALUES ('x', 'y')",
            "global read lock": "FLUSH TABLES WITH READ LOCK",
            "table lock": "LOCK TABLES user_db.products READ",
            "read another database": "SELECT count(*) FROM mysql.user",
        }.items():
            try:
                cur.execute(statement)
                refused[what] = False
            except (pymysql.err.OperationalError, pymysql.err.ProgrammingError):
                refused[what] = True
    assert all(refused.values()), refused
    privileges = set()
    for grant in grants:
        if grant.startswith("GRANT USAGE"):
            continue
        granted, on = grant.removeprefix("GRANT ").split(" TO ", 1)[0].split(" ON ", 1)
        privileges |= {(p.strip(), on.replace("`", "")) for p in granted.split(",")}
    # MariaDB 10.11 reports REPLICATION CLIENT under its new name BINLOG MONITOR.
    assert privileges == {
        ("REPLICATION SLAVE", "*.*"),
        ("BINLOG MONITOR", "*.*"),
        ("SELECT", "user_db.*"),
        ("SELECT", "lakehouse_meta.cdc_snapshot_barrier"),
        ("INSERT", "lakehouse_meta.cdc_snapshot_barrier"),
        ("UPDATE", "lakehouse_meta.cdc_snapshot_barrier"),
    }, grants


def test_a_message_round_trips_through_clicktopic(private_env):
    _, state = _status(private_env)
    bootstrap = state["kafka"]["bootstrap"]
    payload = f"roundtrip-{uuid.uuid4()}".encode()
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all"})
    producer.produce("clicktopic", value=payload, partition=1)
    assert producer.flush(15) == 0
    assert _read_partition(bootstrap, 1) == [payload]


def test_status_counts_the_batches_the_broker_stores(private_env):
    """Each produced batch is one object in tansu's store, and every fetch lists them all: status
    shows the count per partition, so a slow broker has a visible cause."""
    _, before = _status(private_env)
    stored = before["kafka"]["stored_batches"]
    assert set(stored) == {"0", "1", "2"} and before["kafka"]["warning"] is None
    producer = Producer({"bootstrap.servers": before["kafka"]["bootstrap"], "linger.ms": 0})
    for index in range(5):  # five flushes: five batches
        producer.produce("clicktopic", value=f"batch-{index}".encode(), partition=2)
        assert producer.flush(15) == 0
    _, after = _status(private_env)
    assert after["kafka"]["stored_batches"]["2"] == stored["2"] + 5
    assert after["kafka"]["stored_batches"]["0"] == stored["0"]
    human = run_cli("local", "status", env=private_env).stdout
    assert "stored batches per partition of clicktopic" in " ".join(human.split())


def test_a_crowded_broker_is_named_with_the_way_out():
    from lakehouse.local.broker import SLOW_READS_BATCHES, slow_reads_warning

    assert slow_reads_warning({0: 10, 1: SLOW_READS_BATCHES, 2: 0}, "up") is None
    warning = slow_reads_warning({0: 10, 1: 2_500, 2: 4_000}, "up")
    assert "partition 1: 2,500, partition 2: 4,000" in warning and "partition 0" not in warning
    assert "start the ingest" in warning  # only what the lake has read may go
    assert "`lakehouse local up --trim-topic` starts it" in slow_reads_warning({0: 2_500}, "off")
    assert "see its log" in slow_reads_warning({0: 2_500}, "failing")


def _read_partition(bootstrap: str, partition: int) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "tests", "enable.auto.commit": False})
    consumer.assign([TopicPartition("clicktopic", partition, 0)])
    values, deadline = [], time.monotonic() + 20
    try:
        while time.monotonic() < deadline:
            batch = consumer.consume(100, 1.0)
            if not batch and values:
                break
            values += [m.value() for m in batch if m.error() is None]
    finally:
        consumer.close()
    metadata = Producer({"bootstrap.servers": bootstrap}).list_topics("clicktopic", timeout=10)
    assert len(metadata.topics["clicktopic"].partitions) == 3
    return values


@pytest.mark.stack
def test_a_taken_port_gives_a_clear_error(tmp_path):
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        env = {**os.environ, "LAKEHOUSE_HOME": str(tmp_path / "h"), "LAKEHOUSE_MYSQL_PORT": str(port)}
        result = run_cli("local", "up", env=env, check=False)
    assert result.returncode == 1
    message = " ".join(result.stderr.split())
    assert f"port {port} (mysql) is already in use" in message
    assert "LAKEHOUSE_MYSQL_PORT" in message


def test_down_keeps_data_and_up_recovers_stale_pid_files(private_env):
    _, state = _status(private_env)
    with _mysql(state) as conn, conn.cursor() as cur:
        cur.execute("INSERT INTO products (productId, name) VALUES ('keep-me', 'survivor')")
        conn.commit()
    bootstrap = state["kafka"]["bootstrap"]
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    producer.produce("clicktopic", value=b"durable", partition=2)
    assert producer.flush(15) == 0

    run_cli("local", "down", env=private_env)
    code, down_state = _status(private_env)
    assert code == 1 and down_state["healthy"] is False
    # A pid file naming a live process that is not ours (this test) must be treated as stale.
    run_dir = f"{private_env['LAKEHOUSE_HOME']}/run"
    with open(f"{run_dir}/tansu.pid", "w") as handle:
        handle.write(str(os.getpid()))

    run_cli("local", "up", env=private_env)
    code, state = _status(private_env)
    assert code == 0
    with _mysql(state) as conn, conn.cursor() as cur:
        cur.execute("SELECT name FROM products WHERE productId = 'keep-me'")
        assert cur.fetchone() == ("survivor",)
    assert b"durable" in _read_partition(bootstrap, 2)


@pytest.mark.stack
def test_down_purge_removes_all_state(tmp_path):
    env = private_stack_env(tmp_path / "purge-me")
    run_cli("local", "up", env=env)
    assert (tmp_path / "purge-me" / "catalog.db").exists()
    run_cli("local", "down", "--purge", env=env)
    assert not (tmp_path / "purge-me").exists()
    assert run_cli("local", "status", env=env, check=False).returncode == 1


def test_the_cdc_user_must_use_tls_and_the_server_is_verified(private_env, tmp_path):
    _, state = _status(private_env)
    with _mysql(state, "cdc_user", "cdc_password") as conn, conn.cursor() as cur:
        cur.execute("SHOW STATUS LIKE 'Ssl_version'")
        assert cur.fetchone()[1].startswith("TLS")
    # Without TLS the server refuses the CDC user (access denied, not a network error).
    with pytest.raises(pymysql.err.OperationalError) as refused:
        _mysql(state, "cdc_user", "cdc_password", ssl_ca=None, ssl_verify_cert=None, ssl_verify_identity=None,
               ssl_disabled=True)  # fmt: skip
    assert refused.value.args[0] == 1045
    # A client that trusts another CA does not accept this server.
    from lakehouse.local.tls import ensure_server_tls

    other = ensure_server_tls(tmp_path / "other", "127.0.0.1")
    with pytest.raises(
        pymysql.err.OperationalError, match="CERTIFICATE_VERIFY_FAILED|certificate verify failed"
    ):
        _mysql(state, "cdc_user", "cdc_password", ssl_ca=str(other.ca))


def test_the_topic_retention_runs_with_the_stack_and_can_be_turned_off(private_env):
    deadline = time.monotonic() + 60  # its first pass: imports, catalog and store opened
    while (retention := _status(private_env)[1]["topic_retention"])["seconds_since_pass"] is None:
        assert time.monotonic() < deadline, Path(retention["log"]).read_text()
        time.sleep(0.5)
    assert retention["running"] is True and retention["state"] == "up"
    assert retention["keep_batches"] == 500
    log = Path(retention["log"]).read_text()
    assert "keeping the newest 500 batches" in log and "Traceback" not in log

    run_cli("local", "up", "--keep-topic", env=private_env)
    code, kept = _status(private_env)
    assert kept["topic_retention"]["state"] == "off" and code == 0  # optional: still healthy
    assert "off" in run_cli("local", "status", env=private_env).stdout
    run_cli("local", "up", env=private_env)  # what `lakehouse demo` does: the choice is kept
    assert _status(private_env)[1]["topic_retention"]["running"] is False
    run_cli("local", "up", "--trim-topic", env=private_env)
    assert _status(private_env)[1]["topic_retention"]["running"] is True
