"""MariaDB with a ROW binlog: the local stand-in for RDS for MySQL."""

from __future__ import annotations

import getpass
import os
import shutil
import subprocess
from pathlib import Path

import pymysql

from infra import seed_data
from jobs.config import SOURCE_DATABASE
from lakehouse.local.process import ManagedProcess, StackError
from lakehouse.local.settings import StackSettings
from lakehouse.local.tls import ServerTls, ensure_server_tls

APP_USER = "lakehouse_app"
CDC_USER = "lakehouse_cdc"

# The seed is shared with the RDS seeding Lambda (infra/seed_data.py).
SEED = {
    "products": (seed_data.PRODUCTS_DDL, seed_data.INSERT_PRODUCT, seed_data.PRODUCT_ROWS),
    "user_member": (seed_data.USER_MEMBER_DDL, seed_data.INSERT_USER_MEMBER, seed_data.USER_MEMBER_ROWS),
}


def _server_binary() -> str:
    for name in ("mariadbd", "mysqld"):
        path = shutil.which(name) or (f"/usr/sbin/{name}" if Path(f"/usr/sbin/{name}").exists() else None)
        if path:
            return path
    raise StackError("MariaDB is not installed: run `make setup` (installs mariadb-server)")


class MariaDb:
    def __init__(self, settings: StackSettings) -> None:
        self.settings = settings
        self.process = ManagedProcess("mariadb", settings.run_dir, settings.log_dir, "mariadbd")

    @property
    def datadir(self) -> Path:
        return self.settings.mysql_dir / "data"

    @property
    def socket(self) -> Path:
        return self.settings.run_dir / "mariadb.sock"

    @property
    def tls_dir(self) -> Path:
        return self.settings.mysql_dir / "tls"

    @property
    def defaults_file(self) -> Path:
        return self.settings.mysql_dir / "my.cnf"

    def _write_defaults(self, tls: ServerTls) -> None:
        as_root = os.geteuid() == 0
        # Note: binlog_row_metadata=FULL makes the binlog carry column names (else UNKNOWN_COLn);
        # UTC so TIMESTAMP values read from the binlog need no zone guessing. sync_binlog=1 and
        # innodb_flush_log_at_trx_commit=1 (as on RDS): a committed transaction is on disk in both
        # the binlog and InnoDB, so a crash cannot lose a binlog tail the CDC job already applied.
        self.defaults_file.write_text(
            "\n".join(
                [
                    "[mariadbd]",
                    f"datadir={self.datadir}",
                    f"socket={self.socket}",
                    f"port={self.settings.mysql_port}",
                    f"bind-address={self.settings.host}",
                    f"pid-file={self.settings.run_dir / 'mariadbd.internal.pid'}",
                    f"log-error={self.settings.log_dir / 'mariadb-error.log'}",
                    *(["user=root"] if as_root else []),
                    "server_id=1",
                    "log_bin=mysql-bin",
                    "binlog_format=ROW",
                    "binlog_row_image=FULL",
                    "binlog_row_metadata=FULL",
                    "gtid_strict_mode=ON",
                    "sync_binlog=1",
                    "innodb_flush_log_at_trx_commit=1",
                    "binlog_expire_logs_seconds=604800",
                    "default_time_zone='+00:00'",
                    "character-set-server=utf8mb4",
                    "collation-server=utf8mb4_general_ci",
                    "skip-name-resolve",
                    "innodb_buffer_pool_size=128M",
                    "innodb_log_file_size=64M",
                    "max_connections=200",
                    # TLS as on RDS: the CDC user must use it, and the jobs verify this certificate.
                    f"ssl-ca={tls.ca}",
                    f"ssl-cert={tls.certificate}",
                    f"ssl-key={tls.key}",
                    "",
                ]
            )
        )

    def start(self, secrets: dict[str, str]) -> None:
        if self.process.is_running():
            return
        self.settings.mysql_dir.mkdir(parents=True, exist_ok=True)
        self.settings.log_dir.mkdir(parents=True, exist_ok=True)
        self._write_defaults(ensure_server_tls(self.tls_dir, self.settings.host))
        if not (self.datadir / "mysql").exists():
            self._install_datadir()
        self.process.start([_server_binary(), f"--defaults-file={self.defaults_file}"])
        self.process.wait_until(self._accepts_admin, 60, f"socket {self.socket}")
        self._bootstrap(secrets)

    def _install_datadir(self) -> None:
        installer = shutil.which("mariadb-install-db") or shutil.which("mysql_install_db")
        if not installer:
            raise StackError("mariadb-install-db not found: run `make setup`")
        result = subprocess.run(
            [
                installer,
                f"--defaults-file={self.defaults_file}",
                f"--datadir={self.datadir}",
                "--skip-test-db",
                "--auth-root-authentication-method=socket",
                f"--auth-root-socket-user={getpass.getuser()}",
            ],
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            raise StackError(f"mariadb-install-db failed:\n{result.stdout}\n{result.stderr}")

    def admin_sql(self, sql: str) -> str:
        """Run SQL as the local superuser over the unix socket (socket auth, no password). The SQL
        goes in on stdin: on the command line, `IDENTIFIED BY '<password>'` would show in `ps`."""
        result = subprocess.run(
            ["mariadb", f"--socket={self.socket}", "-u", "root", "-N", "-B"],
            input=sql,
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            raise StackError(f"MariaDB admin statement failed: {result.stderr.strip()}")
        return result.stdout

    def _accepts_admin(self) -> bool:
        return self.socket.exists() and self.admin_sql("SELECT 1").strip() == "1"

    def _bootstrap(self, secrets: dict[str, str]) -> None:
        app_pw = secrets["mysql_app_password"]
        cdc_pw = secrets["mysql_cdc_password"]
        statements = [
            f"CREATE DATABASE IF NOT EXISTS {SOURCE_DATABASE}",
            f"CREATE DATABASE IF NOT EXISTS {seed_data.CDC_BARRIER_DATABASE}",
            seed_data.CDC_BARRIER_DDL,
        ]
        for host in ("127.0.0.1", "localhost"):
            statements += [
                f"CREATE USER IF NOT EXISTS '{APP_USER}'@'{host}' IDENTIFIED BY '{app_pw}'",
                f"ALTER USER '{APP_USER}'@'{host}' IDENTIFIED BY '{app_pw}'",
                f"GRANT ALL PRIVILEGES ON {SOURCE_DATABASE}.* TO '{APP_USER}'@'{host}'",
                f"CREATE USER IF NOT EXISTS '{CDC_USER}'@'{host}' IDENTIFIED BY '{cdc_pw}'",
                f"ALTER USER '{CDC_USER}'@'{host}' IDENTIFIED BY '{cdc_pw}' REQUIRE SSL",
                # Exactly the CDC user's privileges on RDS (the seeding Lambda grants the same), so
                # the tested path is the production path; an older stack's wider grant goes first.
                f"REVOKE ALL PRIVILEGES, GRANT OPTION FROM '{CDC_USER}'@'{host}'",
                *(
                    f"GRANT {privileges} ON {on} TO '{CDC_USER}'@'{host}'"
                    for privileges, on in seed_data.cdc_grants(SOURCE_DATABASE)
                ),
            ]
        self.admin_sql(";\n".join(statements))
        self._seed(app_pw)

    def _seed(self, app_password: str) -> None:
        """Create and fill each seed table once; an existing table is left as it is."""
        conn = self.connect(APP_USER, app_password)
        try:
            with conn.cursor() as cur:
                cur.execute("SHOW TABLES")
                existing = {row[0] for row in cur.fetchall()}
                for table, (ddl, insert, rows) in SEED.items():
                    if table in existing:
                        continue
                    cur.execute(ddl)
                    cur.executemany(insert, rows)
            conn.commit()
        finally:
            conn.close()

    def connect(self, user: str, password: str, database: str = SOURCE_DATABASE) -> pymysql.Connection:
        return pymysql.connect(
            host=self.settings.host,
            port=self.settings.mysql_port,
            user=user,
            password=password,
            database=database,
            connect_timeout=5,
        )

    def healthy(self, secrets: dict[str, str]) -> bool:
        if not self.process.is_running():
            return False
        try:
            self.connect(APP_USER, secrets["mysql_app_password"]).close()
            return True
        except pymysql.MySQLError:
            return False

    def stop(self) -> bool:
        return self.process.stop(timeout=60)
