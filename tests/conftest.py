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
# cannot run a test that starts a server or synthesizes the CDK app by forgetting a decorator: by the
# fixtures it asks for, by the fixtures those reach through `request.getfixturevalue` (their params), and
# by the calls in its own code and its fixtures' code; and checked: while a test without these markers
# runs, a synth, a Spark session or the local stack raises (GUARDED).
STACK_FIXTURES = {"local_stack", "private_env"}  # the session's stack; test_local_stack's own one
SYNTH_FIXTURES = {"dev", "prod", "parked_dev", "synthesized"}  # tests/infra/conftest.py
SYNTH_CALLS = ("synthesize(", ".synth()", ".from_stack(")
SPARK_CALLS = ("build_spark(", "SparkSession.builder")
# The session's stack and Spark: a stack test using none of them brings its own (`own_stack`), and
# `make test` runs it beside the session's tests (scripts/run_tests.py).
SESSION_FIXTURES = {"stack_env", "local_stack", "lake_config", "spark", "pyiceberg_catalog"}


def _code(function) -> str:
    import inspect

    try:
        return inspect.getsource(function)
    except (OSError, TypeError):
        return ""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        definitions = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
        reached = {
            p for defs in definitions.values() for d in defs for p in (d.params or ()) if isinstance(p, str)
        }
        callspec = getattr(item, "callspec", None)  # a parametrized name fetched by getfixturevalue
        reached |= {v for v in (callspec.params.values() if callspec else ()) if isinstance(v, str)}
        code = _code(getattr(item, "function", None)) + "".join(
            _code(d.func) for defs in definitions.values() for d in defs
        )
        if used & STACK_FIXTURES or any(call in code for call in SPARK_CALLS):
            item.add_marker(pytest.mark.stack)
        if (used | reached) & SYNTH_FIXTURES or any(call in code for call in SYNTH_CALLS):
            item.add_marker(pytest.mark.synth)
        if item.get_closest_marker("stack") and not used & SESSION_FIXTURES:
            item.add_marker(pytest.mark.own_stack)


# What a test without those markers must not start, as (module, class, method, what): each raises
# while such a test runs, so every run of the suite checks every fast test's markers.
GUARDED = (
    ("pyspark.sql.session", "SparkSession.Builder", "getOrCreate", "a Spark session"),
    ("lakehouse.local.stack", "LocalStack", "up", "the local stack"),
    ("aws_cdk", "Stage", "synth", "a CDK synth"),
    ("aws_cdk", "App", "synth", "a CDK synth"),  # jsii gives App a synth of its own
    ("aws_cdk.assertions", "Template", "from_stack", "a CDK synth"),
    ("aws_cdk.assertions", "Annotations", "from_stack", "a CDK synth"),
)


@pytest.fixture(autouse=True)
def _fast_tests_start_nothing(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if any(request.node.get_closest_marker(m) for m in ("stack", "synth", "slow")):
        return
    import importlib
    import sys

    for module, owner, method, what in GUARDED:
        if module.startswith("aws_cdk") and "aws_cdk" not in sys.modules:
            continue  # never loaded, never synthesized (importing it would start Node for every test)
        target = importlib.import_module(module)
        for part in owner.split("."):
            target = getattr(target, part)

        def refuse(*args, what=what, **kwargs):
            raise RuntimeError(f"{what} started by a test not marked stack, synth or slow: mark it")

        monkeypatch.setattr(target, method, refuse)


@pytest.fixture(scope="session")
def last_release(tmp_path_factory: pytest.TempPathFactory):
    """The last release's tree (the commit of the release baseline, from git): its code runs with
    `PYTHONPATH` set to it, before the editable install's path to this checkout."""
    import subprocess
    import sys

    from lakehouse.release import current_baseline, extract_tree, resolve_commit

    tree = extract_tree(resolve_commit(current_baseline().commit), tmp_path_factory.mktemp("last-release"))
    probe = subprocess.run(
        [sys.executable, "-c", "import jobs; print(jobs.__file__)"],
        cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert probe.stdout.strip() == str(tree / "jobs" / "__init__.py"), probe.stdout
    return tree


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
