"""What the views job that last committed `product_views` counts, for the jobs that change clicks
below its watermark (`replay-rejects` adds, `verify --repair` adds and removes): a views job of an
earlier release would never count those, so they refuse before anything is written."""

from __future__ import annotations

from jobs.common import progress_keys
from jobs.common.snapshot_progress import progress_summary_as_of
from jobs.config import ConfigError

# In every commit of a views job that counts repair commits (weights -1 for clicks removed).
COUNTS_KEY = "lineage.views-counts"
COUNTS = "replays,repairs"
# The summary key whose presence shows the views job counts it: replays came with the counted
# click snapshot, before COUNTS_KEY.
_SHOWN_BY = {"replays": progress_keys.VIEWS_CLICKS_SNAPSHOT, "repairs": COUNTS_KEY}
_ACTION = {"replays": ("replayed", "replay"), "repairs": ("repaired", "repair")}


class ViewsOfAnEarlierRelease(ConfigError):
    """The view was last committed by a views job that does not count these commits."""


def check_views_count(spark, views_table: str | None, what: str) -> None:
    """Refuse (`ViewsOfAnEarlierRelease`) when the views job that last committed `views_table`
    would not count `what` ("replays" or "repairs"); a table not there or nothing counted yet is
    fine."""
    if views_table is None or not spark.catalog.tableExists(views_table):
        return
    summary = progress_summary_as_of(spark, views_table, None, progress_keys.VIEWS_CLICK_OFFSETS)
    if summary is not None and _SHOWN_BY[what] not in summary:
        done, action = _ACTION[what]
        raise ViewsOfAnEarlierRelease(
            f"{views_table} was last committed by a views job of an earlier release, which would not "
            f"count the {done} clicks: run this release's views job (it commits with the next click "
            f"batch), then {action}"
        )
