"""`make package`: the artifact set the EMR steps run, built offline into `dist/emr/<version>/`.

Packaging choice: one archive per CPU architecture, shipped per step with `spark.archives`
(`pyenv-<arch>.zip#pyenv`, put on PYTHONPATH, run by the node's /usr/bin/python3.11). A code or
dependency change is then a new S3 prefix in the step arguments, never a new cluster (bootstrap
actions are create-only on AWS::EMR::Cluster), and an old step keeps its own archive until it is
replaced. The archive is a plain `pip install --target` tree, not a venv, so nothing in it points at
an interpreter path.

`<version>` is a hash of the jobs' sources and pinned requirements: the same tree always builds
the same version with byte-identical files. Contents:
- `lakehouse_jobs-0.1.0+<version>-py3-none-any.whl` in each wheelhouse: only the `jobs` package
  (no local stack, demo or CDK app);
- `wheelhouse-<arch>/`: that wheel plus the pinned manylinux wheels of `jobs/requirements-emr.txt`
  for CPython 3.11 (kept locally for inspection; not uploaded);
- `pyenv-<arch>.zip`: the wheelhouse installed, zipped deterministically (uploaded);
- `emr_step.py`: the spark-submit entry point; `manifest.json`: every file with size and sha256, the
  version, the git revision.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
JOBS_DIR = REPO / "jobs"
REQUIREMENTS = JOBS_DIR / "requirements-emr.txt"
# The same pins with the hashes of their files (`make lock`): the wheels are downloaded hash-checked.
REQUIREMENTS_LOCK = JOBS_DIR / "requirements-emr.lock"
ENTRY_POINT = JOBS_DIR / "emr_step.py"
DEFAULT_OUTPUT = REPO / "dist" / "emr"
PYTHON_VERSION = "3.11"
JOBS_DISTRIBUTION = "lakehouse_jobs"
JOBS_BASE_VERSION = "0.1.0"
# Wheel tags accepted per architecture. AL2023 (EMR 7) has glibc 2.34: manylinux_2_28 wheels run
# there (confluent-kafka ships only those), and older manylinux2014 ones too.
PLATFORMS = {
    "x86_64": ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"),
    "aarch64": ("manylinux_2_28_aarch64", "manylinux_2_17_aarch64", "manylinux2014_aarch64"),
}
_FIXED_ZIP_TIME = (1980, 1, 1, 0, 0, 0)
_SOURCE_DATE_EPOCH = "315532800"  # 1980-01-01: wheel builds use it for their zip entries
KEEP_BUILDS = 3  # versions kept in dist/emr (each is ~220 MB)


class PackageError(RuntimeError):
    """The package could not be built; the message says what to do."""


@dataclass(frozen=True)
class PackagedFile:
    name: str
    bytes: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    version: str
    git_revision: str
    python_version: str
    architectures: tuple[str, ...]
    requirements: tuple[str, ...]
    files: tuple[PackagedFile, ...]

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        raw = json.loads(text)
        return cls(
            version=raw["version"],
            git_revision=raw["git_revision"],
            python_version=raw["python_version"],
            architectures=tuple(raw["architectures"]),
            requirements=tuple(raw["requirements"]),
            files=tuple(PackagedFile(**f) for f in raw["files"]),
        )


def architectures_for(instance_types: Iterable[str]) -> tuple[str, ...]:
    """CPU architectures of EC2 instance types: Graviton families end in `g` (m7g, c6gd -> `g` +
    options), everything else here is x86_64."""
    arches = set()
    for instance_type in instance_types:
        family = instance_type.split(".")[0]
        generation_and_options = family.lstrip("abcdefghijklmnopqrstuvwxyz")[1:]  # after the digit
        arches.add("aarch64" if generation_and_options.startswith("g") else "x86_64")
    return tuple(sorted(arches))


def requirement_lines() -> tuple[str, ...]:
    lines = (line.strip() for line in REQUIREMENTS.read_text().splitlines())
    return tuple(line for line in lines if line and not line.startswith("#"))


# Besides the modules: the streaming application's FAIR scheduler pools, the RDS CA bundle.
JOB_DATA_FILES = ("*.xml", "*.pem")


def _job_sources() -> list[Path]:
    found = [p for pattern in ("*.py", *JOB_DATA_FILES) for p in JOBS_DIR.rglob(pattern)]
    return sorted(p for p in found if "__pycache__" not in p.parts)


def source_version() -> str:
    """12 hex digits of sha256 over the jobs' sources, the pinned requirements and this builder."""
    digest = hashlib.sha256()
    for path in [*_job_sources(), REQUIREMENTS, REQUIREMENTS_LOCK, Path(__file__)]:
        digest.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def git_revision() -> str:
    try:
        revision = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", "jobs", "infra/emr_package.py"],
        cwd=REPO,
        capture_output=True,
        text=True,
    ).stdout.strip()
    return f"{revision}-dirty" if dirty else revision


def build(
    output_root: Path = DEFAULT_OUTPUT, architectures: tuple[str, ...] = ("x86_64",), log=print
) -> Path:
    """Build (or reuse) `output_root/<version>/`; returns that directory."""
    unknown = set(architectures) - set(PLATFORMS)
    if unknown:
        raise PackageError(f"unsupported architecture(s) {sorted(unknown)}: use {sorted(PLATFORMS)}")
    version = source_version()
    target = output_root / version
    if _is_complete(target, architectures):
        log(f"dist/emr/{version} is up to date ({', '.join(architectures)})")
        return target
    staging = Path(tempfile.mkdtemp(prefix=f".{version}-", dir=_ensure(output_root)))
    try:
        with tempfile.TemporaryDirectory() as scratch:
            wheel = _build_jobs_wheel(version, Path(scratch), log)
            for arch in architectures:
                wheelhouse = staging / f"wheelhouse-{arch}"
                _download_wheels(arch, wheelhouse, log)
                shutil.copy2(wheel, wheelhouse / wheel.name)
                archive = staging / f"pyenv-{arch}.zip"
                _zip_tree(_install_tree(arch, version, wheelhouse, Path(scratch) / arch, log), archive)
                log(f"  {archive.name}: {archive.stat().st_size / 1e6:.1f} MB")
        shutil.copyfile(ENTRY_POINT, staging / ENTRY_POINT.name)
        manifest = Manifest(
            version=version,
            git_revision=git_revision(),
            python_version=PYTHON_VERSION,
            architectures=tuple(sorted(architectures)),
            requirements=requirement_lines(),
            files=tuple(_describe(staging, path) for path in sorted(_payload(staging))),
        )
        (staging / "manifest.json").write_text(manifest.to_json())
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log(f"built dist/emr/{version}")
    _prune_old_builds(output_root, keep=KEEP_BUILDS)
    return target


def _prune_old_builds(output_root: Path, keep: int) -> None:
    """Each code change builds a new ~220 MB version: keep only the newest few locally (the
    deployed ones stay in S3)."""
    builds = sorted(
        (d for d in output_root.iterdir() if d.is_dir() and (d / "manifest.json").exists()),
        key=lambda d: (d / "manifest.json").stat().st_mtime,
        reverse=True,
    )
    for old in builds[keep:]:
        shutil.rmtree(old, ignore_errors=True)


def verify(directory: Path) -> Manifest:
    """The manifest of `directory`, after checking every listed file's size and sha256."""
    manifest = Manifest.from_json((directory / "manifest.json").read_text())
    listed = {f.name for f in manifest.files}
    present = {str(p.relative_to(directory)) for p in _payload(directory)}
    if listed != present:
        raise PackageError(f"{directory}: manifest and files differ: {sorted(listed ^ present)}")
    for entry in manifest.files:
        actual = _describe(directory, directory / entry.name)
        if actual != entry:
            raise PackageError(f"{directory / entry.name}: size or sha256 differs from the manifest")
    return manifest


# ---- steps ---------------------------------------------------------------------------------------


def _ensure(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _is_complete(directory: Path, architectures: tuple[str, ...]) -> bool:
    try:
        manifest = verify(directory)
    except (OSError, ValueError, KeyError, PackageError):
        return False
    return set(architectures) <= set(manifest.architectures)


def _payload(directory: Path) -> list[Path]:
    return [p for p in directory.rglob("*") if p.is_file() and p.name != "manifest.json"]


def _describe(root: Path, path: Path) -> PackagedFile:
    data = path.read_bytes()
    return PackagedFile(str(path.relative_to(root)), len(data), hashlib.sha256(data).hexdigest())


def _pip(*args: str, env: dict[str, str] | None = None) -> None:
    command = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *args]
    result = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **(env or {})})
    if result.returncode != 0:
        raise PackageError(f"`pip {' '.join(args[:2])} …` failed:\n{result.stderr.strip()[-2000:]}")


def _build_jobs_wheel(version: str, scratch: Path, log) -> Path:
    """A wheel of the `jobs` package alone, with a fixed timestamp so rebuilding gives the same bytes."""
    project = scratch / "jobs-project"
    for source in _job_sources():
        copy = project / source.relative_to(REPO)
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, copy)
    (project / "pyproject.toml").write_text(
        "[build-system]\nrequires = ['setuptools>=68', 'wheel']\nbuild-backend = 'setuptools.build_meta'\n\n"
        f"[project]\nname = '{JOBS_DISTRIBUTION}'\nversion = '{JOBS_BASE_VERSION}+{version}'\n"
        "requires-python = '>=3.11,<3.12'\n"
        f"dependencies = {json.dumps(list(requirement_lines()))}\n"
        "description = 'Lakehouse PySpark jobs (EMR steps)'\n\n"
        "[tool.setuptools.packages.find]\ninclude = ['jobs*']\n\n"
        # "*": in every package of jobs/ (the scheduler pools live in jobs/streaming/)
        f"[tool.setuptools.package-data]\n'*' = {json.dumps(list(JOB_DATA_FILES))}\n"
    )
    out = _ensure(scratch / "wheel")
    log("  jobs wheel")
    _pip(
        "wheel", "--no-deps", "--no-build-isolation", "-w", str(out), str(project),
        env={"SOURCE_DATE_EPOCH": _SOURCE_DATE_EPOCH},
    )  # fmt: skip
    (wheel,) = out.glob("*.whl")
    return wheel


def _platform_args(arch: str) -> list[str]:
    args = ["--only-binary=:all:", "--implementation", "cp", "--python-version", PYTHON_VERSION]
    for platform in PLATFORMS[arch]:
        args += ["--platform", platform]
    return args


def _download_wheels(arch: str, wheelhouse: Path, log) -> None:
    log(f"  wheels for CPython {PYTHON_VERSION} {arch} (pip download)")
    _pip(
        "download",
        "--no-deps",
        "-d",
        str(_ensure(wheelhouse)),
        *_platform_args(arch),
        "--require-hashes",
        "-r",
        str(REQUIREMENTS_LOCK),
    )


def _install_tree(arch: str, version: str, wheelhouse: Path, tree: Path, log) -> Path:
    log(f"  installing the {arch} wheelhouse into the archive tree")
    # By name from --find-links, not by file path: a path install records it (direct_url.json), and
    # the staging path differs per build. Resolving the jobs wheel's pinned dependencies also proves
    # the wheelhouse complete.
    _pip(
        "install", "--no-index", "--find-links", str(wheelhouse), "--target", str(tree), "--no-compile",
        *_platform_args(arch), f"{JOBS_DISTRIBUTION}=={JOBS_BASE_VERSION}+{version}",
    )  # fmt: skip
    # Console scripts carry the build machine's interpreter path and nothing runs them on EMR.
    shutil.rmtree(tree / "bin", ignore_errors=True)
    return tree


def _zip_tree(tree: Path, archive: Path) -> None:
    """Zip with sorted entries, a fixed timestamp and normalized modes: same tree, same bytes."""
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED, compresslevel=6) as zf:
        for path in sorted(p for p in tree.rglob("*") if p.is_file()):
            info = zipfile.ZipInfo(str(path.relative_to(tree)), _FIXED_ZIP_TIME)
            executable = path.stat().st_mode & 0o111
            info.external_attr = (0o100755 if executable else 0o100644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, path.read_bytes(), compresslevel=6)


# ---- command line ----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make package", description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    parser.add_argument(
        "--arch", action="append", choices=sorted(PLATFORMS), help="repeatable; default x86_64"
    )
    args = parser.parse_args(argv)
    try:
        directory = build(args.output, tuple(args.arch or ("x86_64",)))
        manifest = verify(directory)
    except PackageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    uploaded = [f for f in manifest.files if not f.name.startswith("wheelhouse-")]
    for entry in uploaded:
        print(f"  {entry.name:<28} {entry.bytes / 1e6:8.1f} MB  sha256 {entry.sha256[:16]}…")
    print(f"version {manifest.version} (git {manifest.git_revision}) in {directory}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
