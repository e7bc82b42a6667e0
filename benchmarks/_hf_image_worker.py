"""Worker of ``image_processor.py``: the official Nemotron Omni image processor (transformers 5.24) in
the ``.venv-ref`` environment, timed one round at a time on command.

    python benchmarks/_hf_image_worker.py FOLDER       (FOLDER/*.img: the encoded images, in name order)

Prints ``ready``; then for every line ``round`` on stdin processes each image once (``Image.open``
on the bytes, the processor call with ``return_tensors="pt"``) and prints a JSON list of seconds per
image; ``save OUT`` writes every image's ``pixel_values`` to ``OUT/NAME.npy``; ``quit`` ends. One
thread (``torch.set_num_threads(1)``), as the project's side.
"""

from __future__ import annotations

import io
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from transformers.models.nemotron_h_omni import NemotronH_Omni_Reasoning_V3ImageProcessor


def main() -> None:
    torch.set_num_threads(1)
    folder = Path(sys.argv[1])
    images = [(p.stem, p.read_bytes()) for p in sorted(folder.glob("*.img"))]
    proc = NemotronH_Omni_Reasoning_V3ImageProcessor()

    def run(data: bytes):
        return proc(images=[Image.open(io.BytesIO(data))], return_tensors="pt")["pixel_values"]

    for _, data in images:                                   # warm-up
        run(data)
    print("ready", flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if not cmd or cmd[0] == "quit":
            break
        if cmd[0] == "save":
            out = Path(cmd[1])
            for name, data in images:
                np.save(out / f"{name}.npy", run(data).numpy())
            print("saved", flush=True)
            continue
        seconds = []
        for _, data in images:
            t = time.perf_counter()
            run(data)
            seconds.append(time.perf_counter() - t)
        print(json.dumps(seconds), flush=True)


if __name__ == "__main__":
    main()
