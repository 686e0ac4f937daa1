"""When each produced record became visible, read from the tables' snapshot metadata alone: the
click table's commits store the Kafka offsets they cover, product_views' commits the click offsets
their counts include. Shared by the demo and soak benches."""

from __future__ import annotations

import bisect

Record = tuple[int, int, float]  # partition, offset, produced at (epoch seconds)
Commits = dict[int, tuple[list[int], list[float]]]  # partition -> (end offsets, commit times)

CLICKS = "ods_behavior.clickevent"
VIEWS = "ads_behavior.product_views"


def commits(catalog, table: str, ends_of) -> Commits:
    """Per partition, the table's commits in time order: the end offset each stored, and when.
    `ends_of(summary)` -> {partition: next offset} (empty: the commit stored none)."""
    found: Commits = {}
    snapshots = sorted(catalog.load_table(table).snapshots(), key=lambda s: s.timestamp_ms)
    for snapshot in snapshots:
        summary = snapshot.summary.additional_properties if snapshot.summary else {}
        for partition, end in ends_of(summary).items():
            ends, times = found.setdefault(partition, ([], []))
            if not ends or end > ends[-1]:  # stored offsets only grow; a repeat adds nothing
                ends.append(end)
                times.append(snapshot.timestamp_ms / 1000)
    return found


def click_commits(catalog, topic: str = "clicktopic") -> Commits:
    from jobs.common.lake_tables import OFFSETS_KEY, offsets_from_summary

    return commits(catalog, CLICKS, lambda s: offsets_from_summary(s.get(OFFSETS_KEY), topic))


def views_commits(catalog) -> Commits:
    from jobs.views.job import PROGRESS_KEY, watermark_from_summary

    return commits(catalog, VIEWS, lambda s: watermark_from_summary(s.get(PROGRESS_KEY))[1])


def latencies(records: list[Record], found: Commits) -> tuple[list[float], int]:
    """Seconds from produced to the first commit covering each record, and how many records no
    commit covers yet."""
    seen, missing = [], 0
    for partition, offset, produced in records:
        ends, times = found.get(partition, ([], []))
        index = bisect.bisect_right(ends, offset)  # the first commit whose end is past the offset
        if index == len(ends):
            missing += 1
        else:
            seen.append(max(0.0, times[index] - produced))
    return seen, missing
