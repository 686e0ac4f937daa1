"""The benchmark results file: `bench/results/RESULTS.md`, written by `make bench`, never by hand.

Each bench run leaves `<name>.json` (its rows) and `<name>.meta.json` (when it ran and on what
machine), committed beside the report. The report is rebuilt from every pair in the results
folder, so a partial run (`python -m bench cdc`) refreshes its own section and keeps the others,
each under its own date; a section measured on another machine than the header's names that machine.
"""

from __future__ import annotations

import ast
import json
import os
import platform
import re
import subprocess
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

REPORT_NAME = "RESULTS.md"
BENCH_DIR = Path(__file__).resolve().parent


def machine_info(
    cpuinfo: Path = Path("/proc/cpuinfo"),
    meminfo: Path = Path("/proc/meminfo"),
    os_release: Path = Path("/etc/os-release"),
    java_version: Callable[[], str] | None = None,
    spark_version: Callable[[], str] | None = None,
) -> dict[str, str]:
    """What the figures depend on: CPU model and count, memory, OS, Python, Java and Spark."""
    models = _cpuinfo_values(cpuinfo, "model name")
    memory_kib = _meminfo_kib(meminfo, "MemTotal")
    return {
        "cpu": models[0] if models else platform.processor() or "unknown",
        "cpus": str(len(_cpuinfo_values(cpuinfo, "processor")) or os.cpu_count() or "unknown"),
        "memory": f"{memory_kib / 1024**2:.1f} GiB" if memory_kib else "unknown",
        "os": f"{_os_name(os_release)} (kernel {platform.release()})",
        "python": platform.python_version(),
        "java": (java_version or _java_version)(),
        "spark": (spark_version or _spark_version)(),
    }


def run_meta(name: str, started: datetime, finished: datetime, machine: Mapping[str, str]) -> dict:
    """What `<name>.meta.json` holds."""
    return {
        "bench": name,
        "started": started.isoformat(timespec="seconds"),
        "finished": finished.isoformat(timespec="seconds"),
        "machine": dict(machine),
    }


def render_report(
    results_dir: Path,
    machine: Mapping[str, str],
    generated: datetime,
    describe: Callable[[str], str] | None = None,
) -> str:
    """RESULTS.md's text: a header with the date and `machine`, then one table per bench."""
    describe = describe or bench_description
    lines = [
        "# Benchmark results",
        "",
        f"Generated {generated.strftime('%Y-%m-%d %H:%M UTC')} by `make bench` (`bench/results_report.py`);",
        "do not edit by hand. What each bench measures: [bench/README.md](../README.md).",
        "",
        "| machine | |",
        "|---|---|",
        *[f"| {key} | {_cell(value)} |" for key, value in machine.items()],
        "",
    ]
    names = sorted(
        path.name.removesuffix(".json")
        for path in results_dir.glob("*.json")
        if not path.name.endswith(".meta.json")
    )
    if not names:
        lines += ["No bench has run yet: `make bench`.", ""]
    for name in names:
        rows = json.loads((results_dir / f"{name}.json").read_text())
        meta_path = results_dir / f"{name}.meta.json"
        meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
        lines += [f"## {name}", ""]
        description = describe(name)
        if description:
            lines += [description, ""]
        lines += [_measured_line(meta, machine), ""]
        lines += _table(rows) + [""]
    return "\n".join(lines)


def write_report(
    results_dir: Path,
    machine: Mapping[str, str] | None = None,
    generated: datetime | None = None,
) -> Path:
    path = results_dir / REPORT_NAME
    text = render_report(results_dir, machine or machine_info(), generated or datetime.now(UTC))
    path.write_text(text)
    return path


def bench_description(name: str) -> str:
    """The first paragraph of `bench/<name>.py`'s docstring, on one line (no import, no Spark)."""
    source = BENCH_DIR / f"{name}.py"
    if not source.exists():
        return ""
    docstring = ast.get_docstring(ast.parse(source.read_text())) or ""
    return " ".join(docstring.split("\n\n")[0].split())


def _measured_line(meta: Mapping, machine: Mapping[str, str]) -> str:
    if not meta:
        return "Measured: unknown (no `.meta.json` beside the rows)."
    line = f"Measured {meta['started'].replace('T', ' ')} to {meta['finished'].replace('T', ' ')}"
    other = meta.get("machine") or {}
    if other and dict(other) != dict(machine):
        line += " on another machine: " + ", ".join(f"{key} {value}" for key, value in other.items())
    return line + "."


def _table(rows: list[dict]) -> list[str]:
    if not rows:
        return ["(no rows)"]
    columns = list(dict.fromkeys(key for row in rows for key in row))
    return [
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
        *["| " + " | ".join(_cell(row.get(column, "")) for column in columns) + " |" for row in rows],
    ]


def _cell(value: object) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def _cpuinfo_values(path: Path, key: str) -> list[str]:
    if not path.exists():
        return []
    values = []
    for line in path.read_text().splitlines():
        name, _, value = line.partition(":")
        if name.strip() == key:
            values.append(value.strip())
    return values


def _meminfo_kib(path: Path, key: str) -> int:
    if not path.exists():
        return 0
    for line in path.read_text().splitlines():
        match = re.match(rf"{key}:\s+(\d+) kB", line)
        if match:
            return int(match.group(1))
    return 0


def _os_name(path: Path) -> str:
    if path.exists():
        for line in path.read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                return line.partition("=")[2].strip().strip('"')
    return platform.system()


def _java_version() -> str:
    try:
        result = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "not found"
    first = (result.stderr or result.stdout).strip().splitlines()
    return first[0] if first else "unknown"


def _spark_version() -> str:
    try:
        return f"pyspark {metadata.version('pyspark')}"
    except metadata.PackageNotFoundError:
        return "not installed"
