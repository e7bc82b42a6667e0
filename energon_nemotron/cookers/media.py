"""Finding a sample's media for the cookers: WebDataset members, or paths found in the dataset
folder, the media roots (``data.media_roots``) or the Energon aux source bound to the dataset
(``cookers.media_sources``).

Nothing is decoded here: a ``MediaRef`` holds the member's bytes, the file path or a lazy aux
entry, and the task encoder reads headers (phase 1) and decodes (phase 2) later.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Optional, Sequence

from energon_nemotron.cookers.media_sources import (
    MEDIA_SOURCE_SUBFLAVOR,
    aux_media,
    bound_source,
    current_scope,
    within,
)
from energon_nemotron.errors import DataError
from energon_nemotron.types import MediaPart, MediaRef

EXTENSIONS = {
    "image": ("jpg", "jpeg", "png", "webp"),
    "video": ("mp4", "webm", "mkv", "mov"),
    "audio": ("wav", "flac", "mp3", "ogg"),
}
#: JSONL fields holding media paths, per modality
PATH_FIELDS = {
    "image": ("image", "images"),
    "video": ("video", "videos"),
    "audio": ("audio", "audios", "sound", "speech", "audio_filepath"),
}


def modality_of(name: str) -> Optional[str]:
    """``image`` / ``video`` / ``audio`` from a member or file name's extension, else None."""
    ext = name.rsplit(".", 1)[-1].lower()
    return next((m for m, exts in EXTENSIONS.items() if ext in exts), None)


def _natural(name: str) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def member_media(sample: dict, modality: str) -> list[MediaRef]:
    """The sample's members of ``modality`` (by extension), in natural name order."""
    names = sorted((k for k in sample if not k.startswith("__") and modality_of(k) == modality), key=_natural)
    return [MediaRef(modality, sample[k], {}, name=k) for k in names]


def dataset_root(sample: dict, where: str) -> Path:
    """The folder that relative media paths of a sample are resolved against: the dataset folder
    (the JSONL file's folder for a JSONL dataset)."""
    sources = sample.get("__sources__") or ()
    if not sources:
        raise DataError(where, "cannot resolve a media path: the sample has no source information")
    path = Path(str(sources[0].dataset_path))
    return path.parent if path.suffix == ".jsonl" or path.is_file() else path


#: longest media path accepted, in characters, and longest path component, in UTF-8 bytes (the
#: limit of common file systems); longer is ``path_too_long``
MAX_PATH_CHARS = 1024
MAX_PATH_COMPONENT_BYTES = 255


def check_path_length(value: str, modality: str, where: str) -> None:
    """A media path over ``MAX_PATH_CHARS`` characters, or with a component over
    ``MAX_PATH_COMPONENT_BYTES`` bytes, is a ``DataError`` (``path_too_long``)."""
    if len(value) > MAX_PATH_CHARS:
        raise DataError(where, f"{modality} path {value[:40]!r}... is {len(value)} characters long, over the limit "
                               f"of {MAX_PATH_CHARS} (MAX_PATH_CHARS)", "path_too_long")
    for part in re.split(r"[/\\]", value):
        size = len(part.encode("utf-8", "surrogatepass"))
        if size > MAX_PATH_COMPONENT_BYTES:
            raise DataError(where, f"{modality} path {value[:40]!r}...: the component {part[:40]!r}... is {size} "
                                   f"bytes long, over the limit of {MAX_PATH_COMPONENT_BYTES} bytes "
                                   "(MAX_PATH_COMPONENT_BYTES)", "path_too_long")


def path_media(sample: dict, value: Any, modality: str, where: str) -> MediaRef:
    """A media file named by a path (``path_too_long`` is checked first): read from the aux source
    bound to the dataset when the cooker runs in a :func:`media_sources.media_scope` with one
    (:func:`media_sources.aux_media`), else found on the file system (:func:`local_media`)."""
    if not isinstance(value, str) or not value:
        raise DataError(where, f"{modality} path must be a non-empty string, got {value!r}")
    check_path_length(value, modality, where)
    scope = current_scope()
    source, value = bound_source(scope.aux, sample.get("__subflavors__"), where, value)
    if source is not None:
        return aux_media(sample, value, modality, where, source, scope)
    return local_media(sample, value, modality, where, scope.roots, list(scope.aux))


def local_media(sample: dict, value: str, modality: str, where: str, roots: Sequence[Path] = (),
                aux_names: Sequence[str] = ()) -> MediaRef:
    """A media file on the file system. A relative path is tried against the dataset folder, then
    each of ``roots`` in order: the first that is a file wins. An absolute path is taken as is.
    Symlinks are followed first: the file must lie inside the dataset folder or a root, else
    ``path_escape`` (also when the path names no file and leaves every allowed folder); no file at
    all is ``missing_media`` naming where it looked (``aux_names``: the dataset's unbound aux
    sources, for the hint)."""
    folders = list(dict.fromkeys([dataset_root(sample, where).resolve(), *(Path(r).resolve() for r in roots)]))
    given = Path(value)
    targets = [given.resolve()] if given.is_absolute() else [(f / given).resolve() for f in folders]
    for target in targets:
        if target.is_file():
            if not within(target, folders):
                raise _escape(value, modality, where, target, folders, len(roots))
            return MediaRef(modality, target, {}, name=value)
    if not any(within(t, folders) for t in targets):
        raise _escape(value, modality, where, targets[0], folders, len(roots))
    also = " or the media roots" if roots else ""
    hint = (f"; the dataset has aux sources {', '.join(aux_names)} but none holds its media: set subflavors "
            f"{MEDIA_SOURCE_SUBFLAVOR}: NAME to read them from one" if aux_names else
            "; add the folder that holds the media to data.media_roots in the loader config")
    raise DataError(where, f"{modality} file {value!r} not found under the dataset folder{also}; looked for "
                           f"{', '.join(map(str, targets))}{hint}", "missing_media")


def _escape(value: str, modality: str, where: str, target: Path, folders: list[Path], roots: int) -> DataError:
    also = " and the media roots" if roots else ""
    return DataError(where, f"{modality} path {value!r} escapes the dataset folder{also}: it resolves to {target} "
                            f"(symlinks followed), outside the allowed folders ({', '.join(map(str, folders))})",
                     "path_escape")


def media_ref(sample: dict, value: Any, modality: str, where: str, metadata: Optional[dict] = None) -> MediaRef:
    """A member of the sample named ``value`` (e.g. ``"0.jpg"`` or ``"jpg"``), else a path."""
    if isinstance(value, str) and value in sample and not value.startswith("__"):
        ref = MediaRef(modality, sample[value], {}, name=value)
    else:
        ref = path_media(sample, value, modality, where)
    if metadata:
        if not isinstance(metadata, dict):
            raise DataError(where, f"{modality} metadata must be an object, got {type(metadata).__name__}")
        ref = MediaRef(ref.modality, ref.payload, dict(metadata), ref.name)
    return ref


def field_paths(obj: dict, modality: str, where: str) -> list[str]:
    """Media paths of a JSON object's fields for ``modality`` (a string or a list of strings)."""
    out: list[str] = []
    for name in PATH_FIELDS[modality]:
        value = obj.get(name)
        if value is None:
            continue
        values = value if isinstance(value, list) else [value]
        for v in values:
            if not isinstance(v, str):
                raise DataError(where, f"field {name!r} must hold paths (strings), got {type(v).__name__}")
            out.append(v)
    return out


class MediaQueue:
    """Hands out a sample's media items of each modality in order, and checks that every item is
    referenced exactly once."""

    def __init__(self, where: str, items: dict[str, list[MediaRef]]) -> None:
        self.where = where
        self.items = items
        self.used = {m: 0 for m in items}
        self.media: list[MediaRef] = []

    def take(self, modality: str) -> MediaPart:
        available = self.items.get(modality, [])
        k = self.used.get(modality, 0)
        if k >= len(available):
            raise DataError(self.where, f"more {modality} references than {modality} items ({len(available)})",
                            "media_reference")
        self.used[modality] = k + 1
        self.media.append(available[k])
        return MediaPart(modality, len(self.media) - 1)

    def finish(self) -> list[MediaRef]:
        for modality, available in self.items.items():
            if self.used.get(modality, 0) != len(available):
                raise DataError(self.where, f"{self.used.get(modality, 0)} {modality} references but "
                                            f"{len(available)} {modality} items: every item must be referenced once", "media_reference")
        return self.media
