"""`lakehouse demo` (what `make demo` runs) completes on the embedded stack and shows a result."""

from __future__ import annotations

from support import run_cli


def test_demo_brings_the_stack_up_and_prints_a_query_result(local_stack):
    result = run_cli("demo", timeout=600)
    assert "demo done" in result.stdout
    # The seed products, written by Spark and read back through DuckDB.
    assert "test01" in result.stdout and "11.1100" in result.stdout
    assert local_stack.status()["healthy"] is True
