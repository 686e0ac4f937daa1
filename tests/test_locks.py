"""Every Python install pins each package with the hashes of its files (security round 3, item 8):
the locks cover what their inputs ask for, and the installs read them with --require-hashes."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# lock -> the file `make lock` compiles it from
LOCKS = {
    "requirements.lock": "pyproject.toml",
    "scripts/checkov-requirements.lock": "scripts/checkov-requirements.txt",
    "jobs/requirements-emr.lock": "jobs/requirements-emr.txt",
    **{
        f"{tls}/requirements.lock": f"{tls}/requirements.txt"
        for tls in ["infra/lambdas/emr_tls_certificates"]
    },
}
PIN = re.compile(r"^([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?==([^\s;\\]+)")


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_entries(path: Path) -> dict[str, tuple[str, int]]:
    """{package: (version, hashes)} of a lock file."""
    entries: dict[str, tuple[str, int]] = {}
    current = None
    for line in path.read_text().splitlines():
        if match := PIN.match(line):
            current = normalized(match[1])
            entries[current] = (match[2], 0)
        elif current and line.strip().startswith("--hash=sha256:"):
            version, hashes = entries[current]
            entries[current] = (version, hashes + 1)
    return entries


def input_pins(path: Path) -> dict[str, str | None]:
    """{package: pinned version or None (a range)} that an input file asks for."""
    if path.suffix == ".toml":
        project = tomllib.loads(path.read_text())["project"]
        lines = [
            *project["dependencies"],
            *(d for group in project["optional-dependencies"].values() for d in group),
        ]
    else:
        lines = [line.split("#")[0].strip() for line in path.read_text().splitlines()]
    pins: dict[str, str | None] = {}
    for line in filter(None, lines):
        if match := PIN.match(line):
            pins[normalized(match[1])] = match[2]
        else:
            pins[normalized(re.split(r"[<>=!~\[; ]", line, maxsplit=1)[0])] = None
    return pins


@pytest.mark.parametrize("lock", sorted(LOCKS))
def test_each_lock_pins_what_its_input_asks_for_with_hashes(lock):
    entries = lock_entries(REPO / lock)
    assert entries, lock
    unhashed = sorted(name for name, (_, hashes) in entries.items() if hashes == 0)
    assert unhashed == [], f"{lock}: no --hash for {unhashed}"
    for name, version in input_pins(REPO / LOCKS[lock]).items():
        assert name in entries, f"{lock} lacks {name} ({LOCKS[lock]} asks for it): run `make lock`"
        if version is not None:
            assert entries[name][0] == version, (
                f"{lock} pins {name}=={entries[name][0]}, {LOCKS[lock]} {version}"
            )


def test_the_installs_read_the_locks_with_require_hashes():
    makefile = (REPO / "Makefile").read_text()
    assert "pip install -q --require-hashes -r requirements.lock" in makefile
    assert "--no-deps --no-build-isolation -e ." in makefile  # the project itself fetches nothing
    assert "pip install -q --require-hashes -r scripts/checkov-requirements.lock" in makefile
    assert "npm ci " in makefile and "npm install " not in makefile
    emr = (REPO / "infra" / "emr_package.py").read_text()
    bundling = (REPO / "infra" / "bundling.py").read_text()
    assert '"--require-hashes",\n        "-r",\n        str(REQUIREMENTS_LOCK)' in emr
    assert '"--require-hashes", "-r", str(self._source_dir / "requirements.lock")' in bundling
    build = lock_entries(REPO / "requirements.lock")
    assert {"pip", "setuptools", "wheel"} <= set(build)  # what the install and the build run
