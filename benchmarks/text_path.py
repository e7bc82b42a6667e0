"""Tokens/s of the whole Energon text path (one worker) against plain Hugging Face tokenization.

Data: about 2,000 synthetic conversations (a system prompt, then 1–4 user/assistant exchanges,
about 300–2,000 Qwen2.5 tokens each; the sentence maker of ``_common``), written once as
WebDataset shards of ``{"messages": [...]}`` JSON members, prepared with the real ``energon prepare``
(``subflavors.cooker: openai_messages``) and cached in ``benchmarks/.cache/text_path/``.

Three passes over the same conversations, interleaved round by round, median of the rounds:

- path: one ``build_train_loader`` (``repeat=False``, ``num_workers=0``, so the one worker is this
  process; no shuffle buffer), built once before any clock starts (about 1 s: tokenizer load,
  dataset index) and iterated to the end of its epoch each round: crude WebDataset sample →
  ``openai_messages`` cooker → ``nemotron6`` rendering → tokenization with offsets and trained
  spans → best-fit-decreasing packing (buffer 256, seq_length 8192) → ``PackedBatch``.
- floor: the very texts the path tokenizes (rendered once beforehand with
  ``ConversationTokenizer(tok, "nemotron6").render``, not timed), tokenized by the Hugging Face
  tokenizer's ``__call__`` with ``add_special_tokens=False``. Three plain variants run every round:
  one text per call, a list of 256 texts per call (one packing buffer) and the whole list in one
  call; the floor is the variant with the best median (the best plain way, whichever it is).
- energon_read: Energon alone reading the same samples (``energon_read_loader``: the same dataset
  and loader calls, a cooker that returns the crude sample, no encoding, no batching). It bounds
  what any path over Energon can reach: ``ceiling`` = floor s ÷ (floor s + read s), a path that
  did nothing but Energon's reading and the floor's tokenization.

Tokens are the real (non-pad) tokens of the packed batches (the sum of ``cu_seqlens[-1]``); they
must equal the floor's token count (checked). ``ratio`` = path tokens/s ÷ floor tokens/s (goal
0.90, higher is better); ``share_of_ceiling`` = ratio ÷ ceiling. ``--profile`` prints the top
cProfile entries (by own time) of one path pass (one epoch of the already built loader).

The tokenizer is Qwen2.5's plus ``<think>``/``</think>`` as added tokens (see ``tokenizer_dir``).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import random
import shutil
import sys
import tarfile
import time
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")      # Energon's "Filling reading buffer" progress bar

import _common as C  # noqa: E402

GOAL = 0.90
SEQ_LENGTH = 8192
BUFFER = 256
DATA_VERSION = 1            # bump when the generator changes: the cached dataset is rebuilt
CHARS_MIN, CHARS_MAX = 300 * 4, 2000 * 4      # ~4 characters per Qwen2.5 token on this text


def make_conversation(maker: "C._TextMaker") -> list[dict]:
    """System prompt, 1–4 exchanges; contents without trailing newlines (as real chat data)."""
    rng = maker.rng
    while True:
        msgs = [{"role": "system", "content": maker.text(rng.randint(8, 60)).rstrip("\n")}]
        for _ in range(rng.randint(1, 4)):
            msgs.append({"role": "user", "content": maker.text(rng.randint(15, 150)).rstrip("\n")})
            msgs.append({"role": "assistant", "content": maker.text(rng.randint(40, 400)).rstrip("\n")})
        if CHARS_MIN <= sum(len(m["content"]) for m in msgs) <= CHARS_MAX:
            return msgs


def build_dataset(folder: Path, n: int, seed: int = 0) -> Path:
    """The prepared dataset of ``n`` conversations, reused when its marker matches."""
    def samples() -> list[tuple[str, dict]]:
        maker = C._TextMaker(random.Random(seed))
        return [(f"conv{i:06d}", {"json": json.dumps({"messages": make_conversation(maker)}).encode()})
                for i in range(n)]

    want = {"conversations": n, "seed": seed, "version": DATA_VERSION}
    return C.cached_prepared_dataset(folder, want, samples, "openai_messages", per_shard=250)


def read_conversations(folder: Path) -> list[tuple[str, list[dict]]]:
    """(key, messages) of every sample of the shards, read back from the tar files."""
    out = []
    for shard in sorted((folder / "parts").glob("*.tar")):
        with tarfile.open(shard) as tf:
            for member in tf:
                if member.name.endswith(".json"):
                    key = member.name[: -len(".json")]
                    out.append((key, json.loads(tf.extractfile(member).read())["messages"]))
    return out


def tokenizer_dir() -> Path:
    """The Qwen2.5 tokenizer plus ``<think>`` and ``</think>`` as added (non-special) tokens, as the
    Qwen3 and Nemotron tokenizers have them; cached in ``benchmarks/.cache/text_path/tokenizer``.

    Without them ``nemotron6`` rejects most samples, and rightly: Qwen2.5's pre-tokenizer merges
    ``>`` with a following letter (``</think>Hello`` → ``...>``, ``Hello`` is not a split), so the
    trained span starting right after ``</think>`` would begin inside a token."""
    out = C.CACHE_DIR / "text_path" / "tokenizer"
    if (out / "tokenizer.json").exists():
        return out
    from transformers import AddedToken, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(C.qwen_tokenizer_dir()), local_files_only=True)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ("<think>", "</think>")])
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tok.save_pretrained(str(tmp))
    tmp.rename(out)
    return out


def energon_read_loader(dataset: Path):
    """Energon alone on the same dataset: the same ``get_train_dataset`` + ``get_savable_loader``
    (one worker in this process, no shuffle buffer), with a task encoder whose cooker returns the
    crude sample as it is (its ``json`` member already decoded by Energon) and no batching. What a
    pass over it costs, every path built on Energon's reader pays before any encoding."""
    from megatron.energon import (Cooker, DefaultTaskEncoder, WorkerConfig, get_savable_loader,
                                  get_train_dataset, stateless)

    @stateless
    def as_is(sample: dict, **aux) -> dict:
        return sample

    class ReadOnly(DefaultTaskEncoder):
        cookers = [Cooker(as_is)]

        def encode_sample(self, sample: dict) -> dict:
            return sample

    dataset = get_train_dataset(str(dataset), batch_size=None, task_encoder=ReadOnly(), repeat=False,
                                worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
                                shuffle_buffer_size=None, max_samples_per_sequence=None)
    return get_savable_loader(dataset, gc_collect_every_n_steps=0, watchdog_timeout_seconds=None)


def loader_config(dataset: Path) -> dict:
    return {"tokenizer": str(tokenizer_dir()),
            "task_encoder": {"name": "nemotron_multimodal",
                             "options": {"prompt_format": "nemotron6", "seq_length": SEQ_LENGTH}},
            "packing": {"algorithm": "best_fit_decreasing", "buffer_size": BUFFER, "pad_multiple": 1},
            "data": {"train": {"path": str(dataset)}},
            "loader": {"batch_size": 1, "num_workers": 0, "shuffle_buffer_size": None, "seed": 0}}


def conversation_args(argv, description: str, rounds: int, rounds_help: str, profile_help: str):
    """``(args, conversations, rounds)`` of a benchmark over this script's conversations: ``--quick``
    (300 instead of 2,000), ``--conversations``, ``--rounds`` (default ``rounds``), ``--profile``."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--quick", action="store_true", help="300 conversations instead of 2,000")
    ap.add_argument("--conversations", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=None, help=rounds_help)
    ap.add_argument("--profile", action="store_true", help=profile_help)
    args = ap.parse_args(argv)
    return args, args.conversations or (300 if args.quick else 2000), args.rounds or rounds


def main(argv=None) -> int:
    args, n, rounds = conversation_args(argv, __doc__.splitlines()[0], 3, "interleaved rounds (median)",
                                        "cProfile one path pass (top 15 by tottime)")

    C.limit_threads()
    from energon_nemotron.loading import build_train_loader
    from energon_nemotron.tokenization import ConversationTokenizer
    from energon_nemotron.tokenization import load_tokenizer
    from energon_nemotron.types import Message

    t = time.perf_counter()
    dataset = build_dataset(C.CACHE_DIR / "text_path" / f"n{n}", n)
    dataset_s = time.perf_counter() - t

    # The floor's texts: exactly what the path renders (untimed).
    tok = load_tokenizer(str(tokenizer_dir()))
    renderer = ConversationTokenizer(tok, "nemotron6")
    convs = read_conversations(dataset)
    texts = [renderer.render([Message(m["role"], [m["content"]]) for m in msgs], key).text for key, msgs in convs]
    assert len(texts) == n, (len(texts), n)

    # One loader for every pass: built once (untimed), then iterated epoch after epoch, as a
    # training worker keeps its task encoder (and its tokenizer's warm word cache) for the run.
    t = time.perf_counter()
    loader = build_train_loader(loader_config(dataset), repeat=False)
    build_s = time.perf_counter() - t
    reader = energon_read_loader(dataset)

    def path_pass() -> dict:
        t0 = time.perf_counter()
        tokens = rows = samples = 0
        for batch in loader:
            tokens += sum(int(c[-1]) for c in batch.cu_seqlens)
            rows += batch.batch_size
            samples += sum(len(k) for k in batch.sample_keys)
        return {"s": time.perf_counter() - t0, "tokens": tokens, "rows": rows, "samples": samples}

    def floor_one() -> int:
        return sum(len(tok(x, add_special_tokens=False)["input_ids"]) for x in texts)

    def floor_buffer() -> int:
        return sum(len(ids) for i in range(0, len(texts), BUFFER)
                   for ids in tok(texts[i:i + BUFFER], add_special_tokens=False)["input_ids"])

    def floor_all() -> int:
        return sum(len(ids) for ids in tok(texts, add_special_tokens=False)["input_ids"])

    floors = {"one_text_per_call": floor_one, "list_of_256_per_call": floor_buffer, "whole_list_one_call": floor_all}

    def read_pass() -> int:
        return sum(1 for _ in reader)

    # Warm-up round (caches, lazy imports), which also checks the token counts agree.
    first = path_pass()
    if first["samples"] != n:
        raise AssertionError(f"the path packed {first['samples']} samples, the dataset has {n}")
    for name, fn in floors.items():
        got = fn()
        if got != first["tokens"]:
            raise AssertionError(f"floor {name} counts {got} tokens, the path's batches hold {first['tokens']}")
    tokens = first["tokens"]
    if read_pass() != n:
        raise AssertionError("Energon's read-only pass did not yield every sample once")

    times: dict[str, list[float]] = {"path": [], **{k: [] for k in floors}, "energon_read": []}
    for r in range(rounds):
        order = list(floors) + ["energon_read", "path"]
        if r % 2:
            order.reverse()                  # alternate which side runs first
        for k in order:
            if k == "path":
                res = path_pass()
                assert res["tokens"] == tokens
                times["path"].append(res["s"])
            elif k == "energon_read":
                times[k] += C.bench_timer(read_pass, 1)
            else:
                times[k] += C.bench_timer(floors[k], 1)
    tps = {k: tokens / C.median(v) for k, v in times.items()}
    best_floor = max(floors, key=lambda k: tps[k])
    floor_s, read_s = C.median(times[best_floor]), C.median(times["energon_read"])
    ceiling = floor_s / (floor_s + read_s)      # a path that only read (Energon) and tokenized (floor)
    ratio = tps["path"] / tps[best_floor]

    print(f"{'pass':<24}{'tokens/s':>12}{'x floor':>9}   rounds (s)")
    for k in times:
        if k != "energon_read":
            print(f"{k:<24}{tps[k]:>12,.0f}{tps[k] / tps[best_floor]:>9.3f}   " + " ".join(f"{x:.3f}" for x in times[k]))
    print(f"energon_read (no encoding) {read_s:.3f} s = {read_s / floor_s:.2f}x the floor's time: any path over "
          f"Energon's reader stays under {ceiling:.3f}x; this one reaches {ratio / ceiling:.0%} of that")
    print(f"floor = {best_floor}; loader build (once, untimed) {build_s:.3f} s; "
          f"dataset ready in {dataset_s:.2f} s")

    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        path_pass()
        prof.disable()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(15)
        print(s.getvalue())

    C.emit({
        "name": "text_path",
        "ratio": round(ratio, 4),
        "goal": GOAL,
        "better": "higher",
        "tokens": tokens,
        "conversations": n,
        "path_tokens_per_s": round(tps["path"]),
        "floor_tokens_per_s": round(tps[best_floor]),
        "floor_variant": best_floor,
        "floor_variants_tokens_per_s": {k: round(tps[k]) for k in floors},
        "energon_read_s": round(read_s, 3),
        "floor_s": round(floor_s, 3),
        "ceiling_with_energon_read": round(ceiling, 4),
        "share_of_ceiling": round(ratio / ceiling, 4),
        "fill": round(tokens / (first["rows"] * SEQ_LENGTH), 4),
        "packed_rows": first["rows"],
        "tokens_per_conversation_mean": round(tokens / n, 1),
        "seq_length": SEQ_LENGTH,
        "packing_buffer": BUFFER,
        "rounds": rounds,
        "loader_build_s": round(build_s, 3),
        "quick": bool(args.quick),
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
