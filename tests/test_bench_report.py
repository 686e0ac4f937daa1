"""bench/results_report.py: RESULTS.md is written from the benches' JSON, headed by date and machine.

Fabricated inputs only: no bench runs here (timings belong to `make bench`, not to tests).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from bench.results_report import machine_info, render_report, run_meta, write_report

MACHINE = {
    "cpu": "Test CPU 9000",
    "cpus": "2",
    "memory": "23.5 GiB",
    "os": "Debian GNU/Linux 12 (bookworm) (kernel 6.1)",
    "python": "3.11.7",
    "java": 'openjdk version "17.0.15"',
    "spark": "pyspark 3.5.9",
}
GENERATED = datetime(2026, 11, 26, 9, 30, tzinfo=UTC)


def _bench(results: Path, name: str, rows: list[dict], machine: dict | None = MACHINE) -> None:
    (results / f"{name}.json").write_text(json.dumps(rows))
    if machine is not None:
        started = datetime(2026, 11, 25, 21, 0, tzinfo=UTC)
        finished = datetime(2026, 11, 25, 21, 4, 30, tzinfo=UTC)
        (results / f"{name}.meta.json").write_text(json.dumps(run_meta(name, started, finished, machine)))


def test_report_has_date_machine_and_one_table_per_bench(tmp_path: Path) -> None:
    _bench(
        tmp_path,
        "cdc_bench",
        [
            {
                "metric": "apply rate",
                "before": "17.6k",
                "target": ">= 30,000",
                "measured": "24,100 changes/s",
                "met": False,
            },
            {
                "metric": "change -> visible p50 / p95",
                "before": "-",
                "target": "p95 <= 3s",
                "measured": "0.9s / 1.6s",
                "met": True,
            },
        ],
    )
    _bench(tmp_path, "views_bench", [{"metric": "views total | clicks", "measured": "1500 / 1500"}])

    text = render_report(tmp_path, MACHINE, GENERATED, describe=lambda name: f"what {name} measures")

    lines = text.splitlines()
    assert lines[0] == "# Benchmark results"
    assert "Generated 2026-11-26 09:30 UTC by `make bench`" in text
    for key, value in MACHINE.items():
        assert f"| {key} | {value.replace('|', chr(92) + '|')} |" in lines
    cdc = lines.index("## cdc_bench")
    views = lines.index("## views_bench")
    assert cdc < views, "sections in name order"
    cdc_section = lines[cdc:views]
    assert "what cdc_bench measures" in cdc_section
    assert "Measured 2026-11-25 21:00:00+00:00 to 2026-11-25 21:04:30+00:00." in cdc_section
    assert "| metric | before | target | measured | met |" in cdc_section
    assert "| apply rate | 17.6k | >= 30,000 | 24,100 changes/s | False |" in cdc_section
    assert "| change -> visible p50 / p95 | - | p95 <= 3s | 0.9s / 1.6s | True |" in cdc_section
    # A pipe in a value must not split the cell.
    assert "| views total \\| clicks | 1500 / 1500 |" in lines[views:]
    assert not any(line.startswith("## ") and "meta" in line for line in lines), "meta files are not benches"


def test_a_section_from_another_machine_or_without_meta_says_so(tmp_path: Path) -> None:
    _bench(tmp_path, "demo_bench", [{"metric": "m", "measured": "1"}], machine={**MACHINE, "cpus": "8"})
    _bench(tmp_path, "views_bench", [{"metric": "m", "measured": "2"}], machine=None)

    text = render_report(tmp_path, MACHINE, GENERATED, describe=lambda name: "")

    demo = text.split("## demo_bench")[1].split("## views_bench")[0]
    assert "on another machine:" in demo and "cpus 8" in demo
    views = text.split("## views_bench")[1]
    assert "Measured: unknown" in views


def test_no_results_yet_says_what_to_run(tmp_path: Path) -> None:
    text = render_report(tmp_path, MACHINE, GENERATED, describe=lambda name: "")
    assert "No bench has run yet: `make bench`." in text


def test_write_report_writes_results_md(tmp_path: Path) -> None:
    _bench(tmp_path, "compaction_bench", [{"metric": "data files", "measured": "200 -> 6"}])
    path = write_report(tmp_path, MACHINE, GENERATED)
    assert path == tmp_path / "RESULTS.md"
    assert "| data files | 200 -> 6 |" in path.read_text()


def test_machine_info_reads_cpu_memory_and_os_from_the_system_files(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nmodel name\t: AMD EPYC 7R13 Processor\n\n"
        "processor\t: 1\nmodel name\t: AMD EPYC 7R13 Processor\n\n"
        "processor\t: 2\nmodel name\t: AMD EPYC 7R13 Processor\n"
    )
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24641536 kB\nMemFree:         1000 kB\n")
    os_release = tmp_path / "os-release"
    os_release.write_text('NAME="Debian GNU/Linux"\nPRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\n')

    info = machine_info(
        cpuinfo, meminfo, os_release, java_version=lambda: "java 17", spark_version=lambda: "pyspark 3.5.9"
    )

    assert info["cpu"] == "AMD EPYC 7R13 Processor"
    assert info["cpus"] == "3"
    assert info["memory"] == "23.5 GiB"
    assert info["os"].startswith("Debian GNU/Linux 12 (bookworm) (kernel ")
    assert info["java"] == "java 17"
    assert info["spark"] == "pyspark 3.5.9"
    assert info["python"].startswith("3.11")
