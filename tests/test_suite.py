"""The suite's own promises: a test `make test-fast` runs starts no CDK synth, no server and no Spark
session (tests/conftest.py guards every such test while it runs; this is the guard's positive control)."""

from __future__ import annotations

import pytest
from aws_cdk import App, Stack  # loaded at collection, as by every infra test module


def test_a_fast_test_cannot_start_spark_or_the_stack():
    from pyspark.sql import SparkSession

    from lakehouse.local.stack import LocalStack

    # (spelt so that the collection hook, which reads test code, does not mark this test stack)
    builder = getattr(SparkSession, "builder")  # noqa: B009
    with pytest.raises(RuntimeError, match="a Spark session started by a test not marked"):
        builder.master("local[1]").getOrCreate()
    with pytest.raises(RuntimeError, match="the local stack started by a test not marked"):
        LocalStack.up(None)


def test_a_fast_test_cannot_synthesize_once_the_cdk_is_loaded():
    app = App()
    Stack(app, "Probe")
    with pytest.raises(RuntimeError, match="a CDK synth started by a test not marked"):
        getattr(app, "synth")()  # noqa: B009 - spelt so that the collection hook does not mark it synth


@pytest.mark.synth
def test_a_synth_test_may_synthesize():
    app = App()
    Stack(app, "Probe")
    assert app.synth().stacks
