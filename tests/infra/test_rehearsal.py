"""`make rehearse` on the synthesized dev assembly: the steps the deployment would submit, run on a
Spark standalone cluster from the packaged artifact, checked against what went in."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest


@pytest.mark.stack
@pytest.mark.timeout(900)
def test_the_rehearsal_runs_every_step_of_the_dev_deployment(dev, tmp_path):
    command = ["-m", "lakehouse.rehearsal", "--assembly", str(dev.outdir), "--work-dir", str(tmp_path)]
    result = subprocess.run(
        [sys.executable, *command], capture_output=True, text=True, timeout=880, cwd=tmp_path
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    for step in ("gendata", "streaming", "report", "maintain", "verify"):
        assert any(
            line.startswith(f"step lakehouse-{step}") and ": exit 0 in" in line
            for line in output.splitlines()
        )
    assert "verified: 2000 facts + 3 rejects against 2003 topic records" in output
    # The product's own reconciliation ran on the cluster's terms and found the lake equal to its sources.
    for check in ("kafka -> clicks", "mysql -> dimension dim_db.products", "clicks -> views"):
        assert re.search(rf"verify step: {check}.*: ok, [1-9]\d* compared", output), check
    assert "Iceberg catalog implementation: org.apache.iceberg.aws.glue.GlueCatalog -> " in output
    assert "rehearsal passed" in output
    # Every job was imported from its step's unpacked archive (the rehearsal checks each step's log).
    logs = "".join(p.read_text(errors="replace") for p in (tmp_path / "steps").glob("*/std*"))
    for job in ("gendata", "streaming", "report", "maintain", "verify"):
        assert f"emr_step: running {job} from {tmp_path}/steps/" in logs
