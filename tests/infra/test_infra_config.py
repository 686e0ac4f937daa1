"""The typed deployment config and how app.py turns CLI context into it."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
from aws_cdk import App

from infra.config import DeploymentConfig, Removal
from infra.lakehouse_app import config_from_context
from jobs.config import ConfigError

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_unknown_environment_says_what_to_pass():
    with pytest.raises(ConfigError, match=r"-c env=dev or -c env=prod"):
        DeploymentConfig.for_env("staging")


def test_context_defaults_to_dev_and_stays_environment_agnostic():
    config = config_from_context(App(), environ={})
    assert config.env_name == "dev"
    assert (config.account, config.region, config.availability_zones) == (None, None, None)


def test_account_bound_synth_uses_the_azs_the_preflight_pinned():
    environ = {"CDK_DEFAULT_ACCOUNT": "111122223333", "CDK_DEFAULT_REGION": "eu-west-1"}
    pinned = {
        "lakehouse:availability-zones:account=111122223333:region=eu-west-1": [
            "eu-west-1c",
            "eu-west-1a",
            "eu-west-1b",
        ]
    }
    config = config_from_context(App(context={"env": "prod", **pinned}), environ=environ)
    assert (config.account, config.region) == ("111122223333", "eu-west-1")
    assert config.availability_zones == ("eu-west-1c", "eu-west-1a", "eu-west-1b")


def test_account_bound_synth_never_guesses_az_names_and_still_lets_cdk_bootstrap_run():
    """`cdk bootstrap` in this folder synthesizes the app with the credentials' account before the
    preflight has pinned any AZ: the app must build (an exception failed the README's second command),
    while the Network stack carries an error that stops `cdk synth`/`cdk deploy` (the CLI refuses a
    stack with error annotations unless --ignore-errors)."""
    from aws_cdk.assertions import Annotations, Match

    from infra.stacks import NetworkStack

    environ = {"CDK_DEFAULT_ACCOUNT": "111122223333", "CDK_DEFAULT_REGION": "us-east-1"}
    app = App(context={"env": "dev"})
    config = config_from_context(app, environ=environ)
    assert config.availability_zones is None
    assert "lakehouse aws preflight --env dev --pin-azs" in config.unpinned_azs_error
    stack = NetworkStack(app, config)
    Annotations.from_stack(stack).has_error("*", Match.string_like_regexp("--pin-azs"))
    pinned = config_from_context(App(context={"env": "dev", "azs": "us-east-1a,us-east-1b"}), environ)
    assert pinned.unpinned_azs_error is None
    assert DeploymentConfig.for_env("dev").unpinned_azs_error is None  # agnostic: nothing to pin


def test_azs_context_overrides_and_is_checked():
    environ = {"CDK_DEFAULT_ACCOUNT": "111122223333", "CDK_DEFAULT_REGION": "ap-northeast-1"}
    app = App(context={"env": "dev", "azs": "ap-northeast-1a,ap-northeast-1c"})
    assert config_from_context(app, environ).availability_zones == (
        "ap-northeast-1a",
        "ap-northeast-1c",
    )
    with pytest.raises(ConfigError, match="availability zones"):
        config_from_context(App(context={"env": "prod", "azs": "x-1a"}), environ)


def test_half_an_environment_stays_agnostic():
    config = DeploymentConfig.for_env("dev", region="us-east-1")
    assert (config.account, config.region) == (None, None)


def test_dev_and_prod_differ_by_values_and_prod_keeps_data():
    dev, prod = DeploymentConfig.for_env("dev"), DeploymentConfig.for_env("prod")
    assert [f.name for f in dataclasses.fields(dev)] == [f.name for f in dataclasses.fields(prod)]
    assert dev.removal_policy == Removal.DESTROY
    assert dev.database_removal_policy == Removal.DESTROY
    assert prod.removal_policy == Removal.RETAIN
    assert prod.database_removal_policy == Removal.SNAPSHOT
    assert (dev.network.max_azs, prod.network.max_azs) == (2, 3)
    assert dev.network.nat_gateways == 1
    assert dev.compute.idle_timeout_hours is not None and prod.compute.idle_timeout_hours is None
    assert dev.compute.task_spot_units > 0
    assert dev.compute.release_label == prod.compute.release_label == "emr-7.14.0"


def test_account_bound_synth_needs_no_lookup(tmp_path):
    """With CDK_DEFAULT_ACCOUNT/REGION (a deploy), synth still makes no context lookup."""
    import json
    from pathlib import Path

    from infra.lakehouse_app import build_lakehouse

    context = json.loads((Path(__file__).resolve().parents[2] / "cdk.json").read_text())["context"]
    pinned = {
        "lakehouse:availability-zones:account=111122223333:region=us-east-1": [
            "us-east-1b",
            "us-east-1c",
            "us-east-1d",
        ]
    }
    app = App(context={**context, **pinned, "env": "prod"}, outdir=str(tmp_path))
    environ = {"CDK_DEFAULT_ACCOUNT": "111122223333", "CDK_DEFAULT_REGION": "us-east-1"}
    build_lakehouse(app, config_from_context(app, environ))
    assembly = app.synth()  # cdk-nag runs here too; findings would raise
    manifest = json.loads((Path(assembly.directory) / "manifest.json").read_text())
    assert not manifest.get("missing"), manifest.get("missing")
    network = json.loads((Path(assembly.directory) / "Lakehouse-prod-Network.template.json").read_text())
    azs = {
        r["Properties"]["AvailabilityZone"]
        for r in network["Resources"].values()
        if r["Type"] == "AWS::EC2::Subnet"
    }
    assert azs == {"us-east-1b", "us-east-1c", "us-east-1d"}


def test_operator_commands_never_load_the_cdk():
    """`lakehouse aws ...` reads the config; importing aws_cdk would start Node through jsii for
    every command. The positive control: the CDK app's own modules do load it."""
    probe = (
        "import importlib, sys; importlib.import_module(sys.argv[1]); "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'aws_cdk', 'jsii', 'constructs'}))"
    )
    operator_modules = (
        "lakehouse.cli",
        "lakehouse.aws.operate",
        "lakehouse.aws.park",
        "lakehouse.aws.preflight",
        "infra.config",
        "infra.emr_steps",
        "infra.emr_package",
        "infra.seed_data",
    )
    for module in (*operator_modules, "infra.cdk_values"):
        loaded = subprocess.run(
            [sys.executable, "-c", probe, module], capture_output=True, text=True, check=True
        ).stdout.strip()
        expected = "[]" if module in operator_modules else "['aws_cdk', 'constructs', 'jsii']"
        assert loaded == expected, f"{module} loads {loaded}"
    # Imports inside functions run only when a command does (`lakehouse aws park` importing the app):
    # every module an operator module imports anywhere must load no CDK either.
    inside = set()
    for module in operator_modules:
        path = REPO_ROOT / (module.replace(".", "/") + ".py")
        inside |= imported_modules(path.read_text())
    assert not {m for m in inside if m.split(".")[0] in CDK_PACKAGES}, sorted(inside)
    for module in sorted(m for m in inside if m.split(".")[0] in ("infra", "lakehouse", "jobs")):
        loaded = subprocess.run(
            [sys.executable, "-c", probe, module], capture_output=True, text=True, check=True
        ).stdout.strip()
        assert loaded == "[]", f"{module}, imported by an operator command, loads {loaded}"


CDK_PACKAGES = {"aws_cdk", "constructs", "jsii"}


def imported_modules(source: str) -> set[str]:
    """Every module a source file imports, at module level or inside a function."""
    import ast

    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found |= {
                f"{node.module}.{alias.name}"
                for alias in node.names
                if _is_module(f"{node.module}.{alias.name}")
            }
    return found


def _is_module(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def test_an_import_of_the_cdk_inside_a_command_function_is_found():
    command = "\n".join(
        [
            "def park():",
            "    from aws_cdk import App",
            "    import infra.stacks",
            "    from infra import lakehouse_app",
        ]
    )
    assert imported_modules(command) == {"aws_cdk", "infra.stacks", "infra", "infra.lakehouse_app"}


def test_plain_config_values_convert_to_cdk_types():
    from aws_cdk import RemovalPolicy
    from aws_cdk import aws_logs as logs

    from infra.cdk_values import log_retention, removal_policy

    assert removal_policy(Removal.SNAPSHOT) == RemovalPolicy.SNAPSHOT
    assert log_retention(7) == logs.RetentionDays.ONE_WEEK
    with pytest.raises(ValueError, match="CloudWatch Logs accepts 1, 3, 5, 7"):
        log_retention(10)
    for env in ("dev", "prod"):
        config = DeploymentConfig.for_env(env)
        for days in (
            config.network.flow_log_retention_days,
            config.kafka.broker_log_retention_days,
            config.jobs.log_retention_days,
        ):
            log_retention(days)  # every configured retention is one CloudWatch accepts


def test_lake_readers_and_security_admins_are_role_arns_from_the_context():
    analysts, operator = "arn:aws:iam::111122223333:role/analysts", "arn:aws:iam::111122223333:role/ops/tls"
    app = App(context={"env": "prod", "lake_readers": f"{analysts}, ", "security_admins": [operator]})
    access = config_from_context(app, environ={}).access
    assert (access.lake_readers, access.security_admins) == ((analysts,), (operator,))
    assert config_from_context(App(context={"env": "dev"}), environ={}).access.lake_readers == ()
    # A bucket policy's aws:PrincipalArn of an assumed role is the role's ARN: a user or a session
    # ARN would never match, so it is refused rather than silently locking the reader out.
    for wrong in (
        "arn:aws:iam::111122223333:user/alice",
        "arn:aws:sts::111122223333:assumed-role/a/b",
        "analysts",
    ):
        with pytest.raises(ConfigError, match="not an IAM role ARN"):
            config_from_context(App(context={"env": "prod", "lake_readers": wrong}), environ={})


def test_dev_adds_the_pinned_lake_readers_and_prod_does_not():
    from infra.config import DEV_LAKE_READERS_CONTEXT_KEY

    me, analyst = "arn:aws:iam::111122223333:role/me", "arn:aws:iam::111122223333:role/analyst"
    context = {DEV_LAKE_READERS_CONTEXT_KEY: [me], "lake_readers": analyst}
    dev = config_from_context(App(context={"env": "dev", **context}), environ={})
    assert dev.access.lake_readers == (analyst, me)
    prod = config_from_context(App(context={"env": "prod", **context}), environ={})
    assert prod.access.lake_readers == (analyst,)
