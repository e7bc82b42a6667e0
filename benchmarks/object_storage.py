"""Throughput of the loader reading its shards from object storage (``msc://``) against reading the
same shards from local disk, side by side in one run (issue 47, goal ≥ 0.8× local).

The store is moto's S3-compatible server, started by this script on 127.0.0.1 (``tests/object_store.py``:
the server and the multi-storage-client profile the tests use), on this machine: its CPU time
competes with the loader's two workers for the same cores, which a production store, elsewhere,
does not. Each side is one ``build_train_loader`` (2 workers, built once before any clock starts,
one untimed warm-up epoch), then epochs alternating local/msc, median of the rounds:

- text: ``text_path``'s conversations and shards (2,000; ``--quick``: 300), the same encoder
  (``nemotron6``, best-fit-decreasing, buffer 256, seq_length 8192). Tokens must be equal, and every
  batch of the two sides bit-for-bit equal in the warm-up epoch (checked).

- media: ``scaling``'s 200 JPEGs of 1024×768 (``--quick``: 60) as an ``aux:`` source (a prepared
  dataset, local or on the store) of a local JSONL of one-image ``general_conversations`` rows, read
  with ``loader.cache_pool`` set; the first epoch is the untimed warm-up, so ``media_ratio`` is the
  epochs after it. In the first epoch each image is one ranged GET of its bytes (from the index),
  shared by the plan's header read and the pack's decode; the loader keeps it in its entry cache
  under the pool's folder (``cookers.remote_entries``), so the later epochs read it from local disk
  (one file an image) while the local side reads it through Energon's store of the prepared dataset.

The CPU seconds moto's server spends in a timed msc epoch (``*_server_cpu_s``) are what the
store costs on the workers' own cores.

``ratio`` = msc tokens/s ÷ local tokens/s (text); ``media_ratio`` the same for the images
(``media_met``: ≥ 0.8). Also reports
the seconds of each side and the load average.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")

import _common as C  # noqa: E402
import scaling as SC  # noqa: E402
import text_path as T  # noqa: E402

sys.path.insert(0, str(C.BENCH_DIR.parent / "tests"))
import object_store as S  # noqa: E402
from conftest import free_port  # noqa: E402  (a port on 127.0.0.1 nothing listens on)

GOAL = 0.8


def epoch(loader) -> dict:
    """One pass over ``loader``: seconds, real tokens, samples, and the batches."""
    t = time.perf_counter()
    batches = list(loader)
    return {"s": time.perf_counter() - t, "tokens": sum(int(c[-1]) for b in batches for c in b.cu_seqlens),
            "samples": sum(len(k) for b in batches for k in b.sample_keys), "batches": batches}


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def compare(loaders: dict, rounds: int, server: int) -> dict:
    """Warm-up epoch (checked bit for bit), then ``rounds`` timed epochs alternating the sides;
    also the CPU seconds the store's server (pid ``server``) spends in a timed msc epoch."""
    from energon_nemotron.parallel.broadcast import batches_equal

    first = {k: epoch(v) for k, v in loaders.items()}
    a, b = first["local"], first["msc"]
    if a["tokens"] != b["tokens"] or len(a["batches"]) != len(b["batches"]) or not all(
            batches_equal(x, y) for x, y in zip(a["batches"], b["batches"])):
        raise AssertionError("the batches read from msc:// differ from those read from local disk")
    times: dict[str, list[float]] = {"local": [], "msc": []}
    server_cpu = []
    for r in range(rounds):
        for side in (("local", "msc") if r % 2 == 0 else ("msc", "local")):
            before = cpu_seconds(server)
            times[side].append(epoch(loaders[side])["s"])
            if side == "msc":
                server_cpu.append(cpu_seconds(server) - before)
    out = {f"{k}_s": C.median(v) for k, v in times.items()}
    out.update(tokens=a["tokens"], samples=a["samples"], ratio=out["local_s"] / out["msc_s"],
               server_cpu_s=C.median(server_cpu))
    return out


def media_sources(aux: Path, folder: Path) -> Path:
    """A local JSONL naming each image of the prepared dataset ``aux`` by its member name
    (``KEY.jpg``), prepared; the rows' conversations are those of ``aux``'s samples."""
    import json
    import tarfile

    from energon_nemotron.demo.datasets import energon

    rows = []
    for shard in sorted((aux / "parts").glob("*.tar"), key=lambda p: int(p.stem.split("-")[1])):
        with tarfile.open(shard) as tf:
            for member in tf:
                if member.name.endswith(".json"):
                    turns = json.loads(tf.extractfile(member).read())["conversations"]
                    rows.append({"conversations": turns, "image": member.name[:-len(".json")] + ".jpg"})
    folder.mkdir(parents=True, exist_ok=True)
    jsonl = folder / "rows.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    energon("prepare", str(jsonl))
    return jsonl


def media_mix(jsonl: Path, aux: str, out: Path) -> Path:
    """A metadataset: ``jsonl`` with the aux source ``media`` = ``aux`` (a path or a URL)."""
    import yaml

    out.write_text(yaml.safe_dump({"__module__": "megatron.energon", "__class__": "MetadatasetV2", "splits": {
        "train": {"path": str(jsonl), "aux": {"media": aux}, "subflavors": {"cooker": "general_conversations"}}}}))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="300 conversations instead of 2,000")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    n = 300 if args.quick else 2000

    C.limit_threads()
    from energon_nemotron.loading import build_train_loader

    dataset = T.build_dataset(C.CACHE_DIR / "text_path" / f"n{n}", n)
    with tempfile.TemporaryDirectory() as tmp:
        store = S.ObjectStore.start(Path(tmp), free_port(), free_port(), free_port(), free_port())
        try:
            os.environ["MSC_CONFIG"] = str(store.config)
            t = time.perf_counter()
            url = store.upload(dataset, f"bench/{dataset.name}")
            upload_s = time.perf_counter() - t
            loaders = {}
            for side, path in (("local", str(dataset)), ("msc", url)):
                cfg = T.loader_config(Path(path))
                cfg["data"]["train"]["path"] = path
                cfg["loader"]["num_workers"] = 2
                loaders[side] = build_train_loader(cfg, repeat=False)
            text = compare(loaders, args.rounds, store.procs[0].pid)
            del loaders

            images = 60 if args.quick else SC.SAMPLES
            aux = SC.build_dataset(C.CACHE_DIR / "scaling" / f"n{images}", images)
            jsonl = media_sources(aux, Path(tmp) / "media")
            aux_url = store.upload(aux, f"bench/media/{aux.name}")
            loaders = {}
            for side, where in (("local", str(aux)), ("msc", aux_url)):
                cfg = SC.loader_config(str(media_mix(jsonl, where, Path(tmp) / f"{side}.yaml")), 2)
                cfg["loader"]["cache_pool"] = {"directory": str(Path(tmp) / f"pool-{side}")}
                loaders[side] = build_train_loader(cfg, repeat=False)
            media = compare(loaders, args.rounds, store.procs[0].pid)
            del loaders
        finally:
            store.stop()
    C.emit({"name": "object_storage", "ratio": text["ratio"], "goal": GOAL, "better": "higher",
            "text_local_s": text["local_s"], "text_msc_s": text["msc_s"],
            "text_local_tokens_per_s": text["tokens"] / text["local_s"],
            "text_msc_tokens_per_s": text["tokens"] / text["msc_s"], "conversations": n,
            "shards": len(list(dataset.rglob("*.tar"))), "upload_s": upload_s,
            "media_ratio": media["ratio"], "media_goal": GOAL, "media_met": media["ratio"] >= GOAL, "media_local_s": media["local_s"],
            "media_msc_s": media["msc_s"], "media_images": media["samples"], "rounds": args.rounds,
            "text_server_cpu_s": text["server_cpu_s"], "media_server_cpu_s": media["server_cpu_s"],
            "workers": 2, "loadavg_1min": os.getloadavg()[0]})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
