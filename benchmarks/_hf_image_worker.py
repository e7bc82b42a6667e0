"""Worker of ``image_processor.py``: the official Nemotron Omni image processor (transformers 5.24) in
the ``.venv-ref`` environment, timed one round at a time on command.

    python benchmarks/_hf_image_worker.py FOLDER       (FOLDER/*.img: the encoded images, in name order)

The command loop is ``_ref_worker.serve``'s: ``round`` processes each image once (``Image.open`` on
the bytes, the processor call with ``return_tensors="pt"``); ``save OUT`` writes every image's
``pixel_values`` to ``OUT/NAME.npy``. One thread (``torch.set_num_threads(1)``), as the project's
side.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from transformers.models.nemotron_h_omni import NemotronH_Omni_Reasoning_V3ImageProcessor

from _ref_worker import serve


def main() -> None:
    torch.set_num_threads(1)
    folder = Path(sys.argv[1])
    images = [(p.stem, p.read_bytes()) for p in sorted(folder.glob("*.img"))]
    proc = NemotronH_Omni_Reasoning_V3ImageProcessor()

    def run(data: bytes):
        return proc(images=[Image.open(io.BytesIO(data))], return_tensors="pt")["pixel_values"]

    def save(out: Path) -> None:
        for name, data in images:
            np.save(out / f"{name}.npy", run(data).numpy())

    for _, data in images:                                   # warm-up
        run(data)
    serve([data for _, data in images], run, save)


if __name__ == "__main__":
    main()
