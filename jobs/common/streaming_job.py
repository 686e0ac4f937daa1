"""What a streaming job offers the streaming application (`jobs/streaming`), which runs cdc, ingest
and views in one Spark application: each job implements it itself (`CdcSync`, `ClickstreamIngest`,
`ProductViews`), so the application needs none of their internals.
"""

from __future__ import annotations

from typing import Protocol


class NeedsOperator(RuntimeError):
    """A failure a restart would repeat, or make worse (another writer on the table, offsets that
    went back): the streaming application stops at once instead of retrying the job."""


class StreamingJob(Protocol):
    def prepare(self) -> None:
        """Connect, create what is missing, read the stored progress (may take a snapshot)."""

    def run_batch(self) -> int:
        """One micro-batch, committed with its progress; returns the records handled."""

    def finish(self) -> None:
        """A clean stop: commit what is held."""

    def close(self) -> None:
        """Always, also after a failure: release readers and clients."""

    def lag_seconds(self) -> float | None:
        """How far the last commit is behind its source (None before the first)."""

    def background_work(self) -> bool:
        """Work going on between its batches (CDC's re-snapshot beside the stream): `--until-idle`
        does not count the time as idle."""
        return False

    def reached_end(self) -> bool:
        """`--until-idle`: its source has nothing more (only CDC knows; the others follow upstream)."""
        return False

    def problem(self) -> str | None:
        """A condition it is riding out, for the status (the source unreachable, a table stopped)."""
        return None
