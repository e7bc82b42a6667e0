"""The bad-input corpus: one crude sample (or JSONL line) per class of broken input, each with the
reason code the loader must report for it. Everything is generated here; nothing is shipped."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

from energon_nemotron.demo.datasets import prepare, write_shards
from energon_nemotron.demo.media import make_audio, make_image, make_video


def bomb_png(width: int = 30000, height: int = 30000) -> bytes:
    """A tiny PNG whose header claims ``width`` × ``height`` pixels (a decompression bomb)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00" * 16)) + chunk(b"IEND", b"")


def conv(user: str, answer: str = "Fine.") -> bytes:
    return json.dumps({"conversations": [{"from": "human", "value": user}, {"from": "gpt", "value": answer}]}).encode()


def decode_time_bad_jpeg(seed: int) -> bytes:
    """A JPEG cut to a third: its header (size) reads, so the sample is planned and packed; decoding
    it fails (``corrupt_media`` at decode time, after packing)."""
    data = make_image(200, 150, seed=seed)
    return data[:len(data) // 3]


#: a 2 KB sample nested 1001 levels deep (``json.loads`` of it is a RecursionError)
DEEP_JSON = b'{"conversations": ' + b"[" * 1000 + b"]" * 1000 + b"}"


#: a JSONL line with a raw NUL byte inside a string (not the ``\u0000`` escape)
RAW_NUL_LINE = '{"conversations": [{"from": "human", "value": "a\x00b"}, {"from": "gpt", "value": "x"}]}'


def good(i: int) -> tuple[str, dict]:
    return f"good-{i:02d}", {"json": conv(f"Question {i}?", f"Answer {i}.")}


#: key -> (members, expected reason code) for the main WebDataset (cooker general_conversations)
WDS_BAD = {
    "corrupt-jpeg": ({"json": conv("<image> what?"), "jpg": b"\xff\xd8\xff\xe0 not really a jpeg"}, "corrupt_media"),
    "truncated-mp4": ({"json": conv("<video> what?"), "mp4": make_video(96, 64, 2.0, 8)[:700]}, "corrupt_media"),
    "empty-wav": ({"json": conv("<audio> what?"), "wav": b""}, "corrupt_media"),
    "missing-member": ({"json": conv("<image> what?")}, "media_reference"),
    "never-referenced": ({"json": conv("<image> what?"), "0.jpg": make_image(64, 48), "1.jpg": make_image(64, 48, 1)},
                         "media_reference"),
    "unknown-role": ({"json": json.dumps({"conversations": [{"from": "narrator", "value": "x"},
                                                             {"from": "gpt", "value": "y"}]}).encode()}, "unknown_role"),
    "empty-assistant": ({"json": conv("Hello?", "   ")}, "empty_assistant"),
    "over-length": ({"json": conv("tell me " * 3000)}, "over_length"),
    "reserved-tag": ({"json": conv("Say <so_embedding> now")}, "reserved_tag"),
    "invalid-json": ({"json": b'{"conversations": [oops'}, "invalid_json"),
    "invalid-utf8": ({"json": b'{"conversations": "\xff\xfe"}'}, "invalid_utf8"),
    "bomb-png": ({"json": conv("<image> what?"), "png": bomb_png()}, "media_too_large"),
    "reserved-in-system": ({"json": json.dumps({"conversations": [
        {"from": "system", "value": "Answer <so_embedding> briefly."}, {"from": "human", "value": "Hi?"},
        {"from": "gpt", "value": "Hello."}]}).encode()}, "reserved_tag"),
    "json-too-deep": ({"json": DEEP_JSON}, "json_too_deep"),
    "lone-surrogate": ({"json": conv("broken \ud800 pair")}, "lone_surrogate"),
    "nul-character": ({"json": conv("a NUL \x00 inside")}, "nul_character"),
    "nul-byte": ({"json": conv("raw NUL here").replace(b"NUL", b"\x00")}, "nul_character"),
    "path-too-long": ({"json": json.dumps({"conversations": [{"from": "human", "value": "<image> what?"},
                                                             {"from": "gpt", "value": "x"}],
                                           "image": "a" * 5000 + ".jpg"}).encode()}, "path_too_long"),
}
#: a dataset read with subflavor skip_chat_template: its only assistant text is the first token;
#: two untrained turns whose concatenated texts spell ``<image>`` (no single text holds the tag)
PREFORMATTED_BAD = {"no-trainable": ({"json": json.dumps({"conversations": [
    {"from": "gpt", "value": "A"}, {"from": "human", "value": " question that follows"}]}).encode()},
    "no_trainable_tokens"),
    "reserved-across-turns": ({"json": json.dumps({"conversations": [
        {"from": "human", "value": "Look: <ima"}, {"from": "human", "value": "ge> what is it?"},
        {"from": "gpt", "value": " A cat."}]}).encode()}, "reserved_tag")}
#: an openai_messages dataset: placeholder tags in a reasoning trace and in a tool result
OPENAI_BAD = {"reserved-in-reasoning": ({"json": json.dumps({"messages": [
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "4.", "reasoning_content": "Add them <image> up."}]}).encode()}, "reserved_tag"),
    "reserved-in-tool": ({"json": json.dumps({"messages": [
        {"role": "user", "content": "Weather?"}, {"role": "tool", "content": "sunny <so_start>"},
        {"role": "assistant", "content": "Sunny."}]}).encode()}, "reserved_tag")}
#: a nemotron_conversation dataset: the same member referenced twice
TWICE_BAD = {"referenced-twice": ({"json": json.dumps({"conversation": [
    {"sender": "user", "fragments": [{"t": "image", "value": "jpg"}, {"t": "image", "value": "jpg"}]},
    {"sender": "assistant", "fragments": ["ok"]}]}).encode(), "jpg": make_image(64, 48)}, "media_reference")}
#: JSONL lines (keys are line indices): a path escaping the dataset folder, and invalid JSON
JSONL_BAD = {1: ({"conversations": [{"from": "human", "value": "<image> hi"}, {"from": "gpt", "value": "x"}],
                  "image": "../outside.jpg"}, "path_escape"),
             2: ('{"conversations": }', "invalid_json"),
             3: (DEEP_JSON.decode(), "json_too_deep"),
             4: ({"conversations": [{"from": "human", "value": "x"}, {"from": "gpt", "value": "half \udc00"}]},
                 "lone_surrogate"),
             5: ({"conversations": [{"from": "human", "value": "nul\x00"}, {"from": "gpt", "value": "x"}]},
                 "nul_character"),
             6: ({"conversations": [{"from": "human", "value": "<image> hi"}, {"from": "gpt", "value": "x"}],
                  "image": "dir/" + "b" * 300 + ".jpg"}, "path_too_long"),
             7: (RAW_NUL_LINE, "nul_character")}

ALL_CODES = [code for _, code in (*WDS_BAD.values(), *PREFORMATTED_BAD.values(), *TWICE_BAD.values(),
                                  *OPENAI_BAD.values(), *JSONL_BAD.values())]


def build_corpus(root: Path, goods: int = 3) -> tuple[Path, int]:
    """Five prepared datasets and a metadataset blending them once each; returns
    (metadataset path, number of good samples)."""
    write_shards(root / "wds", [good(i) for i in range(goods)] + [(k, m) for k, (m, _) in WDS_BAD.items()], 6)
    prepare(root / "wds", {"cooker": "general_conversations"})
    write_shards(root / "pre", [good(100)] + [(k, m) for k, (m, _) in PREFORMATTED_BAD.items()], 6)
    prepare(root / "pre", {"cooker": "general_conversations"})
    nemotron_good = ("good-200", {"json": json.dumps({"conversation": [
        {"sender": "user", "fragments": ["Hi?"]}, {"sender": "assistant", "fragments": ["Hello."]}]}).encode()})
    write_shards(root / "twice", [nemotron_good] + [(k, m) for k, (m, _) in TWICE_BAD.items()], 6)
    prepare(root / "twice", {"cooker": "nemotron_conversation"})
    openai_good = ("good-300", {"json": json.dumps({"messages": [
        {"role": "user", "content": "Hi?"},
        {"role": "assistant", "content": "Hello.", "reasoning_content": "A greeting."}]}).encode()})
    write_shards(root / "openai", [openai_good] + [(k, m) for k, (m, _) in OPENAI_BAD.items()], 6)
    prepare(root / "openai", {"cooker": "openai_messages"})
    (root / "outside.jpg").write_bytes(make_image(32, 32))
    (root / "jsonl").mkdir()
    lines = [json.dumps({"conversations": [{"from": "human", "value": "fine?"}, {"from": "gpt", "value": "yes"}]})]
    lines += [v if isinstance(v, str) else json.dumps(v) for _, (v, _) in sorted(JSONL_BAD.items())]
    (root / "jsonl" / "chat.jsonl").write_text("\n".join(lines) + "\n")
    from energon_data import energon

    energon("prepare", str(root / "jsonl" / "chat.jsonl"))
    (root / "mix.yaml").write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend_epochized:\n"
        "      - {repetitions: 1, path: wds}\n"
        "      - {repetitions: 1, path: pre, subflavors: {cooker: general_conversations, skip_chat_template: true}}\n"
        "      - {repetitions: 1, path: twice}\n"
        "      - {repetitions: 1, path: openai}\n"
        "      - {repetitions: 1, path: jsonl/chat.jsonl, subflavors: {cooker: general_conversations}}\n")
    return root / "mix.yaml", goods + 4


__all__ = ["ALL_CODES", "DEEP_JSON", "JSONL_BAD", "OPENAI_BAD", "PREFORMATTED_BAD", "RAW_NUL_LINE", "TWICE_BAD",
           "WDS_BAD", "build_corpus", "make_audio"]


# --- damaged prepared datasets (issue 14, items 6 and 10): generators applied to a copy of a real
# prepared dataset (write_shards + prepare)

#: how a shard or its index is damaged -> a phrase the error must contain
SHARD_DAMAGE = {
    "delete": "the shard is missing",
    "truncate": "the shard is truncated",
    "zero": "the shard is empty",
    "delete_idx": "is missing",
    "garbage_idx": "is damaged",
}


def index_offsets(shard: Path) -> list[int]:
    """The byte offsets in a shard's ``.tar.idx`` (each sample's start, then the samples' end)."""
    data = shard.with_name(shard.name + ".idx").read_bytes()
    return [int.from_bytes(data[i:i + 8], "little") for i in range(0, len(data), 8)]


def damage_shard(shard: Path, how: str) -> None:
    """Damage a prepared shard in place: ``delete``, ``truncate`` (cut inside its samples), ``zero``
    (0 bytes), ``garbage_header`` (512 bytes of garbage over the tar header of its middle sample),
    ``delete_idx`` or ``garbage_idx`` (its ``.tar.idx`` overwritten with as many garbage bytes)."""
    import random

    idx = shard.with_name(shard.name + ".idx")
    garbage = random.Random(14).randbytes
    if how == "delete":
        shard.unlink()
    elif how == "truncate":
        shard.write_bytes(shard.read_bytes()[:index_offsets(shard)[-1] // 2])
    elif how == "zero":
        shard.write_bytes(b"")
    elif how == "garbage_header":
        offsets = index_offsets(shard)
        at = offsets[(len(offsets) - 1) // 2]
        data = bytearray(shard.read_bytes())
        data[at:at + 512] = garbage(512)
        shard.write_bytes(bytes(data))
    elif how == "delete_idx":
        idx.unlink()
    elif how == "garbage_idx":
        idx.write_bytes(garbage(idx.stat().st_size))
    else:
        raise ValueError(how)


def change_count(dataset: Path, shard_name: str, delta: int) -> None:
    """Raise (``delta`` > 0) or lower a shard's sample count in ``.nv-meta/.info.json``."""
    info = dataset / ".nv-meta" / ".info.json"
    data = json.loads(info.read_text())
    data["shard_counts"][shard_name] += delta
    info.write_text(json.dumps(data))


# --- skip limits (issue 14, item 12): datasets where many or all samples fail

#: a crude sample whose JSON does not parse (``invalid_json``), and one that parses but has no turns
INVALID_JSON = b'{"conversations": [oops'
EMPTY_CONVERSATION = b'{"conversations": []}'


def skip_dataset(folder: Path, is_bad, n: int = 400, per_shard: int = 50) -> Path:
    """A prepared text dataset (cooker ``general_conversations``) of ``n`` samples in shards of
    ``per_shard``: sample ``i`` fails with ``invalid_json`` where ``is_bad(i)``, else it is good
    (``good(i)``). ``energon prepare`` parses the JSON of the first two samples, so those two, where
    bad, are an empty conversation (``invalid_sample``) instead."""
    samples = [good(i) if not is_bad(i) else (f"bad-{i:03d}", {"json": EMPTY_CONVERSATION if i < 2 else INVALID_JSON})
               for i in range(n)]
    write_shards(folder, samples, per_shard)
    return prepare(folder, {"cooker": "general_conversations"})


def decode_time_bad_dataset(folder: Path, n: int = 250, per_shard: int = 50) -> Path:
    """A prepared dataset whose every sample has a JPEG that fails only when decoded, after packing
    (``decode_time_bad_jpeg``)."""
    jpg = decode_time_bad_jpeg(0)
    samples = [(f"late-{i:03d}", {"json": conv("<image> what?"), "jpg": jpg}) for i in range(n)]
    write_shards(folder, samples, per_shard)
    return prepare(folder, {"cooker": "general_conversations"})


def skip_rows(path: Path, is_bad, n: int = 400) -> Path:
    """A ``.jsonl.packed`` file of ``n`` rows of one conversation each (system first); row ``i`` is
    invalid JSON where ``is_bad(i)``."""
    from energon_nemotron.demo.conversations import make_conversations
    from energon_nemotron.demo.datasets import with_system

    convs = make_conversations(n, seed=12)
    with open(path, "w", encoding="utf-8") as f:
        for i, c in enumerate(convs):
            f.write("{not json\n" if is_bad(i) else json.dumps({"messages": with_system(c)}) + "\n")
    return path
