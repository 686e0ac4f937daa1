"""`make bench`: run every `bench/*_bench.py` module's `run()`, print a table each, save JSON."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

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
    RESULTS_DIR.mkdir(exist_ok=True)
    for name in discover(argv):
        console.print(f"[bold]running bench.{name}[/]")
        rows = importlib.import_module(f"bench.{name}").run()
        print_table(console, name, rows)
        (RESULTS_DIR / f"{name}.json").write_text(json.dumps(rows, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
