"""`make bench`: run every `bench/*_bench.py` module's `run()`, print a table each, save JSON, and
rebuild `bench/results/RESULTS.md` (date, machine, one table per bench; `bench/results_report.py`).

`python -m bench [WORD ...]` runs the modules whose name contains a WORD (`python -m bench cdc`);
`--list` names the benches and what each measures; `--report` only rebuilds RESULTS.md.
"""

from __future__ import annotations

import importlib
import json
import sys
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench.results_report import bench_description, machine_info, run_meta, write_report

BENCH_DIR = Path(__file__).resolve().parent
RESULTS_DIR = BENCH_DIR / "results"


def discover(only: list[str]) -> list[str]:
    names = sorted(path.stem for path in BENCH_DIR.glob("*_bench.py"))
    return [name for name in names if not only or any(word in name for word in only)]


def print_table(console: Console, title: str, rows: list[dict]) -> None:
    table = Table(title=title)
    columns = list(dict.fromkeys(key for row in rows for key in row))
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*[str(row.get(column, "")) for column in columns])
    console.print(table)


def main(argv: list[str]) -> int:
    """Optional arguments select modules by name (`python -m bench clickstream`)."""
    console = Console()
    if "-h" in argv or "--help" in argv:
        print(__doc__)
        return 0
    if "--list" in argv:
        for name in discover([]):
            print(f"{name}: {bench_description(name)}")
        return 0
    RESULTS_DIR.mkdir(exist_ok=True)
    machine = machine_info()
    if "--report" not in argv:
        for name in discover(argv):
            console.print(f"[bold]running bench.{name}[/]")
            started = datetime.now(UTC)
            rows = importlib.import_module(f"bench.{name}").run()
            print_table(console, name, rows)
            (RESULTS_DIR / f"{name}.json").write_text(json.dumps(rows, indent=2, default=str))
            meta = run_meta(name, started, datetime.now(UTC), machine)
            (RESULTS_DIR / f"{name}.meta.json").write_text(json.dumps(meta, indent=2))
    report = write_report(RESULTS_DIR, machine)
    console.print(f"results: {report.relative_to(BENCH_DIR.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
