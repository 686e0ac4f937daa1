"""jobs/registry.py is the one list of jobs: every room is in it, and everything that runs jobs
(the CLI, the streaming application, the EMR steps) runs exactly what it lists."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from infra.emr_steps import BATCH_JOBS, STREAMING_APPLICATION, STREAMING_JOBS, streaming_steps
from jobs.registry import JOBS, Kind, job
from jobs.streaming.application import JOB_NAMES, UPSTREAM

JOBS_DIR = Path(__file__).resolve().parents[1] / "jobs"


def test_every_job_room_is_registered_and_every_registered_job_has_a_room():
    rooms = {p.parent.name for p in JOBS_DIR.glob("*/__main__.py")}
    assert rooms == set(JOBS)
    for registered in JOBS.values():
        assert callable(registered.main()), registered.name
        assert (JOBS_DIR / registered.name / "README.md").exists(), registered.name


def test_the_emr_steps_and_the_streaming_application_run_the_registered_jobs():
    assert STREAMING_JOBS == JOB_NAMES == ("cdc", "ingest", "views")
    assert streaming_steps(True) == STREAMING_APPLICATION == ("streaming",)
    assert streaming_steps(False) == STREAMING_JOBS
    assert BATCH_JOBS == ("report", "maintain", "verify", "replay", "gendata")
    # each registered job runs in exactly one way: as a list, a job in two kinds would show twice
    assert sorted((*STREAMING_JOBS, *STREAMING_APPLICATION, *BATCH_JOBS)) == sorted(JOBS)
    assert UPSTREAM == {"ingest": "cdc", "views": "ingest"}
    assert all(JOBS[up].kind is Kind.STREAMING for up in UPSTREAM.values())


def test_lakehouse_run_refuses_an_unknown_job_naming_the_known_ones():
    from lakehouse.cli import main

    result = CliRunner().invoke(main, ["run", "nosuchjob"])
    assert result.exit_code == 2
    assert (
        "'nosuchjob' is not one of cdc, ingest, views, streaming, report, maintain, verify, replay, gendata"
        in result.output
    )
    with pytest.raises(KeyError, match="no job 'nosuchjob'"):
        job("nosuchjob")


@pytest.mark.parametrize("name", list(JOBS))
def test_each_job_answers_help_through_the_cli(name):
    from lakehouse.cli import main

    result = CliRunner().invoke(main, ["run", name, "--help"])
    assert result.exit_code == 0, result.output
    assert "usage:" in result.output and "--env" in result.output
