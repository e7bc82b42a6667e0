"""Worker of ``audio_path.py``: the official Nemotron Omni processor's audio path (transformers 5.24
in ``.venv-ref``), timed one round at a time on command.

    python benchmarks/_hf_audio_worker.py FOLDER TOKENIZER      (FOLDER/*.wav, in name order)

Per file, what the processor does with an audio path: ``transformers.audio_utils.load_audio(path,
16000)`` (soundfile + soxr without torchcodec) and ``_process_audio`` (the Parakeet features and the
token count). The command loop is ``_ref_worker.serve``'s; ``save OUT`` writes every file's
``input_features[0]`` to ``OUT/NAME.npy`` and its token count to ``OUT/NAME.tokens``. One thread
(``torch.set_num_threads(1)``), as the project's side.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
from transformers import AutoTokenizer, ParakeetFeatureExtractor
from transformers.audio_utils import load_audio
from transformers.models.nemotron_h_omni import (
    NemotronH_Omni_Reasoning_V3ImageProcessor,
    NemotronH_Omni_Reasoning_V3Processor,
    NemotronH_Omni_Reasoning_V3VideoProcessor,
)

from _ref_worker import serve


def main() -> None:
    torch.set_num_threads(1)
    folder, tokenizer = Path(sys.argv[1]), sys.argv[2]
    files = sorted(folder.glob("*.wav"))
    proc = NemotronH_Omni_Reasoning_V3Processor(
        image_processor=NemotronH_Omni_Reasoning_V3ImageProcessor(),
        video_processor=NemotronH_Omni_Reasoning_V3VideoProcessor(),
        tokenizer=AutoTokenizer.from_pretrained(tokenizer),
        feature_extractor=ParakeetFeatureExtractor(feature_size=128, sampling_rate=16000, hop_length=160))

    def run(path: Path):
        features, _, tokens = proc._process_audio(load_audio(str(path), sampling_rate=16000), {})
        return features[0], tokens[0]

    def save(out: Path) -> None:
        for path in files:
            features, tokens = run(path)
            np.save(out / f"{path.stem}.npy", features.numpy())
            (out / f"{path.stem}.tokens").write_text(str(int(tokens)))

    for path in files:                                       # warm-up
        run(path)
    serve(files, run, save)


if __name__ == "__main__":
    main()
