"""``pack-megatron`` with inputs or output on object storage (``msc://PROFILE/PATH``).

An object store has no ``flock`` and no rename, so the output is written in three steps that keep
the packer's guarantees there:

1. **A lock object**, ``OUTPUT.lock``, created with a conditional put (``If-None-Match: *``): of two
   runs, the store lets one create it; the other is a ``ConfigError`` naming the holder (pid, host,
   start). A run that ends releases it. A killed run leaves it: the next run on the same host finds
   that pid dead and takes the lock over with a second conditional put (``If-Match`` its ETag, so
   of two such runs one wins); a lock held from another host is never taken over: the message
   says which object to delete once that run is known to be gone.
2. **Packing in a local staging folder** (``--staging``; default: a folder per output under
   ``~/.cache/energon-nemotron/pack-megatron``), by the ordinary local packer: a killed run's
   staging folder is resumed as on disk (complete shards kept). Inputs on the store are fetched
   into it first (skipped when the copy there has the object's size).
3. **Publishing, the manifest last**: a manifest already on the store that is not this run's is
   deleted first; each shard is uploaded (one atomic put, its sha256 stored as the object's
   metadata; a shard already there with that size and sha256 is kept); then the manifest is put.
   Readers read the manifest (or a file's manifest beside it), so an output whose publishing was
   cut has no manifest and is never read as complete.
"""

from __future__ import annotations

import hashlib
import os
import socket
import time
import uuid
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

from energon_nemotron._energon.storage import RemotePath, as_data_path, is_url, object_size
from energon_nemotron.errors import ConfigError
from energon_nemotron.guards.orphans import process_alive
from energon_nemotron.megatron_packed import manifest as mf
from energon_nemotron.megatron_packed.encoder import MegatronSFTPackedEncoder

#: the metadata key of an uploaded shard's sha256
SHA256_ATTRIBUTE = "sha256"


def staging_folder(output: str, staging: Optional[Path] = None) -> Path:
    """The local folder a run for ``output`` packs in: ``staging``, else one per output in the cache."""
    if staging is not None:
        return Path(staging)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "energon-nemotron" / "pack-megatron" / hashlib.sha256(output.encode()).hexdigest()[:16]


def _holder(text: str) -> tuple[Optional[int], Optional[str]]:
    """(pid, host) of a lock object's first line ``pid P on HOST, started ...``."""
    words = text.split()
    try:
        return int(words[1]), words[3].rstrip(",")
    except (IndexError, ValueError):
        return None, None


@contextmanager
def store_lock(output: RemotePath) -> Iterator[RemotePath]:
    """Hold ``OUTPUT.lock`` on the store while the block runs (see the module docstring)."""
    lock = output.with_name(output.name + ".lock")
    token = uuid.uuid4().hex
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
    mine = (f"pid {os.getpid()} on {socket.gethostname()}, started {started}, token {token}\n"
            "# pack-megatron holds this lock object while it writes the output beside it; it deletes it "
            "when it ends.\n").encode()
    if not lock.create_exclusive(mine):
        taken, said = False, ""
        try:
            _, etag, _ = lock.info()
            said = lock.read_text().strip()
        except FileNotFoundError:                    # released in between: one more try
            taken = lock.create_exclusive(mine)
        else:
            pid, host = _holder(said)
            if host == socket.gethostname() and pid is not None and not process_alive(pid):
                taken = lock.replace_if(mine, etag)  # a killed run's lock; of two runs taking it, one wins
        if not taken:
            holder = said.splitlines()[0] if said else "another run"
            raise ConfigError(f"{output}: another pack-megatron run is writing it ({holder}); wait for it to end, "
                              f"or write another --output. An object store cannot release the lock of a run that "
                              f"was killed on another machine: once that run is known to be gone, delete {lock} "
                              "and rerun (the staging folder resumes it)")
    try:
        yield lock
    finally:
        try:
            if token in lock.read_text():
                lock.delete()
        except (FileNotFoundError, ConfigError):
            pass


def fetch_inputs(inputs: Sequence[str | Path], folder: Path) -> list[str]:
    """The inputs as local paths: an ``msc://`` file (or a glob of its folder's names, ``*``/``?``
    in the last part) is fetched into ``folder`` (kept when the copy has the object's size)."""
    out: list[str] = []
    for item in inputs:
        if not is_url(str(item)):
            out.append(str(item))
            continue
        url = RemotePath(str(item))
        if any(c in url.name for c in "*?["):
            found = sorted(url.parent.glob(url.name))
            if not found:
                raise ConfigError(f"--input {item}: no object on the store matches it")
        else:
            found = [url]
        for remote in found:
            local = folder / hashlib.sha256(remote.url.encode()).hexdigest()[:12] / remote.name
            size = object_size(remote)
            if not (local.is_file() and local.stat().st_size == size):
                local.parent.mkdir(parents=True, exist_ok=True)
                tmp = local.with_name(local.name + ".part")
                remote.download(tmp)
                tmp.replace(local)
            out.append(str(local))
    return out


def publish(local_output: Path, output: RemotePath) -> None:
    """Put the local output's shards on the store, then its manifest (see the module docstring)."""
    manifest_file = mf.manifest_path(local_output)
    body = Path(manifest_file).read_bytes()
    remote_manifest = mf.manifest_path(output)
    try:
        if remote_manifest.read_bytes() == body:
            return                                     # this very output is published already
    except FileNotFoundError:
        pass
    remote_manifest.delete()                           # a reader sees no output, not a mix of two
    for entry in mf.load_manifest(manifest_file)["shards"]:
        remote = output.with_name(entry["file"])
        try:
            size, _, attributes = remote.info()
            if size == entry["bytes"] and attributes.get(SHA256_ATTRIBUTE) == entry["sha256"]:
                continue
        except FileNotFoundError:
            pass
        remote.upload(Path(local_output).with_name(entry["file"]), {SHA256_ATTRIBUTE: entry["sha256"]})
    remote_manifest.write_bytes(body)


def pack_with_store(inputs: Sequence[str | Path], output: str | Path, encoder: MegatronSFTPackedEncoder,
                    options: Any = None, engine: Any = None, progress: bool = True,
                    staging: Optional[Path] = None) -> Any:
    """``offline_pack.pack`` where inputs or the output may be ``msc://`` URLs (the module
    docstring); the summary names the output's objects on the store."""
    from energon_nemotron.megatron_packed.offline_pack import pack

    work = staging_folder(str(output), staging)
    local_inputs = fetch_inputs(inputs, work / "inputs")
    if not is_url(str(output)):
        return pack(local_inputs, output, encoder, options, engine=engine, progress=progress)
    remote = as_data_path(str(output))
    assert isinstance(remote, RemotePath)
    with store_lock(remote):
        local = work / "out" / remote.name
        summary = pack(local_inputs, local, encoder, options, engine=engine, progress=progress)
        publish(local, remote)
    return replace(summary, manifest=str(mf.manifest_path(remote)),
                   shards=[str(remote.with_name(Path(s).name)) for s in summary.shards])
