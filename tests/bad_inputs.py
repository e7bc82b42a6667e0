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
}
#: a dataset read with subflavor skip_chat_template: its only assistant text is the first token
PREFORMATTED_BAD = {"no-trainable": ({"json": json.dumps({"conversations": [
    {"from": "gpt", "value": "A"}, {"from": "human", "value": " question that follows"}]}).encode()},
    "no_trainable_tokens")}
#: a nemotron_conversation dataset: the same member referenced twice
TWICE_BAD = {"referenced-twice": ({"json": json.dumps({"conversation": [
    {"sender": "user", "fragments": [{"t": "image", "value": "jpg"}, {"t": "image", "value": "jpg"}]},
    {"sender": "assistant", "fragments": ["ok"]}]}).encode(), "jpg": make_image(64, 48)}, "media_reference")}
#: JSONL lines (keys are line indices): a path escaping the dataset folder, and invalid JSON
JSONL_BAD = {1: ({"conversations": [{"from": "human", "value": "<image> hi"}, {"from": "gpt", "value": "x"}],
                  "image": "../outside.jpg"}, "path_escape"),
             2: ('{"conversations": }', "invalid_json")}

ALL_CODES = [code for _, code in (*WDS_BAD.values(), *PREFORMATTED_BAD.values(), *TWICE_BAD.values(),
                                  *JSONL_BAD.values())]


def build_corpus(root: Path, goods: int = 3) -> tuple[Path, int]:
    """Four prepared datasets and a metadataset blending them once each; returns
    (metadataset path, number of good samples)."""
    write_shards(root / "wds", [good(i) for i in range(goods)] + [(k, m) for k, (m, _) in WDS_BAD.items()], 6)
    prepare(root / "wds", {"cooker": "general_conversations"})
    write_shards(root / "pre", [good(100)] + [(k, m) for k, (m, _) in PREFORMATTED_BAD.items()], 6)
    prepare(root / "pre", {"cooker": "general_conversations"})
    nemotron_good = ("good-200", {"json": json.dumps({"conversation": [
        {"sender": "user", "fragments": ["Hi?"]}, {"sender": "assistant", "fragments": ["Hello."]}]}).encode()})
    write_shards(root / "twice", [nemotron_good] + [(k, m) for k, (m, _) in TWICE_BAD.items()], 6)
    prepare(root / "twice", {"cooker": "nemotron_conversation"})
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
        "      - {repetitions: 1, path: jsonl/chat.jsonl, subflavors: {cooker: general_conversations}}\n")
    return root / "mix.yaml", goods + 3


__all__ = ["ALL_CODES", "JSONL_BAD", "PREFORMATTED_BAD", "TWICE_BAD", "WDS_BAD", "build_corpus", "make_audio"]
