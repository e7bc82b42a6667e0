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
import threading
import time
from pathlib import Path

import yaml

#: the profile and bucket the tests use (``msc://lake/...``), a profile whose endpoint does not
#: answer, one whose server refuses the credentials, one that reaches the first server through a
#: proxy that cuts connections, and the credentials the first server takes
PROFILE, BUCKET, DOWN, DENIED, CUT = "lake", "lake", "down", "denied", "cut"
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


class CutProxy:
    """A TCP proxy on 127.0.0.1:``port`` in front of ``target`` (threads of this process) that
    cuts connections in the middle of a response: once armed (:meth:`arm`), a response to a GET
    whose path ends with ``suffix`` is closed after ``after`` bytes of its body, for the next
    ``cuts`` such responses (then it forwards again). ``cut`` counts the connections it cut."""

    def __init__(self, port: int, target: int) -> None:
        self.target, self.cut, self._cuts, self._after, self._suffix = target, 0, 0, 0, ""
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", port))
        self._server.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="cut-proxy", daemon=True)
        self._thread.start()

    def arm(self, cuts: int, after: int, suffix: str = ".tar") -> None:
        """Cut the next ``cuts`` responses to GETs of ``*suffix`` after ``after`` body bytes."""
        with self._lock:
            self._cuts, self._after, self._suffix, self.cut = cuts, after, suffix, 0

    def _take_cut(self, path: str) -> bool:
        with self._lock:
            if self._cuts > 0 and path.split("?", 1)[0].endswith(self._suffix):
                self._cuts -= 1
                self.cut += 1
                return True
            return False

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._server.accept()
            except OSError:
                continue
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        """One client connection: requests go upstream as they are; each response comes back whole,
        or is cut (both sockets closed) ``after`` bytes into its body."""
        upstream = socket.create_connection(("127.0.0.1", self.target), timeout=30)
        client.settimeout(30)
        try:
            while not self._stop.is_set():
                request = _read_head(client)
                if request is None:
                    return
                head, body = request
                length = _content_length(head)
                while len(body) < length:
                    chunk = client.recv(65536)
                    if not chunk:
                        return
                    body += chunk
                upstream.sendall(head + body)
                line = head.split(b"\r\n", 1)[0].decode("latin-1").split()
                cut = line[0] == "GET" and self._take_cut(line[1])
                response = _read_head(upstream)
                if response is None:
                    return
                rhead, rbody = response
                status = rhead.split(b" ", 2)[1]
                rlength = 0 if line[0] == "HEAD" or status in (b"204", b"304") else _content_length(rhead)
                while len(rbody) < rlength:
                    chunk = upstream.recv(65536)
                    if not chunk:
                        return
                    rbody += chunk
                if cut:
                    client.sendall(rhead + rbody[:self._after])
                    return
                client.sendall(rhead + rbody)
        except OSError:
            return
        finally:
            client.close()
            upstream.close()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._thread.join(timeout)
        self._server.close()


def _read_head(sock: socket.socket):
    """The bytes of one HTTP message head (to its blank line) and the body bytes read past it;
    ``None`` when the peer closed the connection first."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        data += chunk
    end = data.index(b"\r\n\r\n") + 4
    return data[:end], data[end:]


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value.strip())
    return 0


class ObjectStore:
    """The moto servers on 127.0.0.1 and the MSC profiles that point at them."""

    def __init__(self, port: int, procs: list, config: Path, proxy: CutProxy) -> None:
        self.port, self.procs, self.config, self.proxy = port, procs, config, proxy
        self.endpoint = f"http://127.0.0.1:{port}"

    @classmethod
    def start(cls, folder: Path, port: int, down_port: int, denied_port: int, cut_port: int) -> "ObjectStore":
        """Start the servers and write the MSC config file into ``folder``: profile ``lake`` for
        the server on ``port`` (its bucket made), ``down`` for ``down_port``, where nothing listens
        (an unreachable endpoint), ``denied`` for a second server on ``denied_port`` that checks
        every request's credentials and knows none (a 403), and ``cut`` for a :class:`CutProxy` on
        ``cut_port`` in front of the first server."""
        procs = [serve(port)]
        try:
            procs.append(serve(denied_port, INITIAL_NO_AUTH_ACTION_COUNT="0"))
        except Exception:
            procs[0].kill()
            raise
        store = cls(port, procs, Path(folder) / "msc_config.yaml", CutProxy(cut_port, port))
        store.client().create_bucket(Bucket=BUCKET)
        store.config.write_text(yaml.safe_dump({"profiles": {
            PROFILE: profile(store.endpoint), DOWN: profile(f"http://127.0.0.1:{down_port}"),
            DENIED: profile(f"http://127.0.0.1:{denied_port}"), CUT: profile(f"http://127.0.0.1:{cut_port}")}}))
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
        """End the proxy and the servers (SIGTERM, then SIGKILL after ``timeout``) and wait for them."""
        self.proxy.stop()
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=timeout)
