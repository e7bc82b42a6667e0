"""Megatron-Bridge 0.6.2's own code, imported module by module from the reference cache.

``tests/references/fetch_wheel.sh`` (``make references``) unpacks the PyPI wheel into
``.cache/references/megatron_bridge-0.6.2/`` (or ``$ENERGON_NEMOTRON_REFERENCES``/...); nothing
is installed into the virtualenv. Bridge's package ``__init__``s import every model and its heavy
dependencies, so they are never run: ``import_bridge_module`` puts a meta-path finder in front
that answers every *package* under ``megatron.bridge`` with a bare module (no ``__init__`` code)
whose ``__path__`` is the real folder in the cache; the *modules* (``.py`` files) are then found
by Python's ordinary path finder through those ``__path__``s and run unchanged. The top package
``megatron`` stays the namespace package from the virtualenv (``megatron.core``,
``megatron.energon``), untouched.

A missing cache raises ``RuntimeError``: tests that need Bridge fail, they do not skip.
"""

from __future__ import annotations

import base64
import importlib
import importlib.abc
import importlib.machinery
import io
import os
import sys
import types
from pathlib import Path

import numpy as np

BRIDGE_VERSION = "0.6.2"
REPO = Path(__file__).resolve().parents[2]
REFERENCES_ENV = "ENERGON_NEMOTRON_REFERENCES"
VIDEO_UTILS = "megatron.bridge.models.nemotron_vl.nemotron_vl_utils"


def references_dir() -> Path:
    """Where ``make references`` puts the reference code (``$ENERGON_NEMOTRON_REFERENCES`` wins)."""
    return Path(os.environ.get(REFERENCES_ENV) or REPO / ".cache" / "references")


#: a folder holding ``megatron/bridge/`` to import instead of the 0.6.2 wheel (e.g. Bridge main's ``src``,
#: for ``references/bridge_main``)
BRIDGE_ROOT_ENV = "ENERGON_NEMOTRON_BRIDGE_ROOT"


def bridge_root() -> Path:
    """The unpacked wheel: the folder that contains ``megatron/bridge/`` (``$ENERGON_NEMOTRON_BRIDGE_ROOT``
    when set)."""
    explicit = os.environ.get(BRIDGE_ROOT_ENV)
    if explicit:
        if not (Path(explicit) / "megatron" / "bridge").is_dir():
            raise RuntimeError(f"${BRIDGE_ROOT_ENV} = {explicit} holds no megatron/bridge/")
        return Path(explicit)
    root = references_dir() / f"megatron_bridge-{BRIDGE_VERSION}"
    if not (root / ".fetched").is_file() or not (root / "megatron" / "bridge").is_dir():
        raise RuntimeError(
            f"Megatron-Bridge {BRIDGE_VERSION} reference code is missing from {root}; "
            "run `make references` (tests/references/fetch_wheel.sh) to fetch it")
    return root


class _BarePackageLoader(importlib.abc.Loader):
    """Makes the package module and runs none of its ``__init__.py``."""

    def create_module(self, spec):
        return None  # the default: a plain types.ModuleType

    def exec_module(self, module):
        pass


class _BridgePackageFinder(importlib.abc.MetaPathFinder):
    """Answers ``megatron.bridge`` and its sub-packages with bare packages rooted in the cache."""

    def __init__(self, root: Path):
        self.root = root

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "megatron.bridge" and not fullname.startswith("megatron.bridge."):
            return None
        folder = self.root.joinpath(*fullname.split("."))
        if not folder.is_dir():
            return None  # a module file: found by the path finder through the parent's __path__
        spec = importlib.machinery.ModuleSpec(fullname, _BarePackageLoader(), is_package=True)
        spec.submodule_search_locations = [str(folder)]
        return spec


def _install_finder(root: Path) -> None:
    for finder in sys.meta_path:
        if isinstance(finder, _BridgePackageFinder):
            if finder.root != root:
                raise RuntimeError(f"megatron.bridge is already imported from {finder.root}, not {root}")
            return
    loaded = sys.modules.get("megatron.bridge")
    if loaded is not None:
        raise RuntimeError(
            f"megatron.bridge is already imported from {list(getattr(loaded, '__path__', []))}; "
            f"the reference must come from {root}")
    try:
        importlib.import_module("megatron")  # the virtualenv's namespace package, left as it is
    except ModuleNotFoundError:
        megatron = types.ModuleType("megatron")
        megatron.__path__ = [str(root / "megatron")]
        sys.modules["megatron"] = megatron
    sys.meta_path.insert(0, _BridgePackageFinder(root))


def import_bridge_module(name: str) -> types.ModuleType:
    """Import one Bridge module (e.g. ``megatron.bridge.models.nemotron_vl.nemotron_vl_utils``)."""
    if not name.startswith("megatron.bridge."):
        raise ValueError(f"not a megatron.bridge module: {name!r}")
    root = bridge_root()
    _install_finder(root)
    module = importlib.import_module(name)
    origin = Path(getattr(module, "__file__", None) or "")
    if root.resolve() not in origin.resolve().parents:
        raise RuntimeError(f"{name} was imported from {origin or '?'}, not from {root}")
    return module


def decode_data_url(url: str) -> np.ndarray:
    """A ``data:image/...;base64,`` URL as an RGB uint8 array (H, W, 3)."""
    from PIL import Image

    header, sep, payload = url.partition(",")
    if not sep or not header.startswith("data:image/") or not header.endswith(";base64"):
        raise ValueError(f"not a base64 image data URL: {url[:40]!r}...")
    with Image.open(io.BytesIO(base64.b64decode(payload))) as image:
        return np.array(image.convert("RGB"), dtype=np.uint8)


def bridge_sample_video(path: str | Path, fps: float, nframe: int = 0, nframe_max: int = -1):
    """Bridge's ``sample_video_frames_to_data_urls``, frames decoded back from its JPEG URLs.

    Returns ``(frames, metadata)``: a list of RGB uint8 arrays (H, W, 3) in the order Bridge
    returns them, and Bridge's ``transformers.video_utils.VideoMetadata`` as it is.
    """
    utils = import_bridge_module(VIDEO_UTILS)
    urls, metadata = utils.sample_video_frames_to_data_urls(
        str(path), fps=fps, nframe=nframe, nframe_max=nframe_max)
    return [decode_data_url(url) for url in urls], metadata
