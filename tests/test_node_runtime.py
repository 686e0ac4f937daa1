"""The CDK CLI and jsii run on the Node that `make setup` pins in node_modules, never an end-of-life one.

jsii (started by every `import aws_cdk`) runs $JSII_NODE, else `node` from PATH
(jsii/_kernel/providers/process.py); the CDK CLI is `#!/usr/bin/env node`. The image's /usr/bin/node
is Node 20, end-of-life for jsii since 2026-10-30: jsii then prints an 11-line banner on every import.
Each case runs with a clean environment (no JSII_SILENCE_* variables) whose plain PATH finds that
Node 20, so only the mechanism under test can pick the right one. A `--require` preload reports the
Node each process really ran on.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
REPO_NODE = REPO / "node_modules" / ".bin" / "node"
CDK = REPO / "node_modules" / ".bin" / "cdk"
MIN_MAJOR = 22  # jsii's supported releases on 2026-11-25: ^22 (end-of-life 2027-04-30) and ^24
# jsii's banners (end-of-life, deprecated = past end-of-life, untested, known broken) all share these.
BANNER_TEXT = ("!!!!!!!!", "end-of-life", "currently running on node", "upgrade to a supported node")
PLAIN_PATH = "/usr/local/bin:/usr/bin:/bin"

pytestmark = pytest.mark.timeout(60)


def _major(version: str) -> int:
    return int(version.lstrip("v").split(".")[0])


def _clean_env(**extra: str) -> dict[str, str]:
    return {"PATH": PLAIN_PATH, "HOME": os.environ.get("HOME", "/root"), **extra}


@pytest.fixture(scope="module")
def repo_node() -> Path:
    if not REPO_NODE.exists():
        pytest.fail(f"{REPO_NODE.relative_to(REPO)} is missing: run `make setup` (its `cli` target)")
    return REPO_NODE


@pytest.fixture
def reporting(tmp_path: Path):
    """(env additions that make every Node process append its version and binary to a file, reader)."""
    preload = tmp_path / "report-node.js"
    report = tmp_path / "nodes.jsonl"
    preload.write_text(
        'require("fs").appendFileSync(process.env.NODE_RUNTIME_REPORT, JSON.stringify('
        "{version: process.version, execPath: process.execPath}) + '\\n');\n"
    )
    env = {"NODE_OPTIONS": f"--require {preload}", "NODE_RUNTIME_REPORT": str(report)}

    def nodes() -> list[dict]:
        assert report.exists(), "no Node process started"
        return [json.loads(line) for line in report.read_text().splitlines()]

    return env, nodes


def _assert_repo_node(nodes: list[dict], what: str) -> None:
    for node in nodes:
        assert _major(node["version"]) >= MIN_MAJOR, (
            f"{what} ran on Node {node['version']} ({node['execPath']})"
        )
        assert Path(node["execPath"]).resolve() == REPO_NODE.resolve(), f"{what} ran {node['execPath']}"


def _assert_no_banner(stderr: str, what: str) -> None:
    found = [text for text in BANNER_TEXT if text in stderr.lower()]
    assert not found, f"{what} printed a Node banner ({found}):\n{stderr}"


def _makefile_env() -> dict[str, str]:
    """PATH and JSII_NODE exactly as the Makefile's recipes see them."""
    done = subprocess.run(
        [
            "make",
            "-s",
            "--no-print-directory",
            '--eval=_node_env: ; @echo "$$PATH"; echo "$$JSII_NODE"',
            "_node_env",
        ],
        cwd=REPO,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    path, jsii_node = done.stdout.splitlines()[-2:]
    return {"PATH": path, "JSII_NODE": jsii_node}


def test_pinned_node_is_a_supported_lts(repo_node: Path) -> None:
    version = subprocess.run([str(repo_node), "--version"], capture_output=True, text=True, check=True).stdout
    assert _major(version) >= MIN_MAJOR, version
    pinned = json.loads((REPO / "package.json").read_text())["optionalDependencies"]
    assert {v.split(".")[0] for v in pinned.values()} == {version.strip().lstrip("v").split(".")[0]}


def test_make_runs_jsii_and_the_cdk_cli_on_the_pinned_node(repo_node: Path, reporting) -> None:
    extra, nodes = reporting
    make_env = _makefile_env()
    assert Path(make_env["JSII_NODE"]).resolve() == repo_node.resolve()
    env = _clean_env(**make_env, **extra)
    assert Path(shutil.which("node", path=env["PATH"])).resolve() == repo_node.resolve()

    done = subprocess.run(
        [sys.executable, "-c", "import aws_cdk"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    _assert_no_banner(done.stderr, "import aws_cdk")
    assert done.stderr == ""
    _assert_repo_node(nodes(), "jsii under make")

    done = subprocess.run(
        [str(CDK), "--version"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout.startswith("2."), done.stdout + done.stderr
    _assert_no_banner(done.stderr, "cdk --version")
    _assert_repo_node(nodes(), "the CDK CLI under make")


def test_app_py_picks_the_pinned_node_outside_make(repo_node: Path, reporting) -> None:
    """`cdk synth` by hand or `python app.py`: plain PATH, no JSII_NODE; app.py chooses before aws_cdk."""
    extra, nodes = reporting
    done = subprocess.run(
        [sys.executable, "-c", "import os, app; print(os.environ['JSII_NODE'])"],
        cwd=REPO,
        env=_clean_env(**extra),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    _assert_no_banner(done.stderr, "import app")
    assert Path(done.stdout.strip()).resolve() == repo_node.resolve()
    _assert_repo_node(nodes(), "jsii from app.py")


def test_this_session_would_start_jsii_on_a_supported_node(repo_node: Path) -> None:
    """In-process CDK tests (tests/infra) import aws_cdk in this very process: `make test` exports
    JSII_NODE, and tests/conftest.py sets it for pytest run directly."""
    node = os.environ.get("JSII_NODE") or shutil.which("node")  # jsii's own choice
    assert node, "no Node for jsii"
    version = subprocess.run([node, "--version"], capture_output=True, text=True, check=True).stdout
    assert _major(version) >= MIN_MAJOR, (
        f"jsii in this session would run {node} ({version.strip()}): set JSII_NODE={repo_node}"
    )
