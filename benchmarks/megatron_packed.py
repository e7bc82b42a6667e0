"""Rows/s of ``MegatronSFTPackedEncoder.encode`` against re-tokenizing the same conversations.

Data: synthetic Megatron-LM offline-packed rows (``_common.realistic_rows``, ~7–8k Qwen2.5 tokens
per row), prompt format ``identity``, seq_length 8192, one core.

Three passes over the same rows, interleaved round by round (floor, encode, Megatron-style, floor,
...), median of the rounds:

- floor: per row, split the messages into conversations at ``system`` messages, join each
  conversation's contents (exactly the ``identity`` rendering), tokenize those texts once in one
  Rust call, ``backend_tokenizer.encode_batch_fast(texts, add_special_tokens=False)``, and take the ids;
- encode: ``MegatronSFTPackedEncoder.encode(row, where)`` (tensors, masks, positions, cu_seqlens);
- Megatron-style: what Megatron-LM's ``SFTTokenizer.tokenize_conversation`` does per conversation:
  one ``apply_chat_template`` of the whole conversation plus one per turn, each turn's tokens
  compared with ``np.allclose`` (``return_dict=False``: transformers 5 returns a dict by default).

``ratio`` = encode rows/s ÷ floor rows/s (goal 0.85, higher is better). ``--profile`` also prints
the top cProfile entries of ``encode`` on a few rows.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys

import _common as C

IDENTITY_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
IGNORE_INDEX = -100


def conversation_texts(row: dict) -> list[str]:
    """The ``identity`` rendering of each conversation of a row (split at ``system`` messages)."""
    texts, cur = [], []
    for m in row["messages"]:
        if m["role"] == "system" and cur:
            texts.append("".join(cur))
            cur = []
        cur.append(m["content"])
    if cur:
        texts.append("".join(cur))
    return texts


def megatron_style_row(tok, row: dict, np) -> list:
    """Re-enactment of Megatron-LM ``SFTTokenizer.tokenize_conversation`` over a row's conversations."""
    out, conv = [], []
    convs = []
    for m in row["messages"]:
        if m["role"] == "system" and conv:
            convs.append(conv)
            conv = []
        conv.append(m)
    convs.append(conv)
    for conv in convs:
        tokens = tok.apply_chat_template(conv, tokenize=True, add_generation_prompt=False,
                                         return_tensors="np", chat_template=IDENTITY_TEMPLATE,
                                         return_dict=False)[0]
        target = tokens.copy()
        idx = 0
        for i, turn in enumerate(conv):
            role = turn["role"].lower()
            if role == "assistant":
                if len(turn["content"]) == 0:
                    raise ValueError("empty assistant turn")
                assert conv[i - 1]["role"].lower() in ("user", "tool")
            turn_tokens = tok.apply_chat_template([turn], tokenize=True, chat_template=IDENTITY_TEMPLATE,
                                                  return_dict=False)
            n = len(turn_tokens)
            if role in ("system", "user", "tool"):
                target[idx:idx + n] = IGNORE_INDEX
            assert np.allclose(tokens[idx:idx + n], turn_tokens), "turn tokens differ"
            idx += n
        assert idx == len(tokens)
        out.append((tokens, target))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="few rows and rounds (< 30 s)")
    ap.add_argument("--rows", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=None, help="interleaved rounds (median)")
    ap.add_argument("--seq-length", type=int, default=8192)
    ap.add_argument("--profile", action="store_true", help="cProfile encode on a few rows")
    args = ap.parse_args(argv)
    n_rows = args.rows or (16 if args.quick else 128)
    repeats = args.repeats or 5

    C.limit_threads()
    import numpy as np
    from transformers import AutoTokenizer

    from energon_nemotron.megatron_packed import MegatronSFTPackedEncoder

    tok = AutoTokenizer.from_pretrained(str(C.qwen_tokenizer_dir()), local_files_only=True)
    pad_token = None if tok.get_vocab().get("<unk>") is not None else "<|endoftext|>"
    encoder = MegatronSFTPackedEncoder(tok, args.seq_length, prompt_format="identity", pad_token=pad_token)
    rows = C.realistic_rows(n_rows, seed=0, target_tokens=args.seq_length)
    backend = tok.backend_tokenizer
    wheres = [f"bench.jsonl.packed:{i}" for i in range(n_rows)]

    def floor_pass():
        enc = backend.encode_batch_fast
        for row in rows:
            [e.ids for e in enc(conversation_texts(row), add_special_tokens=False)]

    unmasked = MegatronSFTPackedEncoder(tok, args.seq_length, prompt_format="identity", pad_token=pad_token,
                                        identity_masks_prompt=False)

    def unmasked_pass():
        for row, where in zip(rows, wheres):
            unmasked.encode(row, where)

    def encode_pass():
        for row, where in zip(rows, wheres):
            encoder.encode(row, where)

    def megatron_pass():
        for row in rows:
            megatron_style_row(tok, row, np)

    # Warm-up round, which also checks that the three passes agree on the tokens.
    tokens_per_row, truncated = [], 0
    for row, where in zip(rows, wheres):
        floor_ids = [e.ids for e in backend.encode_batch_fast(conversation_texts(row), add_special_tokens=False)]
        meg = megatron_style_row(tok, row, np)
        if [t.tolist() for t, _ in meg] != floor_ids:
            raise AssertionError(f"{where}: Megatron-style tokens differ from the floor's")
        out = encoder.encode(row, where)
        n = sum(len(x) for x in floor_ids)
        tokens_per_row.append(n)
        truncated += bool(out["truncated"])
        if not out["truncated"] and out["tokens"][:n].tolist() != [i for ids in floor_ids for i in ids]:
            raise AssertionError(f"{where}: encode tokens differ from the floor's")

    times = {"floor": [], "encode": [], "unmasked": [], "megatron": []}
    passes = {"floor": floor_pass, "encode": encode_pass, "unmasked": unmasked_pass, "megatron": megatron_pass}
    for _ in range(repeats):
        for k, fn in passes.items():
            times[k] += C.bench_timer(fn, 1)
    rps = {k: n_rows / C.median(v) for k, v in times.items()}

    print(f"{'pass':<16}{'rows/s':>10}{'ms/row':>10}{'x floor':>9}   rounds (s)")
    for k in passes:
        print(f"{k:<16}{rps[k]:>10.2f}{1000 / rps[k]:>10.2f}{rps[k] / rps['floor']:>9.3f}   "
              + " ".join(f"{t:.3f}" for t in times[k]))

    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        for row, where in zip(rows[:8], wheres):
            encoder.encode(row, where)
        prof.disable()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(15)
        print(s.getvalue())

    mean_tokens = float(np.mean(tokens_per_row))
    C.emit({
        "name": "megatron_packed",
        "ratio": round(rps["encode"] / rps["floor"], 4),
        "goal": 0.85,
        "better": "higher",
        "rows": n_rows,
        "repeats": repeats,
        "seq_length": args.seq_length,
        "prompt_format": "identity",
        "pad_id": encoder.pad_id,
        "tokens_per_row_mean": round(mean_tokens, 1),
        "truncated_rows": truncated,
        "encode_rows_per_s": round(rps["encode"], 3),
        "floor_rows_per_s": round(rps["floor"], 3),
        "unmasked_identity_rows_per_s": round(rps["unmasked"], 3),
        "unmasked_identity_ratio": round(rps["unmasked"] / rps["floor"], 4),
        "megatron_style_rows_per_s": round(rps["megatron"], 3),
        "megatron_style_ratio": round(rps["megatron"] / rps["floor"], 4),
        "floor_tokens_per_s": round(rps["floor"] * mean_tokens),
        "quick": bool(args.quick),
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
