"""SeaweedFS in `mini` mode: a local S3 server that makes the broker's storage durable."""

from __future__ import annotations

import shutil
import sys
import urllib.error
import urllib.request
from pathlib import Path

from lakehouse.local.process import ManagedProcess, StackError
from lakehouse.local.settings import StackSettings, object_store_ports

BROKER_BUCKET = "tansu"


def _weed_binary() -> str:
    candidate = Path(sys.prefix) / "bin" / "weed"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("weed")
    if not found:
        raise StackError("SeaweedFS (weed) not found: run `make setup` (pip extra `local`)")
    return found


class ObjectStore:
    def __init__(self, settings: StackSettings) -> None:
        self.settings = settings
        self.process = ManagedProcess("seaweedfs", settings.run_dir, settings.log_dir, "weed")

    @property
    def endpoint(self) -> str:
        return f"http://{self.settings.host}:{self.settings.s3_port}"

    def ports(self) -> list[int]:
        return object_store_ports(self.settings.s3_port)

    def start(self, secrets: dict[str, str]) -> None:
        if self.process.is_running():
            return
        base = self.settings.s3_port
        self.settings.s3_dir.mkdir(parents=True, exist_ok=True)
        self.process.start(
            [
                _weed_binary(),
                "mini",
                f"-dir={self.settings.s3_dir}",
                f"-ip={self.settings.host}",
                f"-ip.bind={self.settings.host}",
                f"-s3.port={base}",
                f"-master.port={base + 1}",
                f"-volume.port={base + 2}",
                f"-filer.port={base + 3}",
                f"-admin.port={base + 4}",
                f"-s3.port.iceberg={base + 5}",
                f"-s3.port.lance={base + 6}",
                "-webdav=false",
                "-admin.ui=false",
                # Small volumes: the default 1 GiB each is wasteful for a laptop demo.
                "-master.volumeSizeLimitMB=64",
            ],
            env={
                "AWS_ACCESS_KEY_ID": secrets["s3_access_key"],
                "AWS_SECRET_ACCESS_KEY": secrets["s3_secret_key"],
                "S3_BUCKET": BROKER_BUCKET,
            },
            cwd=self.settings.s3_dir,
        )
        self.process.wait_until(self.healthy, 60, f"S3 endpoint {self.endpoint}")

    def healthy(self) -> bool:
        return self.process.is_running() and self.answers()

    def answers(self) -> bool:
        """Whether anything serves S3 at the endpoint."""
        try:
            urllib.request.urlopen(self.endpoint, timeout=2)
        except urllib.error.HTTPError:
            return True  # AccessDenied for an anonymous request still means it serves S3
        except OSError:
            return False
        return True

    def client(self, secrets: dict[str, str]):
        """A boto3 S3 client of this store (the same credentials as the broker's)."""
        import boto3

        env = self.client_env(secrets)
        return boto3.client(
            "s3",
            endpoint_url=env["AWS_ENDPOINT"],
            aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
            region_name=env["AWS_DEFAULT_REGION"],
        )

    def client_env(self, secrets: dict[str, str]) -> dict[str, str]:
        """Environment an S3 client (the broker) needs to use this store."""
        return {
            "AWS_ENDPOINT": self.endpoint,
            "AWS_ALLOW_HTTP": "true",
            "AWS_ACCESS_KEY_ID": secrets["s3_access_key"],
            "AWS_SECRET_ACCESS_KEY": secrets["s3_secret_key"],
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def stop(self) -> bool:
        return self.process.stop()
