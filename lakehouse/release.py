"""The release baseline: the last release's synthesized templates, kept in the repo.

`make baseline` (at release time; `RELEASE=<commit>` for another commit than HEAD) extracts the
release's tree from git, synthesizes dev and prod there with the CDK CLI, and writes
`tests/infra/baselines/<commit>/<env>/<stack>.template.json` plus `release.json`, replacing the
previous baseline. The synth uses this checkout's CLI, aws-cdk-lib and `dist/` (an older release's
jobs package is built there), so run it with the release checked out, as `make baseline` at release
time does by default. tests/infra/test_upgrade_baseline.py diffs today's templates against it; the
side-by-side upgrade test runs that release's code, extracted the same way.
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from lakehouse.cdk_cli import cdk_environment

REPO = Path(__file__).resolve().parents[1]
BASELINES = REPO / "tests" / "infra" / "baselines"
ENVIRONMENTS = ("dev", "prod")
# What a synth of an extracted tree borrows from this checkout (installed by `make setup`).
BORROWED = ("node_modules", ".venv", "dist")


class ReleaseError(Exception):
    """The baseline cannot be made or read; the message says why and what to do."""


@dataclass(frozen=True)
class Baseline:
    commit: str
    directory: Path

    def templates(self, env_name: str) -> dict[str, dict]:
        """Stack name -> template of one environment."""
        folder = self.directory / env_name
        return {
            path.name.removesuffix(".template.json"): json.loads(path.read_text())
            for path in sorted(folder.glob("*.template.json"))
        }


def current_baseline(root: Path = BASELINES) -> Baseline:
    found = sorted(p for p in root.glob("*/release.json"))
    if len(found) != 1:
        raise ReleaseError(f"{root}: {len(found)} release baselines, expected 1: run `make baseline`")
    release = json.loads(found[0].read_text())
    return Baseline(release["commit"], found[0].parent)


def _git(*args: str, cwd: Path = REPO) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if done.returncode:
        raise ReleaseError(f"git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


def resolve_commit(commit: str) -> str:
    """The full id of `commit`, fetching it from origin when this clone lacks it (a shallow clone)."""
    try:
        return _git("rev-parse", "--verify", f"{commit}^{{commit}}")
    except ReleaseError:
        subprocess.run(["git", "fetch", "-q", "origin", commit], cwd=REPO, capture_output=True)
        try:
            return _git("rev-parse", "--verify", f"{commit}^{{commit}}")
        except ReleaseError as error:
            raise ReleaseError(
                f"commit {commit} is not in this clone and origin did not give it: "
                "`git fetch --unshallow` (the release's code is read from git)"
            ) from error


def extract_tree(commit: str, dest: Path) -> Path:
    """The files of `commit` (tracked ones, as `git archive` gives them) under `dest`."""
    archive = subprocess.run(["git", "archive", "--format=tar", commit], cwd=REPO, capture_output=True)
    if archive.returncode:
        raise ReleaseError(f"git archive {commit}: {archive.stderr.decode().strip()}")
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        # The "data" filter (no absolute paths, links out of dest or device files) from 3.11.4 on.
        tar.extractall(dest, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    return dest


def synthesize(tree: Path, env_name: str, out: Path) -> None:
    """`cdk synth -c env=<env>` in `tree`, with this checkout's CLI, Node and venv, no local context."""
    for name in BORROWED:
        if (REPO / name).exists() and not (tree / name).exists():
            (tree / name).symlink_to(REPO / name)
    (tree / "cdk.context.json").unlink(missing_ok=True)
    env = cdk_environment(REPO, account_free=True)
    cdk = REPO / "node_modules" / ".bin" / "cdk"
    done = subprocess.run(
        [str(cdk), "synth", "-q", "-c", f"env={env_name}", "-o", str(out)],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise ReleaseError(f"cdk synth -c env={env_name} at {tree}: {done.stderr[-3000:]}")


def write_baseline(commit: str, root: Path = BASELINES, log=print) -> Baseline:
    full = resolve_commit(commit)
    target = root / full[:12]
    with tempfile.TemporaryDirectory(prefix="lakehouse-release-") as scratch:
        tree = extract_tree(full, Path(scratch) / "tree")
        staged = Path(scratch) / "baseline"
        for env_name in ENVIRONMENTS:
            log(f"cdk synth -c env={env_name} at {full[:12]}")
            out = Path(scratch) / "cdk.out" / env_name
            synthesize(tree, env_name, out)
            (staged / env_name).mkdir(parents=True)
            for template in sorted(out.glob("*.template.json")):
                # Indented and key-sorted: a later baseline's git diff reads as a template diff.
                (staged / env_name / template.name).write_text(
                    json.dumps(json.loads(template.read_text()), indent=1, sort_keys=True) + "\n"
                )
        (staged / "release.json").write_text(json.dumps({"commit": full}, indent=2) + "\n")
        for old in root.glob("*/release.json"):
            shutil.rmtree(old.parent)
        root.mkdir(parents=True, exist_ok=True)
        shutil.copytree(staged, target)
    log(f"wrote {target.relative_to(REPO) if target.is_relative_to(REPO) else target}")
    return Baseline(full, target)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lakehouse.release", description=__doc__.splitlines()[0])
    parser.add_argument("--commit", default="HEAD", help="the release's commit (default: HEAD)")
    args = parser.parse_args(argv)
    try:
        write_baseline(args.commit)
    except ReleaseError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
