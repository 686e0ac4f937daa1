"""Shared fixtures: one embedded stack per test session, on its own state dir and ports.

The suite never touches a developer's running stack: it sets LAKEHOUSE_HOME and the port env vars
for itself (subprocesses such as `lakehouse ...` and job runs inherit them) and stops the stack
at the end.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

# jsii (every `import aws_cdk`) on the Node 22 `make setup` installs, also when pytest runs directly.
REPO_NODE = Path(__file__).resolve().parents[1] / "node_modules" / ".bin" / "node"
if REPO_NODE.exists():
    os.environ.setdefault("JSII_NODE", str(REPO_NODE))

# Markers follow what a test uses, so `make test-fast` (-m "not stack and not synth and not slow")
# cannot run a test that starts a server or synthesizes the CDK app by forgetting a decorator.
STACK_FIXTURES = {"local_stack", "private_env"}  # the session's stack; test_local_stack's own one
SYNTH_FIXTURES = {"dev", "prod", "parked_dev", "synthesized"}  # tests/infra/conftest.py


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        if used & STACK_FIXTURES:
            item.add_marker(pytest.mark.stack)
        if used & SYNTH_FIXTURES:
            item.add_marker(pytest.mark.synth)


@pytest.fixture(scope="session")
def stack_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    from lakehouse.local.settings import StackSettings

    env = StackSettings.on_free_ports(tmp_path_factory.mktemp("lakehouse-home")).environment()
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    yield env
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def local_stack(stack_env: dict[str, str]):
    from jobs.ingest.kafka_source import close_all_readers
    from lakehouse.local.settings import StackSettings
    from lakehouse.local.stack import LocalStack

    stack = LocalStack(StackSettings.resolve(stack_env["LAKEHOUSE_HOME"]))
    try:  # a part that failed to start must not leave the others running after the suite
        stack.up()
        yield stack
    finally:
        close_all_readers()  # the ingests this process ran kept theirs: they would retry the broker
        stack.down()


@pytest.fixture(scope="session")
def lake_config(local_stack):
    from jobs.config import LakehouseConfig

    return LakehouseConfig.local(local_stack.settings.home)


@pytest.fixture(scope="session")
def spark(lake_config):
    from jobs.common.spark_session import build_spark, stop_spark

    session = build_spark(lake_config, "tests", {"spark.sql.shuffle.partitions": "2"})
    yield session
    # Also stops py4j's callback server (MERGE commit properties): its threads would keep the
    # pytest process alive after the last test.
    stop_spark(session)


@pytest.fixture(scope="session")
def pyiceberg_catalog(local_stack):
    from lakehouse.local.catalog import pyiceberg_catalog as open_catalog

    return open_catalog(local_stack.settings.catalog_path, local_stack.settings.warehouse)
