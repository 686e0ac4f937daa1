"""`make package`: what the EMR steps run, built offline, complete, minimal and reproducible."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from infra import emr_package
from jobs.registry import JOBS

JOB_MODULES = (*(f"jobs.{name}.__main__" for name in JOBS), "jobs.emr_step")
REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow  # builds the artifact set and installs it into a venv


@pytest.fixture(scope="module")
def package(tmp_path_factory) -> Path:
    """A copy (the tests tamper with it) of `dist/emr/<version>`: the build `cdk synth` made for
    these sources (tests/infra synthesizes first), or one made now; an x86_64 build of its own if
    that one holds more architectures. The reproducibility test builds again, from nothing."""
    quiet = {"log": lambda _msg: None}
    built = emr_package.build(emr_package.DEFAULT_OUTPUT, ("x86_64",), **quiet)
    if emr_package.verify(built).architectures != ("x86_64",):  # `make package` for Graviton too
        return emr_package.build(tmp_path_factory.mktemp("emr"), ("x86_64",), **quiet)
    return Path(shutil.copytree(built, tmp_path_factory.mktemp("emr") / built.name))


def test_jobs_import_nothing_from_the_local_tooling():
    """The dependency is one-way (lakehouse -> jobs), so the EMR artifact can hold `jobs` alone."""
    offenders = []
    for source in sorted(emr_package.JOBS_DIR.rglob("*.py")):
        for node in ast.walk(ast.parse(source.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            offenders += [f"{source.name}: {n}" for n in names if n.split(".")[0] in ("lakehouse", "infra")]
    assert offenders == []


def test_the_manifest_lists_every_file_with_its_size_and_hash(package):
    manifest = emr_package.verify(package)
    assert manifest.version == package.name == emr_package.source_version()
    names = {f.name for f in manifest.files}
    assert {"emr_step.py", "pyenv-x86_64.zip"} <= names
    (package / "emr_step.py").write_text("tampered")
    with pytest.raises(emr_package.PackageError, match="emr_step.py"):
        emr_package.verify(package)
    (package / "emr_step.py").write_bytes(emr_package.ENTRY_POINT.read_bytes())


def test_wheels_are_for_cpython_311_manylinux_x86_64_or_pure(package):
    wheels = sorted((package / "wheelhouse-x86_64").glob("*.whl"))
    assert any(w.name.startswith("lakehouse_jobs-0.1.0+") for w in wheels)
    for wheel in wheels:
        *_, python_tag, abi_tag, platform_tag = wheel.stem.split("-")
        pure = abi_tag == "none" and platform_tag == "any"
        native = python_tag == "cp311" and "manylinux" in platform_tag and platform_tag.endswith("x86_64")
        assert pure or native, wheel.name


def archive_names(package: Path) -> set[str]:
    with zipfile.ZipFile(package / "pyenv-x86_64.zip") as archive:
        return set(archive.namelist())


def test_the_archive_holds_the_jobs_and_their_dependencies_only(package):
    with zipfile.ZipFile(package / "pyenv-x86_64.zip") as archive:
        tops = {name.split("/")[0] for name in archive.namelist()}
    assert {"jobs", "confluent_kafka", "pymysqlreplication", "pyarrow", "aws_msk_iam_sasl_signer"} <= tops
    # The streaming application's scheduler pools travel with the module that names them.
    from jobs.streaming.application import job_spark_conf

    pools = Path(job_spark_conf()["spark.scheduler.allocation.file"]).relative_to(REPO)
    assert str(pools) in archive_names(package)
    assert not tops & {"lakehouse", "infra", "tests", "bin", "pyspark"}


def test_the_wheelhouse_installs_offline_and_every_job_imports_without_a_checkout(package, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    version = f"{emr_package.JOBS_BASE_VERSION}+{package.name}"
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-index", "--find-links",
         str(package / "wheelhouse-x86_64"), f"lakehouse_jobs=={version}"],
        check=True,
    )  # fmt: skip
    # Spark itself is the cluster's (EMR ships it): lend this venv only pyspark and py4j.
    provided = tmp_path / "emr-provided"
    provided.mkdir()
    for package_name in ("pyspark", "py4j"):
        module = __import__(package_name)
        (provided / package_name).symlink_to(Path(module.__file__).parent)
    site = next((venv / "lib").glob("python3.*/site-packages"))
    (site / "emr-provided.pth").write_text(f"{provided}\n")

    probe = f"import {', '.join(JOB_MODULES)}; import jobs; print(jobs.__file__)"
    result = subprocess.run(
        [str(python), "-I", "-c", probe], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().startswith(str(venv))


def test_two_builds_of_the_same_tree_are_byte_identical(package, tmp_path):
    again = emr_package.build(tmp_path, ("x86_64",), log=lambda _msg: None)
    first, second = emr_package.verify(package), emr_package.verify(again)
    # Every file, byte for byte (`package` may come from an earlier commit with the same sources:
    # only the recorded git revision may differ).
    assert (first.version, first.files) == (second.version, second.files)
    assert first.files and first.architectures == second.architectures


def test_instance_types_map_to_their_architecture():
    assert emr_package.architectures_for(["m5.xlarge", "m6i.2xlarge", "m5a.xlarge"]) == ("x86_64",)
    assert emr_package.architectures_for(["m7g.xlarge", "c6gd.2xlarge"]) == ("aarch64",)
    assert emr_package.architectures_for(["m6g.xlarge", "m6i.xlarge"]) == ("aarch64", "x86_64")


def test_only_the_newest_builds_are_kept_locally(tmp_path):
    import os

    for age, name in enumerate(["newest", "second", "third", "fourth", "fifth"]):
        (tmp_path / name).mkdir()
        manifest = tmp_path / name / "manifest.json"
        manifest.write_text("{}")
        os.utime(manifest, (1_000_000 - age, 1_000_000 - age))
    (tmp_path / "not-a-build").mkdir()
    emr_package._prune_old_builds(tmp_path, keep=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["newest", "not-a-build", "second", "third"]
