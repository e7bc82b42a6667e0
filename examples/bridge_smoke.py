"""Smoke test of energon-nemotron inside a Megatron-Bridge environment, on CPU.

    python examples/bridge_smoke.py [--out DIR] [--batches N]

Run it in the environment you train in, after installing it as docs/install.md ("Megatron-Bridge
environment") says. It uses no GPU, no checkpoint and no download:

1. imports Bridge's training steps and its Energon data module (a missing package is named, with
   what to install);
2. writes the demo's Energon datasets (``energon_nemotron.demo.datasets``: a text one and one whose
   samples cycle through text, images, video and audio) with the shipped demo tokenizer;
3. builds the project's task encoder with ``output: nemotron_omni_step`` (preset
   ``nemotron_omni_temporal``) and hands it to Bridge's own ``EnergonMultiModalDataModule``; each
   batch it yields goes through Bridge's ``nemotron_omni_step.forward_step`` (``get_batch`` →
   ``get_batch_from_iterator``, ``get_packed_seq_params``) into a recording stand-in for the model
   (the network itself needs a GPU and a checkpoint), then through Bridge's
   ``masked_next_token_loss``; the shapes, dtypes, packed boundaries and media counts the step
   hands the model are checked;
4. the same with ``output: gpt_step`` on the text dataset, through Bridge's ``gpt_step.get_batch``
   and ``get_packed_seq_params`` (the Nemotron-H text path).

Prints one ``OK ...`` line per check and exits 0; on a failed check prints ``FAILED: ...`` and
exits 1; when a package cannot be imported prints what to install and exits 2.

Everything runs on the CPU even where a GPU is present: ``Tensor.cuda`` is the identity in this
process (the steps move their batch to the GPU). The datasets go to a temporary folder unless
``--out`` names one (kept then, with the two encoder configs the script wrote).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import tempfile
import types
from pathlib import Path

#: the Bridge release this script (and tests/test_megatron_bridge.py) was checked against
BRIDGE_TESTED = "0.6.2"
BRIDGE_MODULES = {
    "omni_step": "megatron.bridge.training.nemotron_omni_step",
    "gpt_step": "megatron.bridge.training.gpt_step",
    "packed_seq": "megatron.bridge.training.utils.packed_seq_utils",
    "datamodule": "megatron.bridge.data.energon.base_energon_datamodule",
    "package_info": "megatron.bridge.package_info",
}
INSTALL = "see docs/install.md, 'Megatron-Bridge environment'"
SEQ_LENGTH = 4096
PACKING = {"algorithm": "best_fit_decreasing", "buffer_size": 8, "pad_multiple": 8}
PATCH = 16                  # Bridge's vision patch size (nemotron_omni_step._VISION_PATCH_DIM)
TEMPORAL_UNIT = 512         # every image and frame of the temporal preset is 512 x 512


class SmokeError(Exception):
    """A check that did not hold (exit 1)."""


class MissingPackage(Exception):
    """Something the smoke needs cannot be imported (exit 2)."""


def ok(message: str) -> None:
    print(f"OK {message}", flush=True)


def check(condition: bool, message: str) -> None:
    if not condition:
        raise SmokeError(message)


def import_stack() -> types.SimpleNamespace:
    """energon_nemotron, then Bridge's modules the smoke calls; one OK line with the versions."""
    try:
        import energon_nemotron
        import transformers
    except ImportError as e:
        raise MissingPackage(f"energon_nemotron is not importable ({type(e).__name__}: {e}): "
                             f"pip install 'energon-nemotron[librosa]'; {INSTALL}") from e
    mods = {}
    for key, name in BRIDGE_MODULES.items():
        try:
            mods[key] = importlib.import_module(name)
        except ImportError as e:
            missing = f" (missing module: {e.name})" if getattr(e, "name", None) else ""
            raise MissingPackage(f"megatron.bridge is not importable: {name} failed with {type(e).__name__}: "
                                 f"{e}{missing}; install megatron-bridge=={BRIDGE_TESTED} and what it needs: "
                                 f"{INSTALL}") from e
    import megatron.core

    bridge = mods["package_info"].__version__
    ok(f"imports: megatron-bridge {bridge}, megatron-core {megatron.core.__version__}, "
       f"transformers {transformers.__version__}, energon-nemotron {energon_nemotron.__version__}")
    if bridge.split("+")[0] != BRIDGE_TESTED:
        print(f"note: this smoke was checked against Megatron-Bridge {BRIDGE_TESTED}, not {bridge}", flush=True)
    return types.SimpleNamespace(**mods)


def demo_data(out: Path) -> tuple[Path, Path, dict]:
    """The demo's multimodal and text datasets under ``out``, and the demo tokenizer's special ids."""
    from transformers import AutoTokenizer

    from energon_nemotron.demo import TOKENIZER_DIR
    from energon_nemotron.demo.datasets import multimodal_dataset, text_dataset

    multimodal, mm_keys = multimodal_dataset(out / "multimodal_dataset", n=10)
    text, text_keys = text_dataset(out / "text_dataset", "openai_messages", n=12)
    vocab = AutoTokenizer.from_pretrained(str(TOKENIZER_DIR)).get_vocab()
    ids = {"image": vocab["<image>"], "sound": vocab["<so_embedding>"]}
    ok(f"demo data: {len(mm_keys)} samples (text, images, video, audio) in {multimodal.name}, "
       f"{len(text_keys)} text samples in {text.name}, demo tokenizer")
    return multimodal, text, ids


def encoder_config(out: Path, name: str, dataset: Path, options: dict) -> Path:
    """A loader config for ``build_task_encoder`` (Bridge's data module takes the dataset path itself)."""
    import yaml

    from energon_nemotron.demo import TOKENIZER_DIR

    path = out / name
    path.write_text(yaml.safe_dump({
        "tokenizer": str(TOKENIZER_DIR),
        "task_encoder": {"name": "nemotron_multimodal",
                         "options": {"prompt_format": "nemotron6", "seq_length": SEQ_LENGTH, **options}},
        "packing": PACKING,
        "data": {"train": {"path": str(dataset)}},
        "loader": {"seed": 0},
    }, sort_keys=False))
    return path


def bridge_batches(bridge, config: Path, dataset: Path, n: int) -> list[dict]:
    """``n`` batches of the project's encoder inside Bridge's ``EnergonMultiModalDataModule``."""
    from energon_nemotron import build_task_encoder

    encoder = build_task_encoder(config)
    module = bridge.datamodule.EnergonMultiModalDataModule(
        str(dataset), tokenizer=None, seq_length=SEQ_LENGTH, micro_batch_size=1, num_workers=0,
        task_encoder=encoder, packing_buffer_size=PACKING["buffer_size"], shuffle_buffer_size=8)
    loader = module.train_dataloader()
    return [next(loader) for _ in range(n)]


class _Timer:
    """Bridge's timers and straggler timer, doing nothing."""

    def __call__(self, *args, **kwargs):
        return self

    def start(self):
        pass

    def stop(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class RecordingModel:
    """Stands in for the Nemotron Omni model: records what ``forward_step`` hands it and returns a
    zero loss per position with the loss mask it was given (the real model returns its expanded one)."""

    def __init__(self):
        self.pg_collection = types.SimpleNamespace(pp=None, cp=None, tp=None)   # one stage, no CP
        self.seen: dict = {}

    def __call__(self, **kwargs):
        import torch

        self.seen = kwargs
        return torch.zeros(kwargs["labels"].shape), kwargs["loss_mask"]


def step_state():
    """The parts of Bridge's ``GlobalState`` that ``nemotron_omni_step.forward_step`` reads."""
    dataset = types.SimpleNamespace(enable_in_batch_packing=True, defer_in_batch_packing_to_step=False,
                                    skip_getting_attention_mask_from_dataset=True)
    rerun = types.SimpleNamespace(check_for_nan_in_loss=False, check_for_spiky_loss=False)
    return types.SimpleNamespace(timers=_Timer(), straggler_timer=_Timer(),
                                 cfg=types.SimpleNamespace(dataset=dataset, rerun_state_machine=rerun))


def sound_tokens(frames: int) -> int:
    """Embeddings of a clip of ``frames`` mel frames: Parakeet's 8x subsampling, (t + 1) // 2 three times."""
    for _ in range(3):
        frames = (frames + 1) // 2
    return frames


def plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def check_packed(params, what: str) -> tuple[int, int]:
    """megatron-core's ``PackedSeqParams`` as Bridge built it: THD, boundaries that end at the row
    width, and (with ``total_tokens``) one ``seq_idx`` per packed segment."""
    check(type(params).__name__ == "PackedSeqParams" and params.qkv_format == "thd",
          f"{what}: packed_seq_params is {type(params).__name__} ({getattr(params, 'qkv_format', None)}), "
          "expected a THD PackedSeqParams")
    real = params.cu_seqlens_q.reshape(-1).tolist()
    padded = params.cu_seqlens_q_padded.reshape(-1).tolist()
    check(real[0] == padded[0] == 0 and len(real) == len(padded) >= 2, f"{what}: cu_seqlens {real} / {padded}")
    check(all(b >= a for a, b in zip(padded, padded[1:])) and padded[-1] == SEQ_LENGTH,
          f"{what}: padded boundaries {padded} do not end at {SEQ_LENGTH}")
    check(all(r <= p for r, p in zip(real, padded)), f"{what}: real boundaries {real} past the padded {padded}")
    seq_idx = getattr(params, "seq_idx", None)
    if getattr(params, "total_tokens", None) is not None and seq_idx is not None:
        idx = seq_idx.reshape(-1).tolist()
        changes = [i for i in range(1, len(idx)) if idx[i] != idx[i - 1]]
        check(len(idx) == SEQ_LENGTH and changes == padded[1:-1],
              f"{what}: seq_idx changes at {changes}, the segments start at {padded[1:-1]}")
    return len(real) - 1, real[-1]


def check_omni_media(seen: dict, ids: dict, what: str) -> list[str]:
    """Images, video frames and audio clips as the step hands them to the model."""
    import torch

    tokens = seen["input_ids"]
    kinds = []
    images = seen["images"]
    check(images.dtype == torch.bfloat16, f"{what}: images are {images.dtype}, the step casts them to bf16")
    sizes = seen.get("imgs_sizes")
    if sizes is None:
        check(images.numel() == 0, f"{what}: images {list(images.shape)} without imgs_sizes")
    else:
        units = sizes.tolist()
        patches = sum((h // PATCH) * (w // PATCH) for h, w in units)
        check(all(u == [TEMPORAL_UNIT, TEMPORAL_UNIT] for u in units), f"{what}: imgs_sizes {units}, expected 512x512")
        check(list(images.shape) == [1, patches, 3 * PATCH * PATCH],
              f"{what}: images {list(images.shape)}, expected [1, {patches}, 768] for imgs_sizes {units}")
        vision = seen["vision_packed_seq_params"].cu_seqlens_q.tolist()
        check(vision[-1] == patches and len(vision) == len(units) + 1,
              f"{what}: vision cu_seqlens {vision} for {len(units)} units of {patches} patches")
        frames = seen["num_frames"].tolist()
        check(sum(frames) == len(units), f"{what}: num_frames {frames} for {len(units)} imgs_sizes rows")
        placeholders = int((tokens == ids["image"]).sum())
        check(len(seen["num_image_tiles"]) == placeholders,
              f"{what}: {len(seen['num_image_tiles'])} num_image_tiles for {placeholders} <image> tokens")
        kinds += ["image"] * sum(1 for f in frames if f == 1) + ["video"] * sum(1 for f in frames if f > 1)
    clips = seen.get("sound_clips")
    if clips is not None:
        lengths = seen["sound_length"].tolist()
        check(clips.dtype == torch.bfloat16 and clips.dim() == 3 and clips.shape[2] == 128,
              f"{what}: sound_clips {clips.dtype} {list(clips.shape)}, expected bf16 [clips, T, 128]")
        check(clips.shape[0] == len(lengths) and clips.shape[1] == max(lengths),
              f"{what}: sound_clips {list(clips.shape)} for sound_length {lengths}")
        embedded = int((tokens == ids["sound"]).sum())
        check(sum(sound_tokens(n) for n in lengths) == embedded,
              f"{what}: sound_length {lengths} gives {sum(sound_tokens(n) for n in lengths)} embeddings, "
              f"the row has {embedded} <so_embedding>")
        kinds += ["audio"] * len(lengths)
    return kinds


def omni_smoke(bridge, batches: list[dict], ids: dict) -> set:
    """Each batch through ``nemotron_omni_step.forward_step`` and the loss; the media kinds seen."""
    import torch

    seen_kinds: set = set()
    for k, batch in enumerate(batches):
        what = f"nemotron_omni_step batch {k}"
        check(isinstance(batch, dict) and "cu_seqlens_q" in batch, f"{what}: not a packed step dict: {type(batch)}")
        trained = int(batch["loss_mask"].sum())
        model = RecordingModel()
        output, loss_fn = bridge.omni_step.forward_step(step_state(), iter([batch]), model)
        seen = model.seen
        width = seen["input_ids"].shape[1]
        for key in ("input_ids", "labels", "loss_mask", "position_ids"):
            check(list(seen[key].shape) == [1, width], f"{what}: {key} {list(seen[key].shape)}, expected [1, {width}]")
        check(seen["input_ids"].dtype == torch.int64 and seen["attention_mask"] is None,
              f"{what}: input_ids {seen['input_ids'].dtype}, attention_mask {type(seen['attention_mask'])}")
        segments, real = check_packed(seen["packed_seq_params"], what)
        kinds = check_omni_media(seen, ids, what)
        _, tokens, _ = loss_fn(output)
        check(int(tokens) == trained > 0, f"{what}: the loss counts {int(tokens)} tokens, the batch trains {trained}")
        seen_kinds |= set(kinds)
        media = ", ".join(plural(kinds.count(x), name) for x, name in
                          (("image", "image"), ("video", "video"), ("audio", "audio clip")) if x in kinds)
        ok(f"{what}: {plural(len(batch['sample_keys']), 'sample')} in {plural(segments, 'segment')} "
           f"({real} of {SEQ_LENGTH} merged positions real), compact tokens [1, {width}], "
           f"{media or 'text only'}, loss over {trained} tokens")
    return seen_kinds


def gpt_smoke(bridge, batches: list[dict]) -> None:
    """Each batch through ``gpt_step.get_batch`` (one rank, MTP on) and ``get_packed_seq_params``."""
    import torch

    cfg = types.SimpleNamespace(
        model=types.SimpleNamespace(virtual_pipeline_model_parallel_size=None, pipeline_model_parallel_layout=None),
        dataset=types.SimpleNamespace(skip_getting_attention_mask_from_dataset=True))

    group = torch.distributed.new_group([0])
    pgs = types.SimpleNamespace(pp=group, cp=group)
    for k, batch in enumerate(batches):
        what = f"gpt_step batch {k}"
        trained = int(batch["loss_mask"].sum())
        tokens, labels, loss_mask, attention_mask, position_ids, packed = bridge.gpt_step.get_batch(
            iter([batch]), cfg, use_mtp=True, pg_collection=pgs)
        for name, value in (("tokens", tokens), ("labels", labels), ("loss_mask", loss_mask),
                            ("position_ids", position_ids)):
            check(list(value.shape) == [1, SEQ_LENGTH],
                  f"{what}: {name} {list(value.shape)}, expected [1, {SEQ_LENGTH}]")
        check(attention_mask is None and packed is not None, f"{what}: attention_mask {type(attention_mask)}, "
              f"packed metadata {type(packed)}")
        params = bridge.packed_seq.get_packed_seq_params(packed)
        segments, _ = check_packed(params, what)
        check(params.cu_seqlens_q.tolist() == params.cu_seqlens_q_padded.tolist(),
              f"{what}: gpt_step boundaries should be the padded ones (MTP-safe)")
        check(int(loss_mask.sum()) == trained > 0, f"{what}: loss_mask trains {int(loss_mask.sum())}, batch {trained}")
        ok(f"{what}: {plural(len(batch['sample_keys']), 'sample')} in {plural(segments, 'segment')}, "
           f"tokens [1, {SEQ_LENGTH}], {trained} trained")


def run(out: Path, n: int) -> None:
    import torch

    bridge = import_stack()
    torch.Tensor.cuda = lambda self, *args, **kwargs: self      # CPU only: the steps' device copies stay here
    multimodal, text, ids = demo_data(out)
    omni_cfg = encoder_config(out, "encoder_omni.yaml", multimodal, {
        "preset": "nemotron_omni_temporal", "output": "nemotron_omni_step",
        "video": {"min_frames": 2, "max_frames": 4}})
    kinds = omni_smoke(bridge, bridge_batches(bridge, omni_cfg, multimodal, n), ids)
    missing = {"image", "video", "audio"} - kinds
    check(not missing, f"nemotron_omni_step: no {', '.join(sorted(missing))} in {n} batches (try --batches {n + 2})")
    ok(f"nemotron_omni_step: image, video and audio all reached the step in {n} batches")
    gpt_cfg = encoder_config(out, "encoder_gpt.yaml", text, {"output": "gpt_step"})
    store = out / "gloo.store"
    store.unlink(missing_ok=True)
    torch.distributed.init_process_group("gloo", init_method=store.resolve().as_uri(), rank=0, world_size=1)
    try:
        gpt_smoke(bridge, bridge_batches(bridge, gpt_cfg, text, n))
    finally:
        torch.distributed.destroy_process_group()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path,
                    help="write the datasets and configs here and keep them (default: a temporary folder)")
    ap.add_argument("--batches", type=int, default=2, help="batches per step (default 2)")
    args = ap.parse_args(argv)
    if args.batches < 1:
        ap.error("--batches must be at least 1")
    try:
        if args.out is not None:
            args.out.mkdir(parents=True, exist_ok=True)
            run(args.out.resolve(), args.batches)
        else:
            with tempfile.TemporaryDirectory(prefix="bridge_smoke_") as tmp:
                run(Path(tmp), args.batches)
    except MissingPackage as e:
        print(f"bridge_smoke: {e}", file=sys.stderr, flush=True)
        return 2
    except ImportError as e:        # e.g. librosa, which transformers <= 5.12.1 needs for audio (the message says)
        print(f"bridge_smoke: {type(e).__name__}: {e}; {INSTALL}", file=sys.stderr, flush=True)
        return 2
    except SmokeError as e:
        print(f"FAILED: {e}", file=sys.stderr, flush=True)
        return 1
    print("bridge smoke OK", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
