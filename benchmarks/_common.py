"""Shared helpers of the benchmark scripts: thread limits, the offline Qwen2.5 tokenizer
(``qwen_tokenizer_dir``, built in ``_qwen.py``), synthetic Megatron-LM offline-packed rows, timing
and the one-JSON-line result protocol.

Importing this module sets ``RAYON_NUM_THREADS=1`` and ``TOKENIZERS_PARALLELISM=false`` (before
``tokenizers`` is imported, so they take effect); call :func:`limit_threads` before measuring.
Every number is a per-worker, one-core figure.
"""

from __future__ import annotations

import os

for _k, _v in (("RAYON_NUM_THREADS", "1"), ("TOKENIZERS_PARALLELISM", "false"), ("OMP_NUM_THREADS", "1"),
               ("MKL_NUM_THREADS", "1"), ("OPENBLAS_NUM_THREADS", "1"), ("HF_HUB_OFFLINE", "1")):
    os.environ[_k] = _v

import itertools
import json
import random
import shutil
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Optional

from _qwen import QWEN_PATTERN, QWEN_SPECIALS, qwen_tokenizer_dir  # noqa: F401  (re-exported)

BENCH_DIR = Path(__file__).resolve().parent
RESULTS_DIR = BENCH_DIR / "results"
CACHE_DIR = BENCH_DIR / ".cache"


def limit_threads() -> None:
    """One core per measurement: torch intra-op threads to 1 (the env vars are set at import)."""
    import torch

    torch.set_num_threads(1)


# ---------------------------------------------------------------------------------------------
# Synthetic Megatron-LM offline-packed rows
# ---------------------------------------------------------------------------------------------
_WORDS = """the of and to a in is that for it as was with be by on not he this are or his from at which
but have an they you were her she there been one all we their has would when if so no what up out who
them some into more other time could these two may then do first any my now such like our over man me
even most made after also did many before must through back years where much your way well down should
because each just those people how too little state good very make world still own see men work long
get here between both life being under never day same another know while last might us great old year
off come since against go came right used take three himself few house use during without again place
around however home small found thought went say part once general high upon school every does got
united left number course war until always away something fact though water less public put think
almost hand enough far took head yet government system better set told nothing night end why called
didn't eyes find going look asked later knew point next city business give group toward young days let
room president side social given present several order national possible rather second face per among
form important often things looking large early white case become large need big four within felt
data model training batch token sequence layer gradient loss memory tensor kernel cluster node
parallel pipeline context attention embedding vocabulary checkpoint dataset sample packing length
function variable value return error result config option default version update file path
question answer example explain describe consider approach method problem solution step reason""".split()
_SYLLABLES = ("ba be bi bo bu ca ce ci co cu da de di do du fa fe fi fo ga ge go ha he hi ho ka ke ki ko la "
              "le li lo lu ma me mi mo mu na ne ni no nu pa pe pi po pu ra re ri ro ru sa se si so su ta te "
              "ti to tu va ve vi vo za ze zi zo tion ment ness ing er al ic ous ive str pr tr pl gr").split()


class _TextMaker:
    """English-ish sentences: common words plus a Zipf-distributed long tail of made-up words (so
    the tokenizer's word cache is hit about as often as on real text), digits and punctuation."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        tail = sorted({"".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 4))) for _ in range(30000)})
        rng.shuffle(tail)
        self.tail = tail
        self.tail_cum = list(itertools.accumulate(1.0 / (i + 1) for i in range(len(tail))))

    def word(self) -> str:
        r = self.rng.random()
        if r < 0.78:
            return self.rng.choice(_WORDS)
        if r < 0.97:
            return self.rng.choices(self.tail, cum_weights=self.tail_cum)[0]
        return str(self.rng.randint(0, 10 ** self.rng.randint(1, 5)))

    def text(self, n_words: int) -> str:
        rng, words, out = self.rng, 0, []
        while words < n_words:
            k = min(n_words - words, rng.randint(4, 22))
            ws = [self.word() for _ in range(k)]
            ws[0] = ws[0].capitalize()
            if k > 6 and rng.random() < 0.4:
                ws[rng.randint(1, k - 2)] += ","
            out.append(" ".join(ws) + rng.choice(".....?!:"))
            words += k
            r = rng.random()
            out.append(" " if r > 0.12 else "\n\n" if r > 0.04 else "\n- ")
        return "".join(out[:-1]) + "\n"


def conversation(maker: _TextMaker, system=(8, 60), exchanges=(1, 4), user=(20, 200),
                 assistant=(50, 600)) -> list[dict]:
    """A system prompt and some user/assistant exchanges; each range is (min, max) words (or
    exchanges), drawn uniformly from ``maker``'s generator."""
    rng = maker.rng
    msgs = [{"role": "system", "content": maker.text(rng.randint(*system))}]
    for _ in range(rng.randint(*exchanges)):
        msgs.append({"role": "user", "content": maker.text(rng.randint(*user))})
        msgs.append({"role": "assistant", "content": maker.text(rng.randint(*assistant))})
    return msgs


def realistic_rows(n_rows: int, seed: int = 0, target_tokens: int = 8192,
                   chars_per_token: float = 3.9) -> list[dict]:
    """``n_rows`` deterministic offline-packed rows ``{"messages": [...]}``.

    Each row holds 2–6 conversations (a ``system`` message, then 1–4 user/assistant exchanges);
    conversations are added while the row's estimated size (characters / ``chars_per_token``)
    stays within ``target_tokens``, as an offline packer fills a row. Every content ends with
    ``"\\n"``, so per-turn tokenization concatenates to the whole conversation's.
    """
    rng = random.Random(seed)
    maker = _TextMaker(rng)
    rows = []
    for _ in range(n_rows):
        convs, est = [], 0.0
        while len(convs) < 6:
            conv = conversation(maker)
            size = sum(len(m["content"]) for m in conv) / chars_per_token
            if len(convs) >= 2 and est + size > target_tokens:
                break
            convs.append(conv)
            est += size
        rows.append({"messages": [m for c in convs for m in c]})
    return rows


def cached_prepared_dataset(folder: Path, want: dict, samples: Callable[[], list[tuple[str, dict]]],
                            cooker: str, per_shard: int) -> Path:
    """An ``energon prepare``d dataset in ``folder``, rebuilt only when its ``bench.json`` marker
    differs from ``want``: ``samples()`` gives the ``(key, {extension: bytes})`` pairs written to
    tar shards of ``per_shard`` samples, prepared with ``subflavors.cooker = cooker``."""
    from energon_nemotron.demo.datasets import prepare, write_shards

    marker = folder / "bench.json"
    if (folder / ".nv-meta" / "dataset.yaml").exists() and marker.exists():
        if json.loads(marker.read_text()) == want:
            return folder
    if folder.exists():
        shutil.rmtree(folder)
    write_shards(folder, samples(), per_shard=per_shard)
    prepare(folder, {"cooker": cooker})
    marker.write_text(json.dumps(want))
    return folder


# ---------------------------------------------------------------------------------------------
# Timing and results
# ---------------------------------------------------------------------------------------------
def bench_timer(fn: Callable[[], Any], repeats: int) -> list[float]:
    """Wall seconds of ``repeats`` calls of ``fn`` (``time.perf_counter``)."""
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def median(xs: list[float]) -> float:
    """The median of ``xs``."""
    return float(statistics.median(xs))


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def emit(result: dict, results_dir: Optional[Path] = None, name: Optional[str] = None) -> dict:
    """Print a summary of ``result`` and, as the LAST stdout line, its JSON; save it as
    ``<results_dir>/<name>.json``. ``result`` needs ``ratio``, ``goal`` and ``better``."""
    name = name or result["name"]
    record = {"name": name, "ratio": result["ratio"], "goal": result["goal"], "better": result["better"]}
    record.update({k: v for k, v in result.items() if k not in record})
    ok = record["ratio"] >= record["goal"] if record["better"] == "higher" else record["ratio"] <= record["goal"]
    record["met"] = bool(ok)
    width = max(len(k) for k in record)
    print(f"-- {name} " + "-" * max(0, 60 - len(name)))
    for k, v in record.items():
        print(f"  {k:<{width}}  {_fmt(v)}")
    results_dir = Path(results_dir) if results_dir is not None else RESULTS_DIR
    results_dir.mkdir(parents=True, exist_ok=True)
    line = json.dumps(record, sort_keys=False)
    (results_dir / f"{name}.json").write_text(line + "\n")
    print(line, flush=True)
    return record
