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


def test_a_queued_copy_asked_to_wait_for_its_parents_copy_keeps_what_it_held() -> None:
    """A parent that waits for its copy has its cascading children copied after it
    (`_resync_descendants`); a child's copy already queued moves back in the queue. It was asked for
    again instead: the new copy held only from then on, so a resumed staging table (its B older)
    missed the changes in between, failed verification and cost an attempt."""
    import time

    from jobs.cdc.foreign_keys import ForeignKey
    from jobs.cdc.sync import CdcSync, TableState
    from jobs.cdc.table_selection import TableSpec

    def state(name: str, resync: BesideStream) -> TableState:
        table = TableState(TableSpec("db", name, f"lakehouse.dim_db.{name}"), ("id",), [], at(100))
        table.resync = resync
        return table

    child_copy = copy(resume=True)  # an interrupted `--resync`, queued first
    child_copy.hold(at(200), [change(1)])
    parent_copy = copy()
    parent_copy.applies_live, parent_copy.queued_at = False, time.monotonic()
    sync = CdcSync.__new__(CdcSync)
    sync.tables = {
        ("db", "parent"): state("parent", parent_copy),
        ("db", "child"): state("child", child_copy),
    }
    sync.foreign_keys = [
        ForeignKey("fk", ("db", "child"), ("pid",), ("db", "parent"), ("id",), "CASCADE", "CASCADE")
    ]
    sync._gone_children = set()
    asked: list[str] = []
    sync._request_resync = lambda table, *args, **kwargs: asked.append(table.spec.source_name)

    sync._resync_descendants(sync.tables[("db", "parent")])

    child = sync.tables[("db", "child")]
    assert asked == [] and child.resync is child_copy
    assert child_copy.queued_at > parent_copy.queued_at  # after the parent's copy
    assert child_copy.began < parent_copy.queued_at  # (its request time stays: logged durations)
    assert child_copy.unmerged() == [change(1)]  # what it held from its old B


def test_a_copy_under_way_asked_to_wait_for_its_parents_copy_is_built_again_after_it() -> None:
    """A child's copy already building held changes from its own B only: it cannot move back in the
    queue (its staging table would miss the rows the parent's copy cascades to meanwhile), so it is
    asked for again, afresh (no resume of its staging table), keeping its reason and how it applies."""
    import time

    from jobs.cdc.foreign_keys import ForeignKey
    from jobs.cdc.sync import CdcSync, TableState
    from jobs.cdc.table_selection import TableSpec

    child_copy = copy(resume=True)
    child_copy.phase, child_copy.applies_live = Phase.BUILDING, True
    parent_copy = copy()
    parent_copy.applies_live, parent_copy.queued_at = False, time.monotonic()
    sync = CdcSync.__new__(CdcSync)
    sync.tables = {}
    for name, resync in (("parent", parent_copy), ("child", child_copy)):
        sync.tables[("db", name)] = TableState(
            TableSpec("db", name, f"lakehouse.dim_db.{name}"), ("id",), [], at(100)
        )
        sync.tables[("db", name)].resync = resync
    sync.foreign_keys = [
        ForeignKey("fk", ("db", "child"), ("pid",), ("db", "parent"), ("id",), "CASCADE", "SET NULL")
    ]
    sync._gone_children = set()
    asked: list[tuple] = []
    sync._request_resync = lambda table, *args, **kwargs: asked.append((table.spec.source_name, args, kwargs))

    sync._resync_descendants(sync.tables[("db", "parent")])

    assert asked == [("child", ("--resync", True), {"descendants": False, "resume": False})]
