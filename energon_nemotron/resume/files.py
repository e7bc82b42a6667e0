"""Loader state files: JSON (never pickle, ``resume.codec``), written atomically.

A state holds the loader's own state (Energon's ``SavableDataLoaderState``, or the rows consumed
on the Megatron-LM path) and a fingerprint of everything that changes the stream
(``resume.fingerprint``); restoring under a different fingerprint fails with a per-key diff.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from energon_nemotron.errors import ConfigError

FORMAT = "energon-nemotron-loader-state"
VERSION = 1

__all__ = ["save_state_file", "load_state_file", "FORMAT", "VERSION"]


def save_state_file(path: str | os.PathLike[str], state: dict[str, Any]) -> None:
    """Write ``state`` as JSON atomically: a temporary file in the same folder, fsync, rename. A
    failed write (disk full, a file-size limit) removes the temporary file, leaves an existing state
    file as it was, and raises an ``OSError`` that says so."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    payload = json.dumps({"format": FORMAT, "version": VERSION, **state}, sort_keys=True)
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        tmp.unlink(missing_ok=True)
        kept = "the previous state file is unchanged" if path.exists() else "no state file was written"
        raise OSError(e.errno, f"cannot save the loader state to {path}: {e.strerror or e}; {kept}") from e
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def load_state_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a state file written by :func:`save_state_file` (``ConfigError`` when it is not one)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"cannot read loader state {str(path)!r}: {e}") from None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise ConfigError(f"loader state {path}: not valid JSON ({type(e).__name__}: {e}); the file is truncated "
                          "or damaged: restore it, or start without a state") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ConfigError(f"{path}: not an energon-nemotron loader state (its \"format\" is not {FORMAT!r})")
    if data.get("version") != VERSION:
        raise ConfigError(f"{path}: a loader state of version {data.get('version')!r}; this library reads version "
                          f"{VERSION}: resume with the energon-nemotron release that saved it, or start without a state")
    return data
