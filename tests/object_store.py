"""A real S3-compatible server for the object-storage tests: moto's HTTP server, started on
127.0.0.1 on a free port (never another address), with a multi-storage-client profile written for
it (``MSC_CONFIG``), so ``msc://PROFILE/PATH`` reaches it through Energon's path layer as it reaches
a production store.

``ObjectStore.start(folder)`` starts the server and writes the profile; ``upload`` copies a local
folder (a prepared dataset, a JSONL and its index) under a key prefix; ``url`` names it;
``stop`` ends the server (and waits for it, bounded). The ``object_store`` fixture of ``conftest``
holds one for the whole test run.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import yaml

#: the profile and bucket the tests use (``msc://lake/...``), a profile whose endpoint does not
#: answer, and the credentials moto accepts
PROFILE, BUCKET, DOWN = "lake", "lake", "down"
ACCESS_KEY, SECRET_KEY = "energon-nemotron-test", "energon-nemotron-test-secret"


def profile(endpoint: str) -> dict:
    """A multi-storage-client S3 profile for bucket ``lake`` at ``endpoint``."""
    return {"storage_provider": {"type": "s3", "options": {"base_path": BUCKET, "endpoint_url": endpoint,
                                                           "region_name": "us-east-1"}},
            "credentials_provider": {"type": "S3Credentials",
                                     "options": {"access_key": ACCESS_KEY, "secret_key": SECRET_KEY}}}


class ObjectStore:
    """One moto server on 127.0.0.1 and the MSC profile that points at it."""

    def __init__(self, port: int, proc: subprocess.Popen, config: Path) -> None:
        self.port, self.proc, self.config = port, proc, config
        self.endpoint = f"http://127.0.0.1:{port}"

    @classmethod
    def start(cls, folder: Path, port: int, down_port: int, timeout: float = 60.0) -> "ObjectStore":
        """Start the server on ``port``, wait (bounded) until it answers, create the bucket and
        write the MSC config file into ``folder``: profile ``lake`` for the server, profile ``down``
        for ``down_port``, where nothing listens (an unreachable endpoint)."""
        proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    proc.kill()
                    raise RuntimeError(f"moto's server did not start on 127.0.0.1:{port} within {timeout:g} s "
                                       f"(exit code {proc.poll()})") from None
                time.sleep(0.1)
        store = cls(port, proc, Path(folder) / "msc_config.yaml")
        store.client().create_bucket(Bucket=BUCKET)
        store.config.write_text(yaml.safe_dump({"profiles": {
            PROFILE: profile(store.endpoint), DOWN: profile(f"http://127.0.0.1:{down_port}")}}))
        return store

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY)

    def upload(self, local: Path, prefix: str) -> str:
        """Every file below ``local`` (or the file itself) under key ``prefix``; its ``msc://`` URL."""
        local, client = Path(local), self.client()
        files = [local] if local.is_file() else sorted(p for p in local.rglob("*") if p.is_file())
        for f in files:
            key = prefix if local.is_file() else f"{prefix}/{f.relative_to(local).as_posix()}"
            client.upload_file(str(f), BUCKET, key)
        return self.url(prefix)

    def upload_jsonl(self, jsonl: Path, prefix: str) -> str:
        """A prepared ``.jsonl`` and its ``.jsonl.idx`` under ``prefix/NAME``; the file's URL."""
        for f in (jsonl, jsonl.with_name(jsonl.name + ".idx")):
            self.client().upload_file(str(f), BUCKET, f"{prefix}/{f.name}")
        return self.url(f"{prefix}/{jsonl.name}")

    @staticmethod
    def url(prefix: str) -> str:
        return f"msc://{PROFILE}/{prefix}"

    def stop(self, timeout: float = 30.0) -> Optional[int]:
        """End the server (SIGTERM, then SIGKILL after ``timeout``); its exit code."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=timeout)
        return self.proc.returncode

