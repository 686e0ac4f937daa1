"""Run modes without Spark: --until-idle alone, and fed by an upstream job of the same application."""

from __future__ import annotations

import threading
import time

from jobs.common.run_modes import RunMode, StopRequest, run_batches

FAST = RunMode(trigger_seconds=0.01, until_idle=True, idle_seconds=0.1)


def test_until_idle_stops_after_the_idle_period():
    handled = iter([5, 3])
    total = run_batches(lambda: next(handled, 0), FAST, StopRequest())
    assert total == 8


def test_a_downstream_job_keeps_going_until_its_upstream_finished_and_then_drains_it():
    upstream_finished = threading.Event()
    arrivals: list[int] = []  # what the upstream job committed and the downstream has not handled

    def upstream() -> None:
        for _ in range(3):
            time.sleep(0.25)  # longer than the idle period: idle alone would stop the downstream
            arrivals.append(10)
        upstream_finished.set()
        arrivals.append(7)  # committed by the upstream's last act (e.g. its finish)

    def downstream_batch() -> int:
        handled = sum(arrivals)
        arrivals.clear()
        return handled

    thread = threading.Thread(target=upstream)
    thread.start()
    total = run_batches(downstream_batch, FAST, StopRequest(), upstream_done=upstream_finished.is_set)
    thread.join()
    assert total == 37


def test_stop_ends_the_loop_even_while_the_upstream_runs():
    stop = StopRequest()
    threading.Timer(0.1, stop.set).start()
    assert run_batches(lambda: 0, FAST, stop, upstream_done=lambda: False) == 0


def test_work_between_the_batches_is_not_idleness_and_may_start_at_any_time():
    """CDC's re-snapshot beside the stream (`busy`): --until-idle waits for it, also for one that
    starts after the job has been idle for a while (a table created while it runs)."""
    began = time.monotonic()
    busy_from, busy_until = began + 0.05, began + 0.6  # starts before idle, ends well after it
    batches: list[float] = []

    def batch() -> int:
        batches.append(time.monotonic())
        return 0

    def busy() -> bool:
        return busy_from <= time.monotonic() < busy_until

    run_batches(batch, FAST, StopRequest(), busy=busy)
    assert batches[-1] >= busy_until, "stopped while the work between the batches went on"
