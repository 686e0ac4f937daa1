"""scripts/run_tests.py (`make test`): two pytest runs at once that split the suite by markers; its
exit status fails when either fails, and a group with nothing selected (pytest's 5) is no failure."""

from __future__ import annotations

import importlib.util
import itertools
import signal
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
    for stack, synth, own_stack in itertools.product((False, True), repeat=3):
        marks = {"stack": stack, "synth": synth, "own_stack": own_stack}
        in_stack = eval(runner.STACK, {}, marks)  # noqa: S307 - our own constants
        in_others = eval(runner.OTHERS, {}, marks)  # noqa: S307
        assert in_stack != in_others, marks


@pytest.fixture
def fake_pytest(monkeypatch, tmp_path):
    """The runner with its pytest runs replaced: `codes` says what each group exits with."""
    runner = load_runner()
    monkeypatch.setattr(runner, "REPO", tmp_path)
    monkeypatch.setattr(runner, "LOG", tmp_path / "others.log")
    monkeypatch.setattr(signal, "signal", lambda *args: None)  # this test process keeps its own
    calls: list[list[str]] = []
    codes = {"stack": 0, "others": 0}

    class Run:
        def __init__(self, command, stdout=None, **kwargs):
            calls.append(command)
            self.group = "others" if runner.OTHERS in command else "stack"
            if stdout is not None:
                stdout.write(f"{self.group}'s output\n")

        def wait(self):
            return codes[self.group]

        def poll(self):
            return codes[self.group]

    monkeypatch.setattr(subprocess, "Popen", Run)
    return runner, calls, codes


@pytest.mark.parametrize(
    ("stack", "others", "expected"),
    [(0, 0, 0), (0, 5, 0), (5, 0, 0), (5, 5, 5), (1, 0, 1), (0, 1, 1), (2, 1, 2), (0, 2, 2), (5, 1, 1)],
)
def test_the_exit_status_fails_when_either_group_fails(fake_pytest, capsys, stack, others, expected):
    runner, calls, codes = fake_pytest
    codes.update(stack=stack, others=others)
    assert runner.main(["-x"]) == expected
    python = [sys.executable, "-m", "pytest"]
    assert calls == [
        [*python, "-m", runner.STACK, "-o", "cache_dir=.pytest_cache/stack", "-x"],
        [*python, "-m", runner.OTHERS, "-o", "cache_dir=.pytest_cache/others", "-x"],
    ]
    assert "others's output" in capsys.readouterr().out  # the logged group is printed at the end


@pytest.mark.parametrize(
    ("argv", "env"), [(["-m", "stack", "-k", "cdc"], {}), (["-k", "cdc"], {"TEST_GROUPS": "1"})]
)
def test_a_selection_by_marker_or_test_groups_1_runs_once(fake_pytest, monkeypatch, argv, env):
    runner, calls, _ = fake_pytest
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert runner.main(argv) == 0
    assert calls == [[sys.executable, "-m", "pytest", *argv]]
