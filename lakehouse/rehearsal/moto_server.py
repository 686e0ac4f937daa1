"""A moto server on 127.0.0.1 standing in for Secrets Manager and CloudWatch (boto3 in the jobs
reaches it through AWS_ENDPOINT_URL)."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from lakehouse.rehearsal.spark_standalone import free_port

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "rehearsal", "AWS_SECRET_ACCESS_KEY": "rehearsal"}


class MotoServer:
    def __init__(self, log_file: Path) -> None:
        self.log_file = log_file
        self.port = free_port()
        self._process: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def credentials(self) -> dict[str, str]:
        return dict(CREDENTIALS)

    def start(self, timeout: float = 30) -> None:
        server = Path(sys.executable).with_name("moto_server")
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with self.log_file.open("ab") as out:
            self._process = subprocess.Popen(
                [str(server), "-H", "127.0.0.1", "-p", str(self.port)], stdout=out, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=1).close()
                return
            except OSError:
                if self._process.poll() is not None:
                    raise RuntimeError(
                        f"moto_server exited {self._process.returncode}: see {self.log_file}"
                    ) from None
                time.sleep(0.2)
        raise RuntimeError(f"moto_server did not answer in {timeout:.0f}s: see {self.log_file}")

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            self._process.wait(timeout=10)

    def client(self, service: str, region: str):
        import boto3

        return boto3.client(
            service, region_name=region, endpoint_url=self.endpoint,
            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        )  # fmt: skip

    def create_secret(self, name: str, value: str, region: str) -> str:
        return self.client("secretsmanager", region).create_secret(Name=name, SecretString=value)["ARN"]

    def metrics(self, namespace: str, region: str) -> list[dict]:
        """ListMetrics of `namespace`: every name and exact dimension set published to it."""
        pages = self.client("cloudwatch", region).get_paginator("list_metrics").paginate(Namespace=namespace)
        return [metric for page in pages for metric in page["Metrics"]]
