"""``OUT.manifest.json``: what a ``pack-megatron`` output was packed from and with, shard by shard.

Written beside every packed output (``OUT`` is the ``--output`` path) and replaced atomically (a
temporary file renamed) each time a shard completes, so that a run killed at any moment leaves a
manifest that tells which shards are complete. Sections:

- ``encoder``: ``MegatronSFTPackedEncoder.signature()`` (tokenizer sha256, prompt format,
  seq_length, CP size, pad token and id, chat key, identity masking, allow_eos_pad);
- ``packing``: algorithm, seed, rows_per_shard, on_error; ``inputs``: path (as given), size, sha256
  of each input file, in order;
- ``counts``: input lines, conversations, rows, tokens, fill ratio, skipped by reason, oversized;
- ``shards``: per output file (in row order) its name beside the manifest, rows, bytes, sha256 and
  ``complete``; ``complete`` at the top when every shard is.

The counts of pass 1 are also kept beside, in ``OUT.counts.npz`` (24 bytes per conversation), until
every shard is complete, so that a resumed run does not count again.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Optional

import numpy as np

from energon_nemotron._energon.storage import DataPath, as_data_path, object_size
from energon_nemotron.errors import ConfigError
from energon_nemotron.megatron_packed.counting import Counted

FORMAT = "energon-nemotron-pack-manifest"
VERSION = 1
SUFFIX = ".manifest.json"
#: the encoder keys a reader must agree on (``allow_eos_pad`` only accepts a pad id, which ``pad_id`` covers)
READ_KEYS = ("tokenizer_sha256", "prompt_format", "seq_length", "context_parallel_size", "pad_token", "pad_id",
             "chat_key", "identity_masks_prompt")


def manifest_path(output: str | Path | DataPath) -> DataPath:
    """``OUT.manifest.json`` of the output ``OUT`` (a local path, or an ``msc://`` location)."""
    output = as_data_path(output)
    return output.with_name(output.name + SUFFIX)


def counts_path(output: str | Path) -> Path:
    """``OUT.counts.npz``: pass 1's counts of the output ``OUT``, kept until every shard is written."""
    output = Path(output)
    return output.with_name(output.name + ".counts.npz")


def is_manifest(path: str | Path | DataPath) -> bool:
    return as_data_path(path).name.endswith(SUFFIX)


def pack_options(signature: dict, algorithm: str, seed: Optional[int], rows_per_shard: Optional[int],
                 on_error: str, inputs: list[dict]) -> dict:
    """The part of a manifest that must match for a rerun to resume."""
    return {"encoder": signature,
            "packing": {"algorithm": algorithm, "seed": seed, "rows_per_shard": rows_per_shard, "on_error": on_error},
            "inputs": inputs}


def _show(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def options_diff(saved: dict, current: dict) -> list[str]:
    """``key: saved ... != now ...`` per differing encoder or packing key, and per input."""
    lines = []
    for section in ("encoder", "packing"):
        a, b = saved.get(section) or {}, current.get(section) or {}
        for key in sorted(set(a) | set(b)):
            if a.get(key, "<missing>") != b.get(key, "<missing>"):
                lines.append(f"{section}.{key}: saved {_show(a.get(key))} != now {_show(b.get(key))}")
    a, b = saved.get("inputs") or [], current.get("inputs") or []
    for i in range(max(len(a), len(b))):
        x, y = (a[i] if i < len(a) else None), (b[i] if i < len(b) else None)
        if x != y:
            what = "missing" if x is None or y is None else ", ".join(
                k for k in ("path", "size", "sha256") if x.get(k) != y.get(k))
            lines.append(f"inputs[{i}] ({(y or x).get('path')}): {what} differs")
    return lines


def save_manifest(path: Path, manifest: dict) -> None:
    """Write ``manifest`` to ``path`` atomically (a temporary file, flushed, then renamed)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_manifest(path: Path) -> dict:
    """A manifest from ``path`` (``ConfigError`` naming the file if it is not one)."""
    try:
        data = json.loads(as_data_path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ConfigError(f"{path}: not a readable pack manifest ({type(e).__name__}: {e})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ConfigError(f"{path}: not a pack-megatron manifest (no \"format\": {FORMAT!r})")
    if data.get("version") != VERSION:
        raise ConfigError(f"{path}: manifest version {data.get('version')!r}; this library reads version {VERSION}")
    shards = data.get("shards")
    if not isinstance(shards, list) or not all(isinstance(s, dict) and isinstance(s.get("file"), str)
                                               and "/" not in s["file"] for s in shards):
        raise ConfigError(f"{path}: damaged manifest: \"shards\" must list {{file, rows, bytes, sha256, complete}} "
                          "with plain file names")
    return data


def shard_is_complete(folder: Path, entry: dict) -> bool:
    """Whether a manifest's shard entry is complete and its file is there with the recorded rows,
    size and sha256 (reads the file)."""
    from energon_nemotron.megatron_packed.shards import file_rows_sha256

    path = folder / entry["file"]
    if not entry.get("complete") or not path.is_file() or path.stat().st_size != entry.get("bytes"):
        return False
    rows, _, sha = file_rows_sha256(path)
    return rows == entry.get("rows") and sha == entry.get("sha256")


def encoder_diff(saved: dict, current: dict) -> list[str]:
    """``key: manifest X, configured Y`` for every ``READ_KEYS`` key that differs (a tokenizer hash
    that one side does not know is not compared)."""
    lines = []
    for key in READ_KEYS:
        a, b = saved.get(key), current.get(key)
        if key == "tokenizer_sha256" and (a is None or b is None):
            continue
        if a != b:
            name = "tokenizer (sha256 over its folder's files)" if key == "tokenizer_sha256" else key
            lines.append(f"  {name}: manifest {_show(a)}, configured {_show(b)}")
    return lines


def check_encoder(manifest: dict, signature: dict, origin: str) -> None:
    """``ConfigError`` listing every key where the encoder the rows were packed for (``manifest``,
    read from ``origin``) differs from the configured one (``signature``)."""
    diff = encoder_diff(manifest.get("encoder") or {}, signature)
    if diff:
        raise ConfigError(f"{origin}: the rows were packed for another encoder than the one configured (re-encoding "
                          "them would truncate or mask them differently); configure the reader as the manifest "
                          "says or pack again:\n" + "\n".join(diff))


def manifest_shards(path: DataPath) -> tuple[list[DataPath], dict]:
    """The shard files of the manifest at ``path`` in row order, and the manifest; a
    ``ConfigError`` if a shard is listed twice, incomplete, missing or of another size than
    recorded. (Its sha256 is checked as the rows are first read: :func:`check_digest`.)"""
    manifest = load_manifest(path)
    folder = as_data_path(path).parent
    files = []
    seen: dict[str, int] = {}
    for i, entry in enumerate(manifest["shards"]):
        if entry["file"] in seen:
            raise ConfigError(f"{path}: shards {seen[entry['file']]} and {i} are both {entry['file']!r}: the manifest "
                              "lists a shard twice (and so leaves another out); it is damaged: pack again")
        seen[entry["file"]] = i
        f = folder / entry["file"]
        if not entry.get("complete"):
            raise ConfigError(f"{path}: shard {i} ({entry['file']}) is not complete: the pack was interrupted; "
                              "rerun the same pack-megatron command to finish it")
        if not f.is_file():
            raise ConfigError(f"{path}: shard {i} ({entry['file']}) does not exist beside the manifest")
        size = object_size(f)
        if size != entry.get("bytes"):
            raise ConfigError(f"{path}: shard {i} ({entry['file']}) has {size} bytes, the manifest "
                              f"records {entry.get('bytes')}: it changed since it was packed")
        files.append(f)
    return files, manifest


def check_digest(path: Path, digest: str, expected: Optional[str], origin: str) -> None:
    """``ConfigError`` unless the sha256 ``digest`` of a shard's bytes (hex) is the manifest's
    ``expected`` one (None: nothing recorded, nothing checked); ``origin`` names the manifest."""
    if expected is not None and digest != expected:
        raise ConfigError(f"{origin}: shard {path.name}: its sha256 is {digest}, the manifest records {expected}: "
                          "the file changed since it was packed (its size did not); restore it or pack again")


# -- pass 1's counts, kept for a resumed run ---------------------------------------------------
def counts_key(options: dict) -> str:
    """What the counts depend on: the encoder, the inputs and on_error (not packing or sharding)."""
    part = {"encoder": options["encoder"], "inputs": options["inputs"], "on_error": options["packing"]["on_error"]}
    return hashlib.sha256(json.dumps(part, sort_keys=True).encode()).hexdigest()


def save_counts(path: Path, counted: Counted, key: str) -> None:
    """Write ``counted`` to ``path`` (``.npz``, atomically) under ``key``."""
    meta = {"key": key, "input_lines": counted.input_lines, "added_system": counted.added_system,
            "skipped": counted.skipped, "skipped_examples": counted.skipped_examples, "oversized": counted.oversized}
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, costs=counted.costs, files=counted.files, offsets=counted.offsets,
             index_in_line=counted.index_in_line, meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8))
    os.replace(tmp, path)


def load_counts(path: Path, key: str) -> Optional[Counted]:
    """The counts saved at ``path`` if they were saved under ``key``, else None."""
    try:
        with np.load(path) as z:
            meta = json.loads(z["meta"].tobytes().decode())
            if meta.get("key") != key:
                return None
            return Counted(costs=z["costs"], files=z["files"], offsets=z["offsets"], index_in_line=z["index_in_line"],
                           input_lines=meta["input_lines"], added_system=meta["added_system"],
                           skipped=meta["skipped"], skipped_examples=meta["skipped_examples"],
                           oversized=meta["oversized"])
    except (OSError, ValueError, KeyError):
        return None
