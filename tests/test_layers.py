"""The layers run one way: jobs <- infra <- lakehouse (README "Layout").

- `jobs/` imports nothing above it: it is what an EMR step ships, without the CLI or the CDK app.
- `infra/` imports jobs' constants but nothing from `lakehouse/`; its Lambda handlers import
  nothing of the repository (each is deployed from its own folder).
- each job's room (`jobs/<job>/`) imports the shared code (`jobs/common`, `jobs/config.py`,
  `jobs/registry.py`) and itself, not another job's room; only the streaming application composes
  the streaming jobs, and runs `maintain` where nothing schedules it (the local stack); only
  `verify` reads through the streaming jobs' own readers (their sources and stored progress; its
  click repair also shapes the records it reads again with the ingest's code), and only `replay`
  validates and shapes rows with the ingest's own code (a reject passes or fails exactly as it
  would in the ingest of this release).
- the operator CLI never loads the CDK runtime: tests/infra/test_infra_config.py.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from jobs.registry import JOBS, Kind

REPO = Path(__file__).resolve().parents[1]
STREAMING_JOBS = {name for name, job in JOBS.items() if job.kind is Kind.STREAMING}
STREAMING_COMPOSES = STREAMING_JOBS | {"maintain"}
FIRST_PARTY = ("jobs", "infra", "lakehouse", "bench", "tests")


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in `path`, relative imports resolved; also inside functions."""
    tree = ast.parse(path.read_text(), str(path))
    package = ".".join(path.relative_to(REPO).with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            # `from jobs.cdc import sync` imports jobs.cdc.sync: name the submodule when it is one
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                is_module = (REPO / Path(*candidate.split("."))).with_suffix(".py").exists() or (
                    REPO / Path(*candidate.split("."))
                ).is_dir()
                found.append((node.lineno, candidate if is_module else base))
    return found


def room(module: str) -> str | None:
    """The job room a `jobs.<x>...` module belongs to (None for the shared code)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "jobs" and parts[1] in JOBS else None


def wrong_way_imports(path: Path) -> list[str]:
    relative = path.relative_to(REPO)
    top = relative.parts[0]
    problems = []
    for line, module in imports_of(path):
        head = module.split(".")[0]
        if head not in FIRST_PARTY:
            continue
        where = f"{relative}:{line} imports {module}"
        if top == "jobs" and head != "jobs":
            problems.append(f"{where}: jobs/ imports nothing above it")
        elif top == "infra" and relative.parts[1] == "lambdas":
            problems.append(f"{where}: a Lambda handler is deployed alone and imports nothing of the repo")
        elif top == "infra" and head not in ("infra", "jobs"):
            problems.append(f"{where}: infra/ imports jobs/ and itself only")
        elif top in ("jobs", "infra", "lakehouse") and head in ("bench", "tests"):
            problems.append(f"{where}: product code never imports benchmarks or tests")
        if top == "jobs":
            own, other = room(".".join(relative.with_suffix("").parts)), room(module)
            composes = (
                (own == "streaming" and other in STREAMING_COMPOSES)
                or (own == "verify" and other in STREAMING_JOBS)
                or (own == "replay" and other == "ingest")
            )
            if other is not None and other != own and not composes:
                problems.append(f"{where}: a job's room is its own (share through jobs/common)")
    return problems


def product_files() -> list[Path]:
    return sorted(p for top in ("jobs", "infra", "lakehouse") for p in (REPO / top).rglob("*.py"))


def test_no_import_runs_the_wrong_way():
    files = product_files()
    assert len(files) > 100  # the scan sees the code base
    problems = [problem for path in files for problem in wrong_way_imports(path)]
    assert problems == []


def test_the_scan_catches_each_kind_of_wrong_way_import(tmp_path, monkeypatch):
    """Positive control: the same check on files that break each rule."""
    fake = tmp_path / "repo"
    cases = {
        "jobs/cdc/bad.py": "from lakehouse.cli import main\n",
        "jobs/views/bad.py": "def f():\n    from jobs.ingest.validation import classify_payload\n",
        "jobs/views/relative.py": "from ..ingest import validation\n",
        "jobs/common/shared.py": "import jobs.ingest.validation as v\n",
        "jobs/streaming/bad.py": "from jobs.report import job\n",
        "jobs/verify/bad.py": "from jobs.report import job\n",
        "infra/bad.py": "from lakehouse import demo\n",
        "infra/lambdas/handler/bad.py": "from jobs.config import CLICK_TOPIC\n",
        "lakehouse/bad.py": "from tests import support\n",
    }
    for name, text in cases.items():
        (fake / name).parent.mkdir(parents=True, exist_ok=True)
        (fake / name).write_text(text)
    (fake / "jobs/ingest").mkdir(parents=True, exist_ok=True)
    (fake / "jobs/ingest/validation.py").write_text("")
    (fake / "jobs/report").mkdir(parents=True, exist_ok=True)
    (fake / "jobs/report/job.py").write_text("")
    monkeypatch.setattr(sys.modules[__name__], "REPO", fake)
    for name in cases:
        assert len(wrong_way_imports(fake / name)) == 1, name
    # and a right-way import passes
    (fake / "lakehouse/good.py").write_text("from jobs.ingest import validation\nfrom infra import config\n")
    assert wrong_way_imports(fake / "lakehouse/good.py") == []
