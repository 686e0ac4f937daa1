"""What a copy beside the stream holds for its catch-up (jobs/cdc/resync.py), without a stack."""

from __future__ import annotations

from jobs.cdc.binlog_reader import BinlogPosition
from jobs.cdc.change_batch import UPSERT, RowChange
from jobs.cdc.resync import BesideStream, Phase


def at(pos: int) -> BinlogPosition:
    return BinlogPosition("mysql-bin.000001", pos)


def copy(resume: bool = False) -> BesideStream:
    def never(*_):
        raise AssertionError("not started here")

    return BesideStream(None, "lakehouse.dim_db.t", "--resync", never, never, False, at(100), at(100),
                        resume=resume)  # fmt: skip


def change(key: int) -> RowChange:
    return RowChange(UPSERT, (key,), {"id": key})


def test_a_fresh_copy_holds_nothing_while_queued_and_everything_once_it_is_built() -> None:
    """A queued copy's B is read when it starts, after every change it sees while queued: holding
    them grew memory with the copies before it (a table behind a long copy on a busy source)."""
    queued = copy()
    queued.hold(at(200), [change(1), change(2)])
    assert queued.unmerged() == []
    assert queued.seen_until == at(200)  # read to there all the same
    queued.phase = Phase.BUILDING  # (start() would run the build in a thread)
    queued.hold(at(300), [change(3)])
    assert queued.unmerged() == [change(3)]
    assert queued.seen_until == at(300)


def test_a_copy_that_may_resume_holds_from_its_old_b_while_queued() -> None:
    """An interrupted copy resumed keeps its B (`hold_from`): the changes after it are needed."""
    resuming = copy(resume=True)
    resuming.hold(at(200), [change(1)])
    assert resuming.unmerged() == [change(1)]
