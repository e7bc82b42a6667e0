"""Run Megatron-Bridge 0.6.2's training steps on project batches (a subprocess of the tests).

    python tests/references/bridge_steps.py CASES.pt RESULTS.pt

``CASES.pt`` (``torch.save``): a list of cases, each ``{"name", "step": "nemotron_omni" | "gpt",
"batch": the dict under test, "model": {...}}``. For every case this script, in a fresh process
with megatron-core 0.19.2 (``bridge_runtime.activate``):

- ``nemotron_omni``: Bridge's ``nemotron_omni_step.forward_step`` (which calls its
  ``get_batch`` → ``get_batch_from_iterator``; ``Tensor.cuda`` is the identity, there is no GPU)
  drives megatron-core's real ``LLaVAModel.forward`` — the media/text merge, the label and loss
  mask expansion, the temporal tubelet stacking, the pixel shuffle — with tiny random encoders:
  Bridge's real ``BridgeSoundEncoder`` (a one-layer Parakeet), a linear vision encoder standing in
  for RADIO (RADIO's THD attention needs Transformer Engine) and a recording language model.
  Everything runs in bf16, as in training. The merged embeddings are built so that their first two
  features spell the token id at every text position and the ``<image>`` / ``<so_embedding>`` id
  at every image / sound position; the rest is random. Then Bridge's ``masked_next_token_loss`` runs on the model's loss mask.
- ``datamodule``: the project's task encoder inside Bridge's ``EnergonMultiModalDataModule`` (its
  own WorkerConfig and loader), every batch it yields through ``forward_step`` as above.
- ``gpt``: Bridge's ``gpt_step.get_batch`` (CP 1) and ``get_packed_seq_params``, then
  megatron-core's MTP ``roll_tensor`` over those params, ``depth`` times.

``RESULTS.pt``: per case, what the reference produced (see ``_omni`` and ``_gpt``).
"""

from __future__ import annotations

import contextlib
import sys
import types
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
warnings.simplefilter("ignore")

from references.bridge_runtime import activate  # noqa: E402

activate()

import torch  # noqa: E402
from megatron.core.models.multimodal.llava_model import LLaVAModel  # noqa: E402
from megatron.core.transformer.multi_token_prediction import roll_tensor  # noqa: E402

from references.bridge import import_bridge_module  # noqa: E402

HIDDEN = 8          # language model width; features 0 and 1 carry the id (exact in bf16)
VISION = 6          # vision encoder width
BASE = 64           # id = BASE * feature0 + feature1: both < 256, integers bf16 holds exactly
DTYPE = torch.bfloat16   # the dtype Bridge trains in (the step casts images and sound clips to it)


class _Timer:
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


class TinyVision(torch.nn.Module):
    """Stands in for RADIO: a random linear map of each 16x16 patch (``[1, ΣP, 768]`` →
    ``[1, ΣP, VISION]``), no class tokens. With ``temporal_patch_dim`` T > 1 it groups frames into
    tubelets as RADIO's temporal path does (T consecutive frames of an item side by side; an image,
    ``num_frames`` 1, repeated T times) and returns RADIO's triple."""

    patch_dim = 16
    class_token_len = 0
    add_class_token = False

    def __init__(self, temporal: int):
        super().__init__()
        self.temporal = temporal
        self.proj = torch.nn.Linear(768 * temporal, VISION)
        self.seen: dict = {}

    def forward(self, images, imgs_sizes=None, packed_seq_params=None, num_frames=None):
        self.seen = {"images": images.detach().clone(), "imgs_sizes": imgs_sizes.clone(),
                     "vision_cu_seqlens": packed_seq_params.cu_seqlens_q.tolist() if packed_seq_params is not None else None}
        x = images.squeeze(0).to(self.proj.weight.dtype)
        if self.temporal == 1:
            return self.proj(x).unsqueeze(0)
        counts = [(int(h) // 16) * (int(w) // 16) for h, w in imgs_sizes.tolist()]
        frames = list(torch.split(x, counts))
        out, sizes, at = [], [], 0
        for n in num_frames.tolist():
            item = frames[at:at + n]
            at += n
            if n == 1:
                item = item * self.temporal
            for k in range(0, len(item), self.temporal):
                group = item[k:k + self.temporal]
                group += [group[-1]] * (self.temporal - len(group))
                out.append(self.proj(torch.cat(group, dim=1)))
                sizes.append(imgs_sizes[0].tolist())
        return torch.cat(out).unsqueeze(0), torch.tensor(sizes), None


class RecordingLM(torch.nn.Module):
    """The language model: an embedding whose features 0 and 1 spell the token id; its forward
    records the merged sequence and returns per-position zeros as the 'loss'."""

    def __init__(self, vocab: int):
        super().__init__()
        if vocab > BASE * BASE:
            raise ValueError(f"vocab {vocab} too large for the id encoding")
        self.table = torch.nn.Embedding(vocab, HIDDEN)
        with torch.no_grad():
            ids = torch.arange(vocab)
            self.table.weight[:, 0] = (ids // BASE).float()
            self.table.weight[:, 1] = (ids % BASE).float()
        self.seen: dict = {}

    def embedding(self, input_ids, position_ids):
        return self.table(input_ids).transpose(0, 1)          # [s, b, h]

    def forward(self, input_ids=None, position_ids=None, attention_mask=None, decoder_input=None,
                labels=None, packed_seq_params=None, **kwargs):
        merged = decoder_input.transpose(0, 1)                  # [b, s, h]
        ids = merged[..., 0].float().round() * BASE + merged[..., 1].float().round()
        self.seen = {"merged_ids": ids.to(torch.int64), "labels": labels.clone(),
                     "packed_seq_params": packed_seq_params}
        return torch.zeros(labels.shape)


def _id_projection(width_in: int, token_id: int) -> torch.nn.Linear:
    """A random projection whose output features 0 and 1 always spell ``token_id``."""
    proj = torch.nn.Linear(width_in, HIDDEN)
    with torch.no_grad():
        proj.weight[:2].zero_()
        proj.bias[0], proj.bias[1] = float(token_id // BASE), float(token_id % BASE)
    return proj


def tiny_llava(model: dict) -> LLaVAModel:
    """A ``LLaVAModel`` with the attributes its ``forward`` reads, the tiny parts above, and the
    configuration Bridge's Nemotron Omni provider gives it (``img_seq_len`` 1 for dynamic
    resolution, 256 with the temporal embedder; pixel shuffle; no class token)."""
    sound = import_bridge_module("megatron.bridge.models.nemotron_omni.nemotron_omni_sound")
    torch.manual_seed(0)
    llava = LLaVAModel.__new__(LLaVAModel)
    torch.nn.Module.__init__(llava)
    t = model["temporal_patch_dim"]
    llava.pre_process = llava.post_process = llava.add_encoder = llava.add_decoder = True
    llava.temporal_patch_dim = t
    llava.context_parallel_lm = 1
    llava.sequence_parallel_lm = False
    llava.dynamic_resolution = True
    llava._pixel_shuffle = True
    llava._drop_vision_class_token = True
    llava._tile_tags = None
    llava._language_max_sequence_length = model["seq_length"]
    llava._language_is_pipeline_parallel = False
    llava.img_seq_len = 256 if t > 1 else 1
    llava.image_token_index = model["image_token_id"]
    llava.sound_token_index = model["sound_token_id"]
    llava.vision_model = TinyVision(t)
    llava.vision_projection = _id_projection(4 * VISION, model["image_token_id"])
    llava.sound_model = sound.BridgeSoundEncoder(types.SimpleNamespace(
        hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        num_mel_bins=128, subsampling_factor=8)).eval()
    llava.sound_projection = _id_projection(16, model["sound_token_id"])
    llava.language_model = RecordingLM(model["vocab_size"])
    llava.pg_collection = types.SimpleNamespace(pp=None, cp=None, tp=None)
    return llava.to(DTYPE)


def _packed(params) -> dict:
    if params is None:
        return {}
    out = {}
    for name in ("cu_seqlens_q", "cu_seqlens_kv", "cu_seqlens_q_padded", "cu_seqlens_kv_padded",
                 "max_seqlen_q", "max_seqlen_kv", "total_tokens", "qkv_format"):
        value = getattr(params, name, None)
        out[name] = value.tolist() if torch.is_tensor(value) else value
    seq_idx = getattr(params, "seq_idx", None)
    out["seq_idx"] = seq_idx.reshape(-1).tolist() if torch.is_tensor(seq_idx) else None
    return out


def _omni(case: dict) -> dict:
    step = import_bridge_module("megatron.bridge.training.nemotron_omni_step")
    model = tiny_llava(case["model"])
    captured: dict = {}
    original = model.forward

    def forward(**kwargs):                      # records what the step hands the model
        captured["keys"] = sorted(kwargs)
        captured["sound_clips"] = kwargs.get("sound_clips")
        captured["sound_length"] = kwargs.get("sound_length")
        with torch.no_grad():
            out, mask = original(**kwargs)
        if kwargs.get("sound_clips") is not None:
            _, lengths = model.sound_model(kwargs["sound_clips"], kwargs["sound_length"])
            captured["sound_embedding_lengths"] = lengths.tolist()
        return out, mask

    model.forward = forward
    loss_mask, tokens = _forward(step, model, case["batch"])
    seen = model.language_model.seen
    vision = model.vision_model.seen
    return {
        "forward_keys": captured["keys"],
        "merged_ids": seen["merged_ids"][0],
        "labels": seen["labels"][0],
        "loss_mask": loss_mask,
        "loss_tokens": tokens,
        "packed": _packed(seen["packed_seq_params"]),
        "vision_cu_seqlens": vision.get("vision_cu_seqlens"),
        "vision_images_shape": list(vision["images"].shape) if vision else None,
        "vision_images_dtype": str(vision["images"].dtype) if vision else None,
        "sound_length": captured["sound_length"].tolist() if captured["sound_length"] is not None else None,
        "sound_clips_dtype": str(captured["sound_clips"].dtype) if captured["sound_clips"] is not None else None,
        "sound_embedding_lengths": captured.get("sound_embedding_lengths"),
    }


def _forward(step, model, batch) -> tuple[torch.Tensor, int]:
    """Bridge's ``forward_step`` on one batch dict; (the model's loss mask, the loss's token count)."""
    cfg = types.SimpleNamespace(
        dataset=types.SimpleNamespace(enable_in_batch_packing=True, defer_in_batch_packing_to_step=False,
                                      skip_getting_attention_mask_from_dataset=True),
        rerun_state_machine=types.SimpleNamespace(check_for_nan_in_loss=False, check_for_spiky_loss=False))
    state = types.SimpleNamespace(timers=_Timer(), straggler_timer=_Timer(), cfg=cfg)
    output, loss_fn = step.forward_step(state, iter([batch]), model)
    _, tokens, _ = loss_fn(output)
    return loss_fn.args[0].reshape(-1), int(tokens)


def _datamodule(case: dict) -> dict:
    """The project's task encoder (``output: nemotron_omni_step``) handed to Bridge's
    ``EnergonMultiModalDataModule``; its batches go straight to ``forward_step``."""
    from energon_nemotron.loading import build_task_encoder

    data = import_bridge_module("megatron.bridge.data.energon.base_energon_datamodule")
    step = import_bridge_module("megatron.bridge.training.nemotron_omni_step")
    encoder = build_task_encoder(case["config"])
    module = data.EnergonMultiModalDataModule(
        case["dataset"], tokenizer=None, seq_length=case["model"]["seq_length"], micro_batch_size=1,
        num_workers=case["num_workers"], task_encoder=encoder, packing_buffer_size=case["packing_buffer_size"],
        shuffle_buffer_size=8)
    loader = module.train_dataloader()
    model = tiny_llava(case["model"])
    out = {"batches": [], "error": None}
    try:
        for _ in range(case["batches"]):
            batch = next(loader)
            summary = {"keys": sorted(batch), "sample_keys": list(batch["sample_keys"]),
                       "skipped": dict(batch["skipped"]), "compact_trained": int(batch["loss_mask"].sum()),
                       "telemetry": dict(batch["telemetry"])}
            with torch.no_grad():
                _, summary["loss_tokens"] = _forward(step, model, batch)
            out["batches"].append(summary)
    except Exception as e:                      # the policy 'raise': the test reads the message
        out["error"] = f"{type(e).__name__}: {e}"
    return out


def _gpt(case: dict) -> dict:
    gpt = import_bridge_module("megatron.bridge.training.gpt_step")
    cfg = types.SimpleNamespace(model=types.SimpleNamespace(virtual_pipeline_model_parallel_size=None,
                                                            pipeline_model_parallel_layout=None),
                                dataset=types.SimpleNamespace(skip_getting_attention_mask_from_dataset=True))
    group = torch.distributed.new_group([0])
    pgs = types.SimpleNamespace(pp=group, cp=group)
    tokens, labels, loss_mask, attention_mask, position_ids, packed = gpt.get_batch(
        iter([case["batch"]]), cfg, use_mtp=True, pg_collection=pgs)
    params = gpt.get_packed_seq_params(packed) if packed is not None else None
    rolled_labels, rolled_mask = [], []
    lab, msk = labels, loss_mask
    for _ in range(case.get("depth", 0)):
        lab, _ = roll_tensor(lab, shifts=-1, dims=-1, packed_seq_params=params)
        msk, _ = roll_tensor(msk, shifts=-1, dims=-1, packed_seq_params=params)
        rolled_labels.append(lab[0].clone())
        rolled_mask.append(msk[0].clone())
    return {"tokens": tokens[0], "labels": labels[0], "loss_mask": loss_mask[0], "position_ids": position_ids[0],
            "attention_mask": attention_mask, "packed": _packed(params),
            "mtp_labels": rolled_labels, "mtp_loss_mask": rolled_mask}


def main(cases_path: str, results_path: str) -> None:
    torch.Tensor.cuda = lambda self, *args, **kwargs: self     # no GPU: device copies are the identity
    torch.cuda.current_device = lambda: torch.device("cpu")    # and the current device is the CPU
    # a one-process group rendezvous through a file beside the results: no TCP port to collide with
    # the other tests' (a port picked from the pid was once taken: EADDRINUSE)
    store = Path(results_path).with_suffix(".store")
    store.unlink(missing_ok=True)
    torch.distributed.init_process_group("gloo", init_method=store.resolve().as_uri(), rank=0, world_size=1)
    results = []
    for case in torch.load(cases_path, weights_only=True):
        run = {"nemotron_omni": _omni, "gpt": _gpt, "datamodule": _datamodule}[case["step"]]
        try:
            results.append({"name": case["name"], "ok": True, **run(case)})
        except Exception as e:                  # reported to the test, which shows it
            import traceback

            results.append({"name": case["name"], "ok": False,
                            "error": f"{type(e).__name__}: {e}\n{traceback.format_exc()[-3000:]}"})
    torch.distributed.destroy_process_group()
    torch.save(results, results_path)


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        main(*sys.argv[1:3])
