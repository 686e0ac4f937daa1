"""The streaming application's supervision, with scripted jobs (no Spark, no sources): a job that
fails is closed (its binlog reader, its consumers) before its replacement starts."""

from __future__ import annotations

from types import SimpleNamespace

from jobs.common.run_modes import RunMode
from jobs.streaming.application import StreamingApplication, StreamingOptions


class ScriptedJob:
    def __init__(self, number: int, events: list, fail_in: str | None) -> None:
        self.number, self.events, self.fail_in = number, events, fail_in

    def _step(self, name: str) -> None:
        self.events.append((self.number, name))
        if self.fail_in == name:
            raise RuntimeError(f"job {self.number} failed in {name}")

    def prepare(self) -> None:
        self._step("prepare")

    def run_batch(self) -> int:
        self._step("run_batch")
        return 0

    def finish(self) -> None:
        self._step("finish")

    def close(self) -> None:
        self.events.append((self.number, "close"))

    def lag_seconds(self):
        return None

    def reached_end(self) -> bool:
        return True

    def problem(self):
        return None


def _run(failures: list[str | None]) -> list:
    events: list = []
    made: list[ScriptedJob] = []

    def factory(_stop):
        job = ScriptedJob(len(made), events, failures[len(made)] if len(made) < len(failures) else None)
        made.append(job)
        return job

    spark = SimpleNamespace(sparkContext=SimpleNamespace(setLocalProperty=lambda key, value: None))
    options = StreamingOptions(
        jobs=("views",), mode=RunMode(0.05, True, 0.1), max_failures=5, first_backoff_seconds=0.01
    )
    assert StreamingApplication(spark, options, {"views": factory}).run() == 0
    return events


def test_a_job_failing_in_a_batch_is_closed_before_its_replacement_starts():
    events = _run(["run_batch"])
    assert events[:3] == [(0, "prepare"), (0, "run_batch"), (0, "close")]
    assert events[3] == (1, "prepare")
    assert events[-2:] == [(1, "finish"), (1, "close")]
    assert sum(1 for _, step in events if step == "close") == 2


def test_a_job_failing_while_it_prepares_is_closed_too():
    events = _run(["prepare"])
    assert events[:2] == [(0, "prepare"), (0, "close")]
    assert (0, "finish") not in events
