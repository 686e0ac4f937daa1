"""Arguments every job takes to find its environment (`--env local` or the AWS values)."""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable

from jobs.config import ENVIRONMENTS, ConfigError, LakehouseConfig


class JobArgumentParser(argparse.ArgumentParser):
    """argparse whose errors are one line; the usage is in --help rather than before every error."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def reports_config_errors(main: Callable[..., int]) -> Callable[..., int]:
    """A job's main that prints a ConfigError (bad settings, refused credentials, unreachable
    source) as one `error:` line and exits 2 instead of a traceback; raised before any write."""

    @functools.wraps(main)
    def guarded(*args, **kwargs) -> int:
        try:
            return main(*args, **kwargs)
        except ConfigError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2

    return guarded


def add_environment_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("environment")
    group.add_argument("--env", choices=ENVIRONMENTS, default=os.environ.get("LAKEHOUSE_ENV", "local"))
    group.add_argument("--home", help="local state dir (default $LAKEHOUSE_HOME or ./.lakehouse)")
    # On EMR the CDK deployer passes these as step arguments.
    # The Iceberg catalog and its warehouse come from the cluster's spark-defaults, not from here.
    group.add_argument("--region")
    group.add_argument("--kafka-bootstrap", help="MSK bootstrap brokers (IAM, port 9098)")
    group.add_argument("--kafka-auth", choices=("iam", "plaintext"), default="iam")
    group.add_argument("--mysql-host")
    group.add_argument("--mysql-port", type=int, default=3306)
    group.add_argument("--mysql-cdc-secret-id", help="Secrets Manager id of the CDC user")
    group.add_argument(
        "--mysql-ssl-ca",
        default="rds",
        help="CA bundle the MySQL server is verified against (rds: Amazon RDS's, shipped with the jobs)",
    )


def config_from_args(args: argparse.Namespace) -> LakehouseConfig:
    if args.env == "local":
        return LakehouseConfig.local(args.home)
    missing = [
        flag
        for flag, value in (
            ("--region", args.region),
            ("--kafka-bootstrap", args.kafka_bootstrap),
            ("--mysql-host", args.mysql_host),
            ("--mysql-cdc-secret-id", args.mysql_cdc_secret_id),
        )
        if not value
    ]
    if missing:
        raise ConfigError(f"--env {args.env} needs {', '.join(missing)} (the CDK step passes them)")
    return LakehouseConfig.aws(
        env=args.env,
        region=args.region,
        kafka_bootstrap=args.kafka_bootstrap,
        kafka_auth=args.kafka_auth,
        mysql_host=args.mysql_host,
        mysql_port=args.mysql_port,
        mysql_cdc_secret_id=args.mysql_cdc_secret_id,
        mysql_ssl_ca=args.mysql_ssl_ca,
    )
