"""S3 as folders: `s3://<bucket>/<key>` is `<root>/<bucket>/<key>`, holding exactly the objects the
templates' BucketDeployments upload (their staged assets, deploy-time markers replaced)."""

from __future__ import annotations

import fnmatch
import os
import shutil
import zipfile
from pathlib import Path

from lakehouse.rehearsal.assembly import AssemblyError, CloudAssembly, Resolver, require_resolved

BUCKET_DEPLOYMENT = "Custom::CDKBucketDeployment"


class LocalS3:
    def __init__(self, root: Path) -> None:
        self.root = root

    def path_of(self, uri: str) -> Path:
        """The file of an `s3://` or (localized) `file://` URI."""
        if uri.startswith("file://"):
            return Path(uri.removeprefix("file://"))
        if not uri.startswith("s3://"):
            raise AssemblyError(f"not an S3 URI: {uri}")
        bucket, _, key = uri.removeprefix("s3://").partition("/")
        return self.root / bucket / key

    def deploy_all(self, assembly: CloudAssembly, resolver: Resolver, log) -> list[str]:
        """Run every BucketDeployment of the assembly; returns the `s3://` prefixes written."""
        written = []
        for deployment in assembly.resources(BUCKET_DEPLOYMENT):
            props = resolver.resolve(deployment.stack, deployment.properties)
            bucket = props["DestinationBucketName"]
            prefix = props.get("DestinationBucketKeyPrefix", "")
            markers = props.get("SourceMarkers") or [{} for _ in props["SourceObjectKeys"]]
            require_resolved(f"{deployment.stack}/{deployment.logical_id}", [bucket, prefix, markers])
            destination = self.root / bucket / prefix
            files = 0
            for key, source_markers in zip(props["SourceObjectKeys"], markers, strict=True):
                asset, packaging = assembly.file_asset(key)
                files += _copy_asset(asset, packaging, destination, source_markers, props.get("Exclude", []))
            written.append(f"s3://{bucket}/{prefix}")
            log(f"deployed {files} object(s) to s3://{bucket}/{prefix} ({deployment.logical_id})")
        return written


def _copy_asset(asset: Path, packaging: str, destination: Path, markers: dict, exclude: list[str]) -> int:
    destination.mkdir(parents=True, exist_ok=True)
    count = 0
    if packaging == "zip" and asset.is_dir():
        entries = [(p, p.relative_to(asset).as_posix()) for p in sorted(asset.rglob("*")) if p.is_file()]
        for path, name in entries:
            if any(fnmatch.fnmatch(name, pattern) for pattern in exclude):
                continue
            _write(destination / name, path, markers)
            count += 1
    elif zipfile.is_zipfile(asset):
        with zipfile.ZipFile(asset) as archive:
            for name in archive.namelist():
                if name.endswith("/") or any(fnmatch.fnmatch(name, p) for p in exclude):
                    continue
                target = destination / name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(_replace_markers(archive.read(name), markers))
                count += 1
    else:
        raise AssemblyError(f"asset {asset} ({packaging}) is neither a folder nor a zip")
    return count


def _write(target: Path, source: Path, markers: dict) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists() or target.is_symlink():
        target.unlink()
    if markers:
        target.write_bytes(_replace_markers(source.read_bytes(), markers))
        return
    try:  # the ~110 MB archive: a hard link, not a copy, where the file system allows
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def _replace_markers(data: bytes, markers: dict) -> bytes:
    """What the BucketDeployment handler does: deploy-time values in place of `<<marker:…>>`."""
    for marker, value in markers.items():
        data = data.replace(marker.encode(), str(value).encode())
    return data
