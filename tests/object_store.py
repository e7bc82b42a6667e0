"""Real S3-compatible servers for the object-storage tests: moto's HTTP server, started on
127.0.0.1 on free ports (never another address), with multi-storage-client profiles written for
them (``MSC_CONFIG``), so ``msc://PROFILE/PATH`` reaches it through Energon's path layer as it reaches
a production store.

``ObjectStore.start(folder, ...)`` starts the servers and writes the profiles; ``upload`` copies a local
folder (a prepared dataset, a JSONL and its index) under a key prefix; ``url`` names it;
``stop`` ends the servers (and waits for them, bounded). The ``object_store`` fixture of ``conftest``
holds one for the whole test run.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import yaml

#: the profile and bucket the tests use (``msc://lake/...``), a profile whose endpoint does not
#: answer, one whose server refuses the credentials, and the credentials the first server takes
PROFILE, BUCKET, DOWN, DENIED = "lake", "lake", "down", "denied"
ACCESS_KEY, SECRET_KEY = "energon-nemotron-test", "energon-nemotron-test-secret"


def profile(endpoint: str) -> dict:
    """A multi-storage-client S3 profile for bucket ``lake`` at ``endpoint``."""
    return {"storage_provider": {"type": "s3", "options": {"base_path": BUCKET, "endpoint_url": endpoint,
                                                           "region_name": "us-east-1"}},
            "credentials_provider": {"type": "S3Credentials",
                                     "options": {"access_key": ACCESS_KEY, "secret_key": SECRET_KEY}}}


def serve(port: int, timeout: float = 60.0, **env: str) -> subprocess.Popen:
    """moto's server on 127.0.0.1:``port`` (``env``: moto settings), once it answers (bounded)."""
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            env={**os.environ, **env})
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                proc.wait(timeout=timeout)
                raise RuntimeError(f"moto's server did not start on 127.0.0.1:{port} within {timeout:g} s "
                                   f"(exit code {proc.poll()})") from None
            time.sleep(0.1)


class ObjectStore:
    """The moto servers on 127.0.0.1 and the MSC profiles that point at them."""

    def __init__(self, port: int, procs: list, config: Path) -> None:
        self.port, self.procs, self.config = port, procs, config
        self.endpoint = f"http://127.0.0.1:{port}"

    @classmethod
    def start(cls, folder: Path, port: int, down_port: int, denied_port: int) -> "ObjectStore":
        """Start the servers and write the MSC config file into ``folder``: profile ``lake`` for
        the server on ``port`` (its bucket made), ``down`` for ``down_port``, where nothing listens
        (an unreachable endpoint), and ``denied`` for a second server on ``denied_port`` that checks
        every request's credentials and knows none (a 403)."""
        procs = [serve(port)]
        try:
            procs.append(serve(denied_port, INITIAL_NO_AUTH_ACTION_COUNT="0"))
        except Exception:
            procs[0].kill()
            raise
        store = cls(port, procs, Path(folder) / "msc_config.yaml")
        store.client().create_bucket(Bucket=BUCKET)
        store.config.write_text(yaml.safe_dump({"profiles": {
            PROFILE: profile(store.endpoint), DOWN: profile(f"http://127.0.0.1:{down_port}"),
            DENIED: profile(f"http://127.0.0.1:{denied_port}")}}))
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

    def stop(self, timeout: float = 30.0) -> None:
        """End the servers (SIGTERM, then SIGKILL after ``timeout``) and wait for them."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=timeout)
