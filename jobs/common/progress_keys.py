"""The snapshot-summary keys in which the jobs commit their progress together with their data.

Every key starts with PREFIX: snapshot expiry (`jobs/maintain/retention.py`) keeps the newest
snapshot carrying each such key, so a job's progress never expires with old snapshots; a key a newer
snapshot's other key supersedes (SUPERSEDED_BY) is no longer read, and no longer kept.
"""

from __future__ import annotations

PREFIX = "lakehouse."

COMMIT_ID = PREFIX + "commit-id"  # a commit's own id: a retried commit recognises itself
KAFKA_OFFSETS = PREFIX + "kafka.offsets"  # ingest: {"<topic>": {"<partition>": next offset}}
VIEWS_CLICK_OFFSETS = PREFIX + "views.click-offsets"  # views: the click offsets counted so far
VIEWS_CLICKS_SNAPSHOT = PREFIX + "views.clicks-snapshot"  # views: the click snapshot counted through
CDC_POSITION = PREFIX + "cdc.position"  # cdc: the binlog position the table is current to
CDC_SNAPSHOT = PREFIX + "cdc.snapshot"  # cdc, staging table: a snapshot's position and last key read

ALL = (COMMIT_ID, KAFKA_OFFSETS, VIEWS_CLICK_OFFSETS, VIEWS_CLICKS_SNAPSHOT, CDC_POSITION, CDC_SNAPSHOT)

# A key nothing reads once a newer snapshot carries the other: a CDC table made from its snapshot's
# staging table keeps the staging commits in its history, but resumes from its own position.
SUPERSEDED_BY = {CDC_SNAPSHOT: CDC_POSITION}
