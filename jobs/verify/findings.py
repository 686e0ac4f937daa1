"""What a reconciliation check found: one result per check and table, shown as a table or JSON.

Exit codes (`exit_code`): 0 everything matches, 1 a mismatch somewhere, 2 a check could not run
(and none found a mismatch). Each finding carries a repair hint; `--repair` (clicks_repair.py,
repair.py) repairs the click and dimension tables' findings itself and the checks then say what they
found after it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace

EXAMPLES = 10  # differences listed per finding; the count covers them all

OK, MISMATCH, CANNOT_RUN = "ok", "mismatch", "cannot run"
# CloudWatch metric (namespace Lakehouse/<env>): per check and table, and the total under {"Job": "verify"},
# which the ReconcileMismatches alarm watches (infra/constructs/pipeline_health.py).
RECONCILE_METRIC = "ReconcileMismatches"


@dataclass(frozen=True)
class Finding:
    kind: str  # e.g. "missing offsets", "duplicate offsets", "row differs", "count differs"
    count: int  # how many offsets, rows or groups
    examples: tuple[str, ...]  # the first EXAMPLES, as offset ranges or keys
    hint: str
    # The examples are the source's row values (primary keys, product names), not lineage (offset
    # ranges). On AWS they stay out of the step's stdout (the EMR logs bucket has no read guard).
    row_values: bool = False


@dataclass
class CheckResult:
    check: str  # "kafka -> clicks", "mysql -> dimension", "clicks -> views"
    table: str
    compared: int = 0  # offsets, rows or groups compared
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what was not compared, and why; in-flight changes
    error: str | None = None  # why the check could not run
    seconds: float = 0.0
    repaired: int = 0  # keys (dimensions) or rows (clicks) `verify --repair` repaired before the check above

    @property
    def status(self) -> str:
        if self.error is not None:
            return CANNOT_RUN
        return MISMATCH if self.findings else OK

    @property
    def mismatches(self) -> int:
        return sum(f.count for f in self.findings)

    def to_dict(self) -> dict:
        return {**asdict(self), "status": self.status, "mismatches": self.mismatches}


def timed(check, *args, **kwargs) -> CheckResult:
    began = time.monotonic()
    result = check(*args, **kwargs)
    result.seconds = round(time.monotonic() - began, 2)
    return result


def guarded(name: str, table: str, check, *args) -> CheckResult:
    """`check(*args)`, timed; an exception makes this check "cannot run" (the others still run)."""
    try:
        return timed(check, *args)
    except Exception as exc:  # noqa: BLE001 - reported as the check's error, with its type
        first = str(exc).splitlines()[0] if str(exc) else ""
        return CheckResult(name, table, error=f"{type(exc).__name__}: {first}")


def redacted(results: Sequence[CheckResult], stored_at: str | None) -> list[CheckResult]:
    """`results` with the examples that are row values replaced by where the full findings are (or by
    nothing, when they could not be stored): for output that ends up in logs."""
    where = f"in {stored_at}" if stored_at else "not stored (see the warning above)"
    out = []
    for r in results:
        findings = [
            replace(f, examples=(f"examples (row values) {where}",)) if f.row_values else f
            for f in r.findings
        ]
        out.append(replace(r, findings=findings))
    return out


def exit_code(results: Sequence[CheckResult]) -> int:
    if any(r.status == MISMATCH for r in results):
        return 1
    return 2 if any(r.status == CANNOT_RUN for r in results) else 0


def ranges_text(ranges: Sequence[tuple[int, int, int]]) -> tuple[str, ...]:
    """(partition, first, last) -> 'partition 0: 17-19' (one offset: 'partition 0: 17')."""
    return tuple(
        f"partition {p}: {first}" if first == last else f"partition {p}: {first}-{last}"
        for p, first, last in ranges[:EXAMPLES]
    )


def metric_data(results: Sequence[CheckResult]) -> list[dict]:
    """CloudWatch MetricData: the mismatches (and repairs) of every check that ran, and their total."""
    ran = [r for r in results if r.status != CANNOT_RUN]

    def datum(value: int, **dimensions: str) -> dict:
        dims = [{"Name": "Job", "Value": "verify"}, *({"Name": k, "Value": v} for k, v in dimensions.items())]
        return {"MetricName": RECONCILE_METRIC, "Dimensions": dims, "Value": float(value), "Unit": "Count"}

    # A repaired key counts: the alarm fires on whatever made the lake wrong, repaired or not.
    def found(r: CheckResult) -> int:
        return r.mismatches + r.repaired

    return [datum(sum(found(r) for r in ran)), *(datum(found(r), Table=r.table) for r in ran)]


def as_json(results: Sequence[CheckResult], stored_at: str | None = None) -> str:
    report = {"exit_code": exit_code(results), "checks": [r.to_dict() for r in results]}
    if stored_at:
        report["findings_stored_at"] = stored_at
    return json.dumps(report, indent=2, default=str)


def render(results: Sequence[CheckResult], console) -> None:
    """One summary table, then each finding with its examples and repair hint (rich)."""
    from rich.table import Table

    summary = Table(title="lakehouse verify", title_justify="left")
    repaired = any(r.repaired for r in results)
    columns = ("check", "table", "status", "compared", "mismatches", *(("repaired",) if repaired else ()))
    for column in (*columns, "seconds"):
        numeric = column in ("compared", "mismatches", "repaired", "seconds")
        summary.add_column(column, justify="right" if numeric else "left")
    colour = {OK: "green", MISMATCH: "red", CANNOT_RUN: "yellow"}
    for r in results:
        summary.add_row(
            r.check, r.table, f"[{colour[r.status]}]{r.status}[/]", f"{r.compared:,}", f"{r.mismatches:,}",
            *((f"{r.repaired:,}",) if repaired else ()), f"{r.seconds:.1f}",
        )  # fmt: skip
    console.print(summary)
    for r in results:
        if r.error:
            console.print(f"[yellow]{r.check} {r.table}: cannot run: {r.error}[/]")
        for f in r.findings:
            console.print(f"[red]{r.check} {r.table}: {f.count:,} {f.kind}[/]: {', '.join(f.examples)}")
            console.print(f"  repair: {f.hint}")
        for note in r.notes:
            console.print(f"  {r.table}: {note}")
    for r in results:  # one plain line per check: what step logs are searched for
        console.print(
            f"verify: {r.check} {r.table}: {r.status} ({r.compared} compared, {r.mismatches} mismatches"
            + (f", {r.repaired} repaired)" if r.repaired else ")"),
            soft_wrap=True, highlight=False, markup=False,
        )  # fmt: skip
