"""Tokens/s of the project's Energon text path against a naive hand-written Energon task encoder.

Data: the 2,000 conversations of ``text_path.py`` (``--quick``: 300; about 1,160 Qwen2.5 tokens each),
the same crude WebDataset shards (prepared with the real ``energon prepare``, ``subflavors.cooker:
openai_messages``, cached in ``benchmarks/.cache/text_path/``). Tokenizer: Qwen2.5 with a ChatML chat
template that marks each assistant turn with ``{% generation %}`` (``tokenizer_dir``).

Passes over the same samples, each loader built once before any clock starts and iterated to the
end of its epoch each round (``repeat=False``, no shuffle buffer, packing buffer 256, seq_length
4096, batch size 1, first-fit-decreasing on both sides, so both make the same packs):

- naive: what one writes by hand on Energon (:class:`NaiveChatEncoder`, a ``DefaultTaskEncoder``):
  a cooker that takes the messages of the crude sample; ``encode_sample`` calls the Hugging Face
  tokenizer's ``apply_chat_template(messages, tokenize=True, return_dict=True,
  return_assistant_tokens_mask=True)`` and builds labels and loss mask from the assistant mask;
  ``select_samples_to_pack`` is first-fit-decreasing, ``pack_selected_samples`` concatenates,
  ``batch`` pads and stacks. Run by Energon's own ``get_train_dataset`` + ``get_savable_loader``
  (the loader settings of ``text_path``'s Energon reader: no periodic ``gc.collect``, no watchdog).
- project: ``build_train_loader`` with prompt format ``tokenizer`` (the same template, its
  generation spans), first-fit-decreasing, the same buffer and seq_length.
- each of them with ``num_workers`` 0 (the one worker is this process) and 2 (two worker processes,
  persistent, started in the untimed warm-up round). With 2 workers the per-core figure is
  tokens/s ÷ 2; this machine's main process, collating the workers' batches, shares the cores.
- floor: single-thread ``tokenizer(texts, add_special_tokens=False)``, the whole list in one call
  (``text_path``'s fastest plain variant), over the rendered texts (``apply_chat_template(...,
  tokenize=False)``, untimed).

A warm-up round (untimed) checks that every pass yields every sample once and the same number of
tokens (the sum of ``cu_seqlens[-1]``) and of trained labels (the sum of ``loss_mask``), the
floor's token count included; then ``--rounds`` timed rounds (default 1, so that the full run stays
near 3 minutes on a slow 2-core machine), alternating the order, median of the rounds.

``ratio`` = the lower of project ÷ naive tokens/s with 0 and with 2 workers (goal 2.0, higher is
better); ``floor_ratio`` = the lower of project ÷ floor with 0 workers and project per core (÷ 2) ÷
floor with 2 workers (goal ``FLOOR_GOAL`` 0.90). ``tokenize_only_bound``: floor ÷ naive with 0
workers, the ratio a path would reach that did nothing but the floor's tokenization on one core (no
reading, cooking, rendering, masks or packing): while it is under the goal, no one-core path over
the same tokenizer can meet it. The machine's own two-process ceiling (``scaling``'s
pure-Python loop in 2 processes ÷ 1) is measured in the same run and reported beside them: the
per-core figure with 2 workers cannot pass half of it. ``--profile``: cProfile one project pass with 0
workers, the top entries by own and by cumulative time, and the own time grouped by component.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")      # Energon's "Filling reading buffer" progress bar

import _common as C  # noqa: E402
import _text_profile  # noqa: E402
import scaling  # noqa: E402
import text_path  # noqa: E402
from energon_nemotron.demo.build_tokenizer import CHAT_TEMPLATE as DEMO_CHAT_TEMPLATE  # noqa: E402
import torch  # noqa: E402
from megatron.energon import (Batch, Cooker, DefaultTaskEncoder, Sample, basic_sample_keys,  # noqa: E402
                              stateless)

GOAL = 2.0
FLOOR_GOAL = 0.90
SEQ_LENGTH = 4096
BUFFER = 256
WORKERS = (0, 2)
#: ChatML, each assistant turn's content and ``<|im_end|>`` inside ``{% generation %}`` markers (the
#: demo tokenizer's template)
CHATML_TEMPLATE = DEMO_CHAT_TEMPLATE


def tokenizer_dir() -> Path:
    """Qwen2.5 (``qwen_tokenizer_dir``) with :data:`CHATML_TEMPLATE` as its chat template; cached in
    ``benchmarks/.cache/vs_naive_energon/tokenizer`` and rebuilt when the template changes."""
    out = C.CACHE_DIR / "vs_naive_energon" / "tokenizer"
    marker = out / "bench.json"
    want = {"chat_template": CHATML_TEMPLATE, "source": str(C.qwen_tokenizer_dir())}
    if marker.is_file() and json.loads(marker.read_text()) == want:
        return out
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(want["source"], local_files_only=True)
    tok.chat_template = CHATML_TEMPLATE
    tok.save_pretrained(str(out))
    marker.write_text(json.dumps(want))
    return out


# ---------------------------------------------------------------------------------------------
# The naive encoder
# ---------------------------------------------------------------------------------------------
@dataclass
class ChatSample(Sample):
    """A cooked crude sample: its OpenAI-style messages."""

    messages: list


@dataclass
class TokenSample(Sample):
    """One encoded conversation, or a pack of them (``cu_seqlens`` the boundaries)."""

    tokens: torch.Tensor
    labels: torch.Tensor
    loss_mask: torch.Tensor
    position_ids: torch.Tensor
    cu_seqlens: torch.Tensor


@dataclass
class TokenBatch(Batch):
    """Packs padded to the longest and stacked."""

    tokens: torch.Tensor
    labels: torch.Tensor
    loss_mask: torch.Tensor
    position_ids: torch.Tensor
    cu_seqlens: list


@stateless
def cook_chat(sample: dict, **aux) -> ChatSample:
    """The naive cooker: the ``messages`` of the crude sample's (Energon-decoded) ``json`` member."""
    return ChatSample(**basic_sample_keys(sample), messages=sample["json"]["messages"])


class NaiveChatEncoder(DefaultTaskEncoder):
    """A task encoder as one writes it by hand for Energon chat SFT (see the module docstring)."""

    cookers = [Cooker(cook_chat)]

    def __init__(self, tokenizer_path: Path, seq_length: int = SEQ_LENGTH) -> None:
        from transformers import AutoTokenizer

        super().__init__()
        self.tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_path), local_files_only=True)
        self.pad_id = self.tokenizer.pad_token_id
        self.seq_length = seq_length

    @stateless
    def encode_sample(self, sample: ChatSample) -> TokenSample:
        out = self.tokenizer.apply_chat_template(sample.messages, tokenize=True, return_dict=True,
                                                 return_assistant_tokens_mask=True)
        ids = torch.tensor(out["input_ids"][:self.seq_length], dtype=torch.long)
        trained = torch.tensor(out["assistant_masks"][:self.seq_length], dtype=torch.bool)
        labels = torch.full_like(ids, -100)
        labels[:-1] = torch.where(trained[1:], ids[1:], -100)
        return TokenSample.derive_from(sample, tokens=ids, labels=labels, loss_mask=(labels != -100).float(),
                                       position_ids=torch.arange(len(ids)),
                                       cu_seqlens=torch.tensor([0, len(ids)], dtype=torch.int32))

    def select_samples_to_pack(self, samples: list[TokenSample]) -> list[list[TokenSample]]:
        bins: list[list[TokenSample]] = []
        room: list[int] = []
        for s in sorted(samples, key=lambda s: len(s.tokens), reverse=True):
            n = len(s.tokens)
            for i, free in enumerate(room):
                if n <= free:
                    bins[i].append(s)
                    room[i] -= n
                    break
            else:
                bins.append([s])
                room.append(self.seq_length - n)
        return bins

    @stateless
    def pack_selected_samples(self, samples: list[TokenSample]) -> TokenSample:
        lengths = torch.tensor([0] + [len(s.tokens) for s in samples])
        return TokenSample(
            __key__=",".join(s.__key__ for s in samples), __restore_key__=(),     # set by Energon
            __subflavors__=samples[0].__subflavors__, __sources__=samples[0].__sources__,
            tokens=torch.cat([s.tokens for s in samples]), labels=torch.cat([s.labels for s in samples]),
            loss_mask=torch.cat([s.loss_mask for s in samples]),
            position_ids=torch.cat([s.position_ids for s in samples]),
            cu_seqlens=torch.cumsum(lengths, 0).to(torch.int32))

    def batch(self, samples: list[TokenSample]) -> TokenBatch:
        width = max(len(s.tokens) for s in samples)

        def stack(name: str, fill) -> torch.Tensor:
            return torch.stack([torch.nn.functional.pad(getattr(s, name), (0, width - len(s.tokens)), value=fill)
                                for s in samples])

        return TokenBatch(__key__=[s.__key__ for s in samples], __restore_key__=(),
                          tokens=stack("tokens", self.pad_id), labels=stack("labels", -100),
                          loss_mask=stack("loss_mask", 0.0), position_ids=stack("position_ids", 0),
                          cu_seqlens=[s.cu_seqlens for s in samples])


def naive_loader(dataset: Path, num_workers: int):
    """The naive encoder through Energon's ``get_train_dataset`` + ``get_savable_loader``."""
    from megatron.energon import WorkerConfig, get_savable_loader, get_train_dataset

    ds = get_train_dataset(str(dataset), batch_size=1, task_encoder=NaiveChatEncoder(tokenizer_dir()), repeat=False,
                           worker_config=WorkerConfig(rank=0, world_size=1, num_workers=num_workers),
                           shuffle_buffer_size=None, max_samples_per_sequence=None, packing_buffer_size=BUFFER)
    return get_savable_loader(ds, gc_collect_every_n_steps=0, watchdog_timeout_seconds=None)


def project_config(dataset: Path, num_workers: int) -> dict:
    return {"tokenizer": str(tokenizer_dir()),
            "task_encoder": {"name": "nemotron_multimodal",
                             "options": {"prompt_format": "tokenizer", "seq_length": SEQ_LENGTH}},
            "packing": {"algorithm": "first_fit_decreasing", "buffer_size": BUFFER, "pad_multiple": 1},
            "data": {"train": {"path": str(dataset)}},
            "loader": {"batch_size": 1, "num_workers": num_workers, "shuffle_buffer_size": None, "seed": 0}}


def epoch_pass(loader, keys) -> dict:
    """Seconds, real tokens, trained labels, rows and samples of one epoch of ``loader``;
    ``keys(batch)`` gives the batch's sample keys per row."""
    t0 = time.perf_counter()
    tokens = trained = rows = samples = 0
    for batch in loader:
        tokens += sum(int(c[-1]) for c in batch.cu_seqlens)
        trained += int(batch.loss_mask.sum())
        rows += len(batch.cu_seqlens)
        samples += sum(len(k) for k in keys(batch))
    return {"s": time.perf_counter() - t0, "tokens": tokens, "trained": trained, "rows": rows, "samples": samples}


def profile_project(loader, top: int = 20) -> None:
    """cProfile one epoch of the (warm) project loader (``_text_profile.profile_pass``)."""
    _text_profile.profile_pass(lambda: epoch_pass(loader, lambda b: b.sample_keys), "project loader, 0 workers", top)


# ---------------------------------------------------------------------------------------------
def main(argv=None) -> int:
    args, n, rounds = text_path.conversation_args(argv, __doc__.splitlines()[0], 1,
                                                  "interleaved timed rounds after the warm-up (median)",
                                                  "cProfile one project pass with 0 workers")

    C.limit_threads()
    from transformers import AutoTokenizer

    from energon_nemotron.loading import build_train_loader

    t = time.perf_counter()
    dataset = text_path.build_dataset(C.CACHE_DIR / "text_path" / f"n{n}", n)
    tok_dir = tokenizer_dir()
    dataset_s = time.perf_counter() - t

    tok = AutoTokenizer.from_pretrained(str(tok_dir), local_files_only=True)
    texts = [tok.apply_chat_template(msgs, tokenize=False) for _, msgs in text_path.read_conversations(dataset)]
    assert len(texts) == n, (len(texts), n)

    t = time.perf_counter()
    loaders = {}
    for w in WORKERS:
        loaders[f"naive_w{w}"] = (naive_loader(dataset, w), lambda b: [k.split(",") for k in b.__key__])
        loaders[f"project_w{w}"] = (build_train_loader(project_config(dataset, w), repeat=False),
                                    lambda b: b.sample_keys)
    build_s = time.perf_counter() - t

    def floor_pass() -> dict:
        return {"tokens": sum(len(ids) for ids in tok(texts, add_special_tokens=False)["input_ids"])}

    passes = {k: (lambda lk=lk: epoch_pass(*lk)) for k, lk in loaders.items()}
    passes["floor"] = floor_pass

    # Warm-up (untimed): caches, lazy imports, the 2-worker loaders' processes; checks the counts.
    first = {k: fn() for k, fn in passes.items()}
    ref = first["naive_w0"]
    for k, res in first.items():
        if res["tokens"] != ref["tokens"]:
            raise AssertionError(f"{k} counts {res['tokens']} tokens, naive_w0 {ref['tokens']}")
        if k in loaders and (res["samples"] != n or res["trained"] != ref["trained"]):
            raise AssertionError(f"{k}: {res['samples']} samples (of {n}), {res['trained']} trained labels "
                                 f"(naive_w0: {ref['trained']})")
    tokens = ref["tokens"]

    times: dict[str, list[float]] = {k: [] for k in passes}
    for r in range(rounds):
        order = list(passes)[::-1] if r % 2 else list(passes)      # alternate which side runs first
        for k in order:
            t0 = time.perf_counter()
            res = passes[k]()
            times[k].append(time.perf_counter() - t0)
            assert res["tokens"] == tokens, (k, res["tokens"], tokens)
    tps = {k: tokens / C.median(v) for k, v in times.items()}
    floor = tps["floor"]
    vs_naive = {w: tps[f"project_w{w}"] / tps[f"naive_w{w}"] for w in WORKERS}
    per_core = {w: tps[f"project_w{w}"] / max(w, 1) for w in WORKERS}
    vs_floor = {w: per_core[w] / floor for w in WORKERS}
    ratio, floor_ratio = min(vs_naive.values()), min(vs_floor.values())
    bound = floor / tps["naive_w0"]        # a one-core path that only tokenized, as the floor does

    print(f"{'pass':<28}{'tokens/s':>12}{'per core':>12}{'x floor':>9}   rounds (s)")
    for k in passes:
        cores = max(int(k[-1]), 1) if k in loaders else 1
        print(f"{k:<28}{tps[k]:>12,.0f}{tps[k] / cores:>12,.0f}{tps[k] / cores / floor:>9.3f}   "
              + " ".join(f"{x:.3f}" for x in times[k]))
    for w in WORKERS:
        print(f"{w} workers: project / naive {vs_naive[w]:.3f}x (goal {GOAL}x: "
              f"{'met' if vs_naive[w] >= GOAL else 'not met'}); project per core / floor {vs_floor[w]:.3f}x "
              f"(goal {FLOOR_GOAL}x: {'met' if vs_floor[w] >= FLOOR_GOAL else 'not met'})")
    print(f"tokenize-only bound: the floor's tokenization alone is {bound:.3f}x the naive encoder with 0 workers "
          f"(goal {GOAL}x: {'reachable' if bound >= GOAL else 'above what any one-core path can reach here'})")
    machine = scaling.machine_scaling()
    print(f"this machine's own two-process ceiling (pure-Python loop, 2 processes / 1): {machine:.2f}x, so 2 "
          f"workers' per-core figure is at most {machine / 2:.2f}x of one core's; project 2 workers / 0: "
          f"{tps['project_w2'] / tps['project_w0']:.2f}x")
    print(f"floor = tokenizer(texts), one call; {tokens:,} tokens, {ref['trained']:,} trained labels, {first['project_w0']['rows']} "
          f"packs (naive {ref['rows']}); 2 workers: per core = tokens/s / 2; loaders built (untimed) in "
          f"{build_s:.2f} s; dataset ready in {dataset_s:.2f} s")

    if ratio < GOAL or floor_ratio < FLOOR_GOAL:
        print("why not met (README, Performance): the tokenizer already runs at the floor's speed (one call per "
              "packing buffer); what remains is Python per sample (Energon's reading alone is 0.19-0.26x of the "
              "floor's time: text_path's energon_read), and with 2 workers this machine's two-process ceiling "
              f"({machine:.2f}x here) and the L3 cache the workers share; --profile shows the split. What would "
              "remove it: a reader outside Energon's per-sample path (it would have to carry Energon's restore keys), "
              "rendering without Jinja, and for 2 workers cores that do not share one cache")
    if args.profile:
        profile_project(loaders["project_w0"][0])

    C.emit({
        "name": "vs_naive_energon",
        "ratio": round(ratio, 4),
        "goal": GOAL,
        "better": "higher",
        "project_over_naive": {f"workers_{w}": round(vs_naive[w], 4) for w in WORKERS},
        "floor_ratio": round(floor_ratio, 4),
        "floor_goal": FLOOR_GOAL,
        "floor_met": floor_ratio >= FLOOR_GOAL,
        "project_per_core_over_floor": {f"workers_{w}": round(vs_floor[w], 4) for w in WORKERS},
        "tokenize_only_bound": round(bound, 4),
        "tokens_per_s": {k: round(v) for k, v in tps.items()},
        "tokens": tokens,
        "trained_labels": ref["trained"],
        "conversations": n,
        "packs": {"naive": ref["rows"], "project": first["project_w0"]["rows"]},
        "fill": round(tokens / (first["project_w0"]["rows"] * SEQ_LENGTH), 4),
        "seq_length": SEQ_LENGTH,
        "packing_buffer": BUFFER,
        "rounds": rounds,
        "loaders_build_s": round(build_s, 3),
        "cpu_count": os.cpu_count(),
        "machine_ceiling": round(machine, 3),
        "project_w2_over_w0": round(tps["project_w2"] / tps["project_w0"], 4),
        "quick": bool(args.quick),
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
