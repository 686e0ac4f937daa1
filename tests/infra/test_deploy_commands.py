"""The deploy procedures of README.md and infra/README.md, run as written against a moto server.

The commands are read from the docs, not copied into the test, and run in a copy of the checkout
(cdk.context.json and cdk.out are written there) with a role's credentials and a region in the
environment, as a user's shell would have them. They run until the first call that needs real AWS:
CloudFormation's CreateChangeSet, which moto's server answers with NoSuchBucket ("The specified bucket
does not exist": it does not find the template the CLI uploaded to the bootstrap bucket;
ENVIRONMENT.md, 2026-11-28). A command that fails before it reaches AWS (the app raising at `cdk
bootstrap`, a synth error, the preflight refusing to pin) fails the test.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from infra.config import DEV_LAKE_READERS_CONTEXT_KEY, az_context_key
from lakehouse.rehearsal.moto_server import MotoServer

REPO = Path(__file__).resolve().parents[2]
ACCOUNT, REGION = "123456789012", "us-east-1"  # moto's account
# Where the procedures stop on this machine, and why.
NEEDS_REAL_AWS = "The specified bucket does not exist"  # NoSuchBucket: moto cannot read the uploaded template
# Preflight checks moto cannot answer (an answer from real AWS is needed), by check name.
MOTO_GAPS = {
    "EC2 On-Demand vCPUs": "moto has no Service Quotas values for EC2",
    "EMR release": "moto's EMR lists no release labels",
}
# Already run by `make test` itself; in a copy of the checkout it would re-point the editable install.
RUN_BY_MAKE_TEST = {"make setup"}

pytestmark = [pytest.mark.synth, pytest.mark.slow, pytest.mark.timeout(1200)]


def commands_under(doc: Path, heading: str) -> list[str]:
    """The commands of the first ```bash block after `heading`: one per line, continuations joined,
    comments and `export` lines of placeholders (<profile>) left out."""
    text = doc.read_text()
    start = text.index(heading)
    block = re.search(r"```bash\n(.*?)```", text[start:], re.S)
    assert block, f"no bash block under {heading!r} in {doc.name}"
    commands, current = [], ""
    for line in block.group(1).splitlines():
        line = re.sub(r"(^|\s{2,})#.*$", "", line).rstrip()
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        current += line
        if current.strip():
            commands.append(current.strip())
        current = ""
    return commands


@pytest.fixture(scope="module")
def moto(tmp_path_factory):
    server = MotoServer(tmp_path_factory.mktemp("moto") / "moto.log")
    server.start()
    yield server
    server.stop()


def checkout_copy(where: Path) -> Path:
    """The working tree's files (tracked and new), with the installed tools and the built jobs
    package linked, as a user's clone after `make setup` has them."""
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    for name in files:
        source = REPO / name
        if source.is_file():
            (where / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, where / name)
    for linked in ("node_modules", ".venv", "dist"):
        if (REPO / linked).exists():
            (where / linked).symlink_to(REPO / linked)
    (where / "cdk.context.json").unlink(missing_ok=True)
    return where


def assumed_role(moto: MotoServer) -> dict[str, str]:
    """Credentials of a role session, as an SSO or assumed-role profile gives them (moto's)."""
    import boto3

    trust = {"Effect": "Allow", "Action": "sts:AssumeRole", "Principal": {"AWS": ACCOUNT}}
    iam = moto.client("iam", REGION)
    role = iam.create_role(
        RoleName="Deployer",
        AssumeRolePolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": [trust]}),
    )["Role"]
    sts = boto3.client("sts", region_name=REGION, endpoint_url=moto.endpoint, **{
        k.lower(): v for k, v in moto.credentials.items()
    })  # fmt: skip
    credentials = sts.assume_role(RoleArn=role["Arn"], RoleSessionName="me")["Credentials"]
    return {
        "AWS_ACCESS_KEY_ID": credentials["AccessKeyId"],
        "AWS_SECRET_ACCESS_KEY": credentials["SecretAccessKey"],
        "AWS_SESSION_TOKEN": credentials["SessionToken"],
    }


def user_shell(moto: MotoServer, checkout: Path) -> dict[str, str]:
    """A user's shell as the docs set it up: a role's credentials and a region (here moto's), and
    `export PATH="$PWD/node_modules/.bin:$PWD/.venv/bin:$PATH"`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "CDK_", "JSII_"))}
    env.update(assumed_role(moto))
    env.update(
        AWS_ENDPOINT_URL=moto.endpoint,
        AWS_REGION=REGION,
        AWS_DEFAULT_REGION=REGION,
        AWS_EC2_METADATA_DISABLED="true",
        AWS_CONFIG_FILE="/dev/null",
        AWS_SHARED_CREDENTIALS_FILE="/dev/null",
        PATH=f"{checkout}/node_modules/.bin:{checkout}/.venv/bin:{env['PATH']}",
    )
    return env


def run(command: str, checkout: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-c", command], cwd=checkout, env=env, capture_output=True, text=True, timeout=900
    )


def preflight_findings(checkout: Path, env: dict[str, str], env_name: str) -> dict[str, dict]:
    result = run(f"lakehouse aws preflight --env {env_name} --json", checkout, env)
    return {c["name"]: c for c in json.loads(result.stdout)["checks"]}


def assert_stopped_only_where_real_aws_is_needed(result: subprocess.CompletedProcess, command: str) -> None:
    output = result.stdout + result.stderr
    assert "Synthesis finished with errors" not in output and "Traceback" not in output, output[-4000:]
    if result.returncode != 0:
        assert NEEDS_REAL_AWS in output, f"{command} failed before reaching AWS:\n{output[-4000:]}"
        assert "creating CloudFormation changeset" in output, output[-4000:]


def test_the_readme_deploy_section_runs_as_written(moto, tmp_path):
    commands = commands_under(REPO / "README.md", "## Deploy in three commands")
    assert len(commands) == 3 and commands[0] == "make setup", commands
    checkout = checkout_copy(tmp_path / "clone")
    env = user_shell(moto, checkout)

    bootstrap_and_preflight = run(commands[1], checkout, env)
    output = bootstrap_and_preflight.stdout + bootstrap_and_preflight.stderr
    # `cdk bootstrap` synthesizes the app with the credentials' account before anything is pinned:
    # it must not fail there (it did, and `&&` then skipped the preflight that pins the AZs).
    assert f"Environment aws://{ACCOUNT}/{REGION} bootstrapped" in output, output[-4000:]
    assert "pinned [" in output and "as a dev lake reader" in output, output[-4000:]
    context = json.loads((checkout / "cdk.context.json").read_text())
    assert len(context[az_context_key(ACCOUNT, REGION)]) == 2
    assert context[DEV_LAKE_READERS_CONTEXT_KEY] == [f"arn:aws:iam::{ACCOUNT}:role/Deployer"]
    failing = {name for name, check in preflight_findings(checkout, env, "dev").items() if not check["ok"]}
    assert failing <= set(MOTO_GAPS), f"the preflight found more than moto's gaps: {failing - set(MOTO_GAPS)}"

    deploy = run(commands[2], checkout, env)
    assert_stopped_only_where_real_aws_is_needed(deploy, commands[2])
    # The first stack in deploy order got as far as CloudFormation, with its assets published.
    assert "Lakehouse-dev-Lake: creating CloudFormation changeset" in deploy.stdout + deploy.stderr


def test_infra_readme_gives_the_same_dev_procedure():
    """infra/README's 'Before the first deploy' and 'Deploy (dev)' are the README's three commands, with
    the shell set-up spelled out (the test above runs them)."""
    before = commands_under(REPO / "infra" / "README.md", "## Before the first deploy")
    deploy = commands_under(REPO / "infra" / "README.md", "## Deploy (dev)")
    readme = commands_under(REPO / "README.md", "## Deploy in three commands")
    steps = [c.replace(".venv/bin/lakehouse", "lakehouse") for c in before if not c.startswith("export ")]
    assert " && ".join(steps[1:]) == readme[1] and steps[0] == readme[0], steps
    assert deploy == [readme[2]]
    assert any(c.startswith("export PATH=") for c in before)
