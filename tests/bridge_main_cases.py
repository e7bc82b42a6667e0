"""The rows Megatron-Bridge main's own code is run on (``tests/references/bridge_main``) and the test
of its results (``tests/test_bridge_main.py``) rebuilds: the project's loader over generated data,
``output: nemotron_omni_expanded``'s conversion, every case one packed row.

:func:`build_cases` is deterministic (fixed seeds, no shuffling that depends on time), so the test
rebuilds the cases the fixtures were made from and checks they are still the same rows before it
compares Bridge's results with them.
"""

from __future__ import annotations

from pathlib import Path

import torch

from bridge_data import audio_dataset, batches, image_dataset, vocab
from energon_data import loader_yaml
from energon_nemotron.demo.datasets import multimodal_dataset, text_dataset
from energon_nemotron.integrations import to_nemotron_omni_expanded_batch, to_nemotron_omni_step_batch

PACKING = {"algorithm": "best_fit_decreasing", "buffer_size": 8, "pad_multiple": 8, "max_sequences_per_bin": None}
#: the Bridge main commit the fixtures come from
BRIDGE_MAIN_COMMIT = "067f987df"
#: keys of a case's dict whose values are floats: the runner's stand-in encoders replace their values
#: (they encode which item and feature a position holds), so only their shapes reach the results
FLOAT_KEYS = ("pixel_values", "sound_clips")


def _datasets(root: Path) -> None:
    multimodal_dataset(root / "mm", n=15)
    audio_dataset(root / "au")
    text_dataset(root / "tx", "general_conversations", n=24)
    image_dataset(root / "im")


def build_cases(root: Path) -> list[dict]:
    """``[{"name", "cp_size", "batch": the expanded dict (loader extras dropped), "model": the
    provider fields the runner needs, "packed": the PackedBatch, "expect": None | what Bridge must
    refuse}]``, built under the empty folder ``root``.

    Cases: dynamic-resolution images (CP 1 and 2), the temporal embedder over images, video and
    audio (CP 1 and 2), audio of 1, 10, 30 and 45 s, text, one single-segment row; and two controls:
    Bridge 0.6.2's compact dict (main's model must refuse it), and audio counted by the 0.6.2 rule
    (``sound_length`` ``1 + L // 160``, which main's model takes too: it projects what
    ``sound_length`` says, so only the rule decides whether the counts are those of main's own collate)."""
    _datasets(root)
    v = vocab()
    model = {"image_token_id": v["<image>"], "sound_token_id": v["<so_embedding>"], "vocab_size": max(v.values()) + 1}
    cases: list[dict] = []

    def rows(tag, train, preset, n, *, seq_length=4096, cp=1, packing=PACKING, **extra):
        # the fixture's rows were made with the processor's frame choice (``hf``), which the temporal
        # preset no longer defaults to: pinned so that they stay reproducible
        options = {"preset": preset, "video": {"min_frames": 2, "max_frames": 4, "sampling": "hf"}, **extra}
        if cp > 1:
            options["context_parallel_size"] = cp
        cfg = loader_yaml(root / f"{tag}.yaml", {"path": train}, packing=packing, seq_length=seq_length,
                          prompt_format="nemotron6", extra_options=options)
        return batches(cfg, n)

    def add(name, batch, cp, preset, convert=to_nemotron_omni_expanded_batch, expect=None):
        t = 2 if preset == "nemotron_omni_temporal" else 1
        d = convert(batch, temporal_patch_dim=t, image_token_id=model["image_token_id"])
        d = {k: val for k, val in d.items() if k not in ("sample_keys", "skipped", "telemetry")}
        cases.append({"name": name, "cp_size": cp, "batch": d, "packed": batch, "expect": expect,
                      "model": {**model, "temporal_patch_dim": t, "seq_length": batch.seq_length}})

    valid = {"audio": {"sound_length": "valid"}}
    for tag, train, preset, n, cp, kw in (
            ("dynamic", "im", "nemotron_omni", 4, 1, {}),
            ("dynamic-cp2", "im", "nemotron_omni", 2, 2, {}),
            ("temporal", "mm", "nemotron_omni_temporal", 4, 1, {}),
            ("temporal-cp2", "mm", "nemotron_omni_temporal", 2, 2, {}),
            ("audio", "au", "nemotron_omni", 4, 1, {"seq_length": 2048}),
            ("text", "tx", "nemotron_omni", 2, 1, {})):
        for k, batch in enumerate(rows(tag, train, preset, n, cp=cp, **valid, **kw)):
            add(f"{tag}-{k}", batch, cp, preset)
    single = rows("single", "im", "nemotron_omni", 1, packing=None, **valid)[0]
    add("single-0", single, 1, "nemotron_omni")
    compact = next(c["packed"] for c in cases if c["name"].startswith("dynamic-")
                   and any(s.kind == "image" for s in c["packed"].media_spans[0]))
    add("control-compact", compact, 1, "nemotron_omni", convert=to_nemotron_omni_step_batch, expect="refused")
    stft = rows("stft", "au", "nemotron_omni", 4, seq_length=2048)
    ten = next(b for b in stft if any(s.is_audio and [n for _, n in s.runs] == [126] for s in b.media_spans[0]))
    add("control-stft-audio", ten, 1, "nemotron_omni", expect="stft")
    return cases


def fixture_inputs(case: dict) -> dict:
    """What of a case's dict the fixtures keep: every tensor but :data:`FLOAT_KEYS` as it is, those by
    shape, and the plain values."""
    out = {}
    for k, val in case["batch"].items():
        if k in FLOAT_KEYS:
            out[k] = ("shape", tuple(val.shape))
        elif isinstance(val, torch.Tensor):
            out[k] = val.clone()
        else:
            out[k] = val
    return out
