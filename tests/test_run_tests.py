"""scripts/run_tests.py (`make test`): two pytest runs at once that split the suite by markers; its
exit status fails when either fails, and a group with nothing selected (pytest's 5) is no failure."""

from __future__ import annotations

import importlib.util
import itertools
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def load_runner():
    spec = importlib.util.spec_from_file_location("run_tests", REPO / "scripts" / "run_tests.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_two_marker_expressions_split_every_test_once():
    runner = load_runner()
    for stack, synth in itertools.product((False, True), repeat=2):
        marks = {"stack": stack, "synth": synth}
        in_stack = eval(runner.STACK, {}, marks)  # noqa: S307 - our own constants
        in_others = eval(runner.OTHERS, {}, marks)  # noqa: S307
        assert in_stack != in_others, marks


@pytest.mark.parametrize(
    ("stack", "others", "expected"),
    [(0, 0, 0), (0, 5, 0), (5, 0, 0), (1, 0, 1), (0, 1, 1), (2, 1, 2), (0, 2, 2)],
)
def test_the_exit_status_fails_when_either_group_fails(monkeypatch, tmp_path, stack, others, expected):
    runner = load_runner()
    monkeypatch.setattr(runner, "LOG", tmp_path / "others.log")
    calls: list[list[str]] = []

    class Others:
        def __init__(self, command, **kwargs):
            calls.append(command)
            kwargs["stdout"].write("others' output\n")

        def wait(self):
            return others

    def call(command, **kwargs):
        calls.append(command)
        return stack

    monkeypatch.setattr(subprocess, "Popen", Others)
    monkeypatch.setattr(subprocess, "call", call)
    monkeypatch.setattr(runner, "REPO", tmp_path)
    assert runner.main(["-x"]) == expected
    assert calls == [
        [sys.executable, "-m", "pytest", "-m", runner.OTHERS, "-x"],
        [sys.executable, "-m", "pytest", "-m", runner.STACK, "-x"],
    ]


def test_a_selection_by_marker_runs_once(monkeypatch):
    runner = load_runner()
    calls = []
    monkeypatch.setattr(subprocess, "call", lambda command, **kwargs: calls.append(command) or 0)
    assert runner.main(["-m", "stack", "-k", "cdc"]) == 0
    assert calls == [[sys.executable, "-m", "pytest", "-m", "stack", "-k", "cdc"]]
