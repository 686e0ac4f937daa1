"""Lambda asset bundling without Docker.

The seeding function needs PyMySQL, a pure-Python package that is already installed in the synth
environment (it is a project dependency). Local bundling copies the handler directory and the
installed `pymysql` package into the asset; Docker is never needed (there is none on CI). Single
modules shared with the rest of the project (the seed data) are copied next to the handler.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import jsii
from aws_cdk import AssetHashType, BundlingOptions, DockerImage, ILocalBundling
from aws_cdk import aws_lambda as lambda_

LAMBDAS_DIR = Path(__file__).resolve().parent / "lambdas"


def _installed_package_dir(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            f"{package} is not installed in the Python running the CDK app: run `make setup` "
            f"(or `pip install -e .[infra]`) and synth again"
        )
    return Path(next(iter(spec.submodule_search_locations)))


@jsii.implements(ILocalBundling)
class CopyPurePythonPackages:
    """Copy a handler directory, shared module files and installed pure-Python packages."""

    def __init__(self, source_dir: Path, packages: tuple[str, ...], files: tuple[Path, ...]) -> None:
        self._source_dir = source_dir
        self._packages = packages
        self._files = files

    def try_bundle(self, output_dir: str, *args, **kwargs) -> bool:  # noqa: ARG002 - jsii API
        out = Path(output_dir)
        shutil.copytree(
            self._source_dir, out, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__")
        )
        for package in self._packages:
            shutil.copytree(
                _installed_package_dir(package),
                out / package,
                dirs_exist_ok=True,
                ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
            )
        for file in self._files:
            shutil.copy2(file, out / file.name)
        return True


@jsii.implements(ILocalBundling)
class InstallWheels:
    """Copy a handler directory and pip-install its `requirements.lock` (its requirements.txt pinned
    with hashes by `make lock`) for the Lambda's platform (manylinux wheels of CPython
    `python_version`, x86_64): native packages without Docker, each file checked against its hash."""

    def __init__(self, source_dir: Path, python_version: str) -> None:
        self._source_dir = source_dir
        self._python_version = python_version

    def try_bundle(self, output_dir: str, *args, **kwargs) -> bool:  # noqa: ARG002 - jsii API
        out = Path(output_dir)
        ignore = shutil.ignore_patterns("__pycache__", "requirements.txt", "requirements.lock")
        shutil.copytree(self._source_dir, out, dirs_exist_ok=True, ignore=ignore)
        platforms = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
        command = [
            sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-compile",
            "--target", str(out), "--only-binary=:all:", "--implementation", "cp",
            "--python-version", self._python_version, *(a for p in platforms for a in ("--platform", p)),
            "--require-hashes", "-r", str(self._source_dir / "requirements.lock"),
        ]  # fmt: skip
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(
                f"installing {self._source_dir.name}'s requirements for the Lambda failed (PyPI "
                f"reachable?):\n{result.stderr[-2000:]}"
            )
        shutil.rmtree(out / "bin", ignore_errors=True)
        return True


def python_function_code_with_wheels(handler_dir: str, python_version: str) -> lambda_.Code:
    """Asset code of `infra/lambdas/<handler_dir>` plus its requirements.txt installed for Lambda."""
    source = LAMBDAS_DIR / handler_dir
    return lambda_.Code.from_asset(
        str(source),
        asset_hash_type=AssetHashType.SOURCE,
        bundling=BundlingOptions(
            image=DockerImage.from_registry("public.ecr.aws/sam/build-python3.13"),  # never used
            local=InstallWheels(source, python_version),
        ),
    )


def python_function_code(
    handler_dir: str, packages: tuple[str, ...] = (), files: tuple[Path, ...] = ()
) -> lambda_.Code:
    """Asset code of `infra/lambdas/<handler_dir>`, with `packages` and `files` added when given."""
    source = LAMBDAS_DIR / handler_dir
    if not packages and not files:
        return lambda_.Code.from_asset(str(source), exclude=["__pycache__"])
    return lambda_.Code.from_asset(
        str(source),
        asset_hash_type=AssetHashType.OUTPUT,
        bundling=BundlingOptions(
            # Only used if local bundling declined, which it never does.
            image=DockerImage.from_registry("public.ecr.aws/sam/build-python3.13"),
            local=CopyPurePythonPackages(source, packages, files),
        ),
    )
