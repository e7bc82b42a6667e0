"""The generated media corpus that the project and the official Nemotron Omni processor both read.

``build_corpus(folder)`` writes 40 images of every kind the processor-parity tests cover (JPEG
photos and grayscale, CMYK JPEG, EXIF-oriented JPEGs, 8-bit / 16-bit / palette / LA / RGBA PNGs,
WebP, GIF; fixed and random sizes), videos of several frame rates, sizes and rotations, and WAV clips of many lengths, plus
``manifest.json``: one entry per item with its file and how the reference must be fed
(``tests/references/hf_omni_processor.py`` reads it in the ``.venv-ref`` environment).

Everything is deterministic (seeded) and made here: PIL for images, PyAV for mp4, ``wave`` for WAV.
"""

from __future__ import annotations

import io
import json
import math
import struct
import wave
import zlib
from fractions import Fraction
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

SR = 16000


# -- pictures ----------------------------------------------------------------------------------
def photo(rng: np.random.Generator, w: int, h: int) -> np.ndarray:
    """uint8 [h, w, 3]: smooth colour fields, a few blobs and sensor-like noise."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    base = np.stack([x / max(w, 1), y / max(h, 1), (x + y) / max(w + h, 1)], -1) * 200 + 20
    for _ in range(4):
        cx, cy, r = rng.uniform(0, w), rng.uniform(0, h), rng.uniform(5, max(w, h) / 3)
        base += (np.exp(-((x - cx) ** 2 + (y - cy) ** 2) / (2 * r * r))[..., None]
                 * rng.uniform(-90, 90, 3).astype(np.float32))
    base += rng.normal(0, 6, base.shape)
    return np.clip(base, 0, 255).astype(np.uint8)


def screenshot(rng: np.random.Generator, w: int, h: int) -> np.ndarray:
    """uint8 [h, w, 3]: flat panels, 1-px rules and text: hard edges (the worst case for resizing)."""
    im = Image.new("RGB", (w, h), tuple(int(v) for v in rng.integers(200, 256, 3)))
    d = ImageDraw.Draw(im)
    for _ in range(6):
        x0, y0 = int(rng.integers(0, w)), int(rng.integers(0, h))
        d.rectangle([x0, y0, x0 + int(rng.integers(10, w // 2 + 11)), y0 + int(rng.integers(8, h // 3 + 9))],
                    fill=tuple(int(v) for v in rng.integers(0, 256, 3)))
    for row in range(0, h, 14):
        d.text((4, row), "energon nemotron 0123456789 ABC xyz", fill=(0, 0, 0))
        d.line([(0, row + 12), (w, row + 12)], fill=(90, 90, 90))
    return np.asarray(im)


def _png16(gray: np.ndarray) -> bytes:
    """A 16-bit grayscale PNG of ``gray`` (uint16 [h, w]), written chunk by chunk."""
    h, w = gray.shape
    raw = b"".join(b"\x00" + gray[r].astype(">u2").tobytes() for r in range(h))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", w, h, 16, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def _encode(im: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **kw)
    return buf.getvalue()


def _with_orientation(im: Image.Image, orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return _encode(im, "JPEG", quality=90, exif=exif.tobytes())


def _kind_makers() -> dict:
    """kind -> ``make(rng, w, h, i) -> (encoded bytes, reference_input)``."""

    def rgba_of(rng, w, h):
        rgba = np.dstack([screenshot(rng, w, h), np.zeros((h, w), np.uint8)])
        yy, xx = np.mgrid[0:h, 0:w]
        rgba[..., 3] = np.where((xx - w / 2) ** 2 + (yy - h / 2) ** 2 < (min(w, h) / 2.5) ** 2, 255,
                                np.where(xx < w // 5, 128, 0))
        return rgba

    def gray16(rng, w, h, i):
        y, x = np.mgrid[0:h, 0:w]
        return _png16(((x * 65535 // max(w - 1, 1) + y * (97 + i)) % 65536).astype(np.uint16)), "scale16"

    def gif(rng, w, h, i):
        frames = [Image.fromarray(screenshot(rng, w, h)).quantize(32) for _ in range(3)]
        return _encode(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=80, loop=0,
                       **({"transparency": 3} if i % 2 else {})), "exif_transpose"

    def plain(fn):
        return lambda rng, w, h, i: (fn(rng, w, h, i), "exif_transpose")

    return {
        "jpeg": plain(lambda rng, w, h, i: _encode(Image.fromarray(photo(rng, w, h)), "JPEG",
                                                   quality=int(rng.integers(60, 97)))),
        "jpeg_gray": plain(lambda rng, w, h, i: _encode(Image.fromarray(photo(rng, w, h)[..., 1]), "JPEG", quality=85)),
        "jpeg_cmyk": plain(lambda rng, w, h, i: _encode(Image.fromarray(photo(rng, w, h)).convert("CMYK"), "JPEG",
                                                        quality=90)),
        "jpeg_exif": plain(lambda rng, w, h, i: _with_orientation(Image.fromarray(photo(rng, w, h)), 2 + i % 7)),
        "png": plain(lambda rng, w, h, i: _encode(Image.fromarray(screenshot(rng, w, h)), "PNG")),
        "png16": gray16,
        "png_rgba": plain(lambda rng, w, h, i: _encode(Image.fromarray(rgba_of(rng, w, h), "RGBA"), "PNG")),
        "png_la": plain(lambda rng, w, h, i: _encode(Image.fromarray(rgba_of(rng, w, h)[..., [1, 3]], "LA"), "PNG")),
        "png_palette": plain(lambda rng, w, h, i: _encode(Image.fromarray(screenshot(rng, w, h)).quantize(64), "PNG")),
        "png_palette_trns": plain(lambda rng, w, h, i: _encode(Image.fromarray(screenshot(rng, w, h)).quantize(64),
                                                               "PNG", transparency=int(i * 7 % 64))),
        "webp": plain(lambda rng, w, h, i: _encode(Image.fromarray(photo(rng, w, h)), "WEBP", quality=80)),
        "webp_rgba": plain(lambda rng, w, h, i: _encode(Image.fromarray(np.dstack(
            [photo(rng, w, h), rng.integers(0, 256, (h, w), dtype=np.uint8)]), "RGBA"), "WEBP", lossless=True)),
        "gif": gif,
    }


#: sizes every kind starts with (photos, screenshots, tiny, extreme aspect ratios, exact patch multiples)
FIXED_SIZES = [(720, 477), (1988, 1362), (200, 150), (64, 1500), (1800, 300), (512, 512), (33, 17), (640, 360)]
IMAGES_PER_KIND = 40
FULL_INDICES = (0, 2, 5)  # images of a kind whose whole pixel_values are compared; the rest by sampled rows


def image_sizes(rng: np.random.Generator) -> list[tuple[int, int]]:
    """``IMAGES_PER_KIND`` sizes: the fixed ones, then log-uniform sides 16-1400 px."""
    extra = [(int(np.exp(rng.uniform(np.log(16), np.log(1400)))), int(np.exp(rng.uniform(np.log(16), np.log(1400)))))
             for _ in range(IMAGES_PER_KIND - len(FIXED_SIZES))]
    return FIXED_SIZES + extra


def image_items(rng: np.random.Generator) -> list[tuple[str, str, bytes, str]]:
    """``(name, kind, encoded bytes, reference_input)``, ``IMAGES_PER_KIND`` of every kind:
    ``reference_input`` is ``exif_transpose`` (what HF's loaders do) or ``scale16`` for 16-bit data
    (the reference is fed the image scaled to 8 bits, since its own conversion clips it)."""
    out = []
    for kind, make in _kind_makers().items():
        for i, (w, h) in enumerate(image_sizes(rng)):
            data, ref = make(rng, w, h, i)
            out.append((f"{kind}_{i:02d}", kind, data, ref))
    return out


#: (mode, container) of the integer images wider than 8 bits, each with 8-, 12- and 16-bit data
WIDE_MODES = (("I;16", "PNG"), ("I;16B", "TIFF"), ("I", "TIFF"))
WIDE_SIZES = ((97, 61), (640, 360))


def wide_items(rng: np.random.Generator) -> list[tuple[str, str, bytes, str]]:
    """``(name, kind, encoded bytes, reference_input)`` of the 16-/32-bit integer images: every mode of
    :data:`WIDE_MODES` with 8-, 12- and 16-bit data (a photo scaled to ``2**bits - 1``). 8-bit data is
    fed to the processor as it opens (``as_opened``: its own conversion keeps it); wider data scaled to
    8 bits by its bit depth (``scale_depth``: the project's documented rule, where the processor's own
    conversion clips it near-white)."""
    out = []
    for mode, fmt in WIDE_MODES:
        for bits in (8, 12, 16):
            for i, (w, h) in enumerate(WIDE_SIZES):
                data = np.round(photo(rng, w, h)[..., 1].astype(np.float64) * (2 ** bits - 1) / 255)
                if mode == "I;16":
                    encoded = _png16(data.astype(np.uint16))
                else:
                    arr = data.astype(">u2" if mode == "I;16B" else np.int32)
                    encoded = _encode(Image.frombytes(mode, (w, h), arr.tobytes()), fmt)
                name = f"{mode.replace(';', '')}_{bits}bit_{i}"
                out.append((name, f"wide{bits}", encoded, "as_opened" if bits == 8 else "scale_depth"))
    return out


# -- videos ------------------------------------------------------------------------------------
#: (name, width, height, fps, frames, rotation, reference kwargs, target_patches)
VIDEOS = [
    ("v30_640x360", 640, 360, Fraction(30), 300, 0, {"fps": 2}, 1024),
    ("v24_320x240", 320, 240, Fraction(24), 84, 0, {"num_frames": 8}, 256),
    ("v25_1280x720_short", 1280, 720, Fraction(25), 20, 0, {"num_frames": 8}, 256),
    ("v60_160x96", 160, 96, Fraction(60), 600, 0, {"num_frames": 16}, 256),
    ("v2997_480x270", 480, 270, Fraction(30000, 1001), 150, 0, {"num_frames": 9}, 256),
    ("v15_portrait_rot90", 320, 180, Fraction(15), 45, 90, {"num_frames": 8}, 256),
    ("v30_rot270", 256, 144, Fraction(30), 60, 270, {"num_frames": 6}, 256),
    ("v30_rot180", 200, 120, Fraction(30), 40, 180, {"num_frames": 4}, 256),
    ("v10_odd_frames", 176, 144, Fraction(10), 35, 0, {"num_frames": 7}, 1024),
    ("v50_square", 240, 240, Fraction(50), 120, 0, {"fps": 2}, 256),
]


# -- audio -------------------------------------------------------------------------------------
#: clip lengths in samples (16 kHz): 0.1 s to 30 s, many with (L // 160) % 8 == 0
AUDIO_SAMPLES = sorted({1600, 1760, 2000, 2560, 3200, 5120, 8000, 10240, 12800, 16000, 16160, 20480,
                        32000, 40960, 48000, 64000, 80000, 81920, 100000, 116800, 128000, 160000,
                        160160, 200000, 240000, 256000, 320000, 400000, 479840, 480000})


def tone_wav(num_samples: int, seed: int) -> bytes:
    """16-bit mono 16 kHz WAV: a chirp plus noise, ``num_samples`` long."""
    rng = np.random.default_rng(seed)
    t = np.arange(num_samples) / SR
    x = 0.3 * np.sin(2 * np.pi * (200 + 300 * t) * t) + 0.05 * rng.standard_normal(num_samples)
    pcm = np.clip(np.round(x * 32768), -32768, 32767).astype("<i2")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(SR)
        w.writeframes(pcm.tobytes())
    return buf.getvalue()


#: (codec, source rate, channels) of the codec set; every codec at two rates, mono and stereo
AUDIO_CODEC_CONFIGS = [(codec, rate, ch) for codec, rates in (
    ("wav", (8000, 22050, 44100, 48000)), ("flac", (16000, 44100)), ("mp3", (22050, 44100)),
    ("vorbis", (22050, 48000)), ("opus", (16000, 48000)), ("m4a", (16000, 44100)))
    for rate in rates for ch in (1, 2)]
#: 16 kHz WAV lengths around the short-audio bands: under 2 hops (the processor's features are NaN),
#: under 1280 samples (1 token) and around 0.1 s (1600)
SHORT_AUDIO = (1, 100, 319, 320, 321, 479, 480, 800, 1279, 1280, 1281, 1599, 1600, 1601)


def source_lengths(rng: np.random.Generator, rate: int, count: int) -> list[int]:
    """``count`` source lengths (samples at ``rate``) of 0.3-2.5 s whose 16 kHz lengths fall on varied
    residues modulo 160; at a rate that does not divide 16 kHz, half of them where ``ceil`` and ``round`` of
    ``n * 16000 / rate`` differ across a multiple of 160 (another mel frame either way)."""
    out: list[int] = []
    while len(out) < count:
        n = int(rng.integers(int(0.3 * rate), int(2.5 * rate)))
        exact = n * 16000 / rate
        crosses = math.ceil(exact) % 160 == 0 and round(exact) != math.ceil(exact)
        if 16000 % rate == 0 or len(out) % 2 == 0 or crosses:        # 16 kHz and 8 kHz never round
            out.append(n)
    return out


def audio_file_items(rng: np.random.Generator) -> list[tuple[str, str, int, int, int]]:
    """``(name, codec, rate, channels, source samples)``: 6 lengths per codec configuration, 24 more mono
    WAVs per resampled rate, and the short 16 kHz WAVs."""
    items = []
    for codec, rate, ch in AUDIO_CODEC_CONFIGS:
        count = 6 + (24 if codec == "wav" and ch == 1 else 0)
        items += [(f"{codec}_{rate}_{ch}ch_{n}", codec, rate, ch, n) for n in source_lengths(rng, rate, count)]
    items += [(f"wav_16000_1ch_{n}", "wav", 16000, 1, n) for n in SHORT_AUDIO]
    return items


def build_corpus(folder: Path, kinds=("images", "videos", "audio"), seed: int = 12) -> dict:
    """Write the corpus (the given kinds) under ``folder`` and return (and write) its manifest."""
    from indexed_video import make_indexed_video
    from mp4_rotation import with_rotation

    rng = np.random.default_rng(seed)
    for sub in kinds:
        (folder / sub).mkdir(parents=True, exist_ok=True)
    manifest: dict = {kind: [] for kind in kinds}
    for name, kind, data, ref in image_items(rng) if "images" in kinds else ():
        ext = {"png16": "png", "png_rgba": "png", "png_la": "png", "png_palette": "png",
               "png_palette_trns": "png", "webp_rgba": "webp", "jpeg_gray": "jpg", "jpeg_cmyk": "jpg",
               "jpeg_exif": "jpg", "jpeg": "jpg"}.get(kind, kind)
        path = folder / "images" / f"{name}.{ext}"
        path.write_bytes(data)
        manifest["images"].append({"name": name, "kind": kind, "file": f"images/{path.name}", "reference_input": ref,
                                   "full": int(name.rsplit("_", 1)[1]) in FULL_INDICES})
    for name, kind, data, ref in wide_items(rng) if "wide_images" in kinds else ():
        path = folder / "wide_images" / f"{name}.{'png' if name.startswith('I16_') else 'tiff'}"
        path.write_bytes(data)
        manifest["wide_images"].append({"name": name, "kind": kind, "file": f"wide_images/{path.name}",
                                        "reference_input": ref, "full": True})
    for name, w, h, fps, frames, rotation, kwargs, target in VIDEOS if "videos" in kinds else ():
        path = folder / "videos" / f"{name}.mp4"
        make_indexed_video(path, w, h, fps, frames)
        if rotation:
            path.write_bytes(with_rotation(path.read_bytes(), rotation))
        manifest["videos"].append({"name": name, "file": f"videos/{path.name}", "rotation": rotation,
                                   "sampling": kwargs, "target_patches": target})
    for i, n in enumerate(AUDIO_SAMPLES if "audio" in kinds else ()):
        path = folder / "audio" / f"a{n}.wav"
        path.write_bytes(tone_wav(n, seed + i))
        manifest["audio"].append({"name": f"a{n}", "file": f"audio/{path.name}", "num_samples": n})
    for i, (name, codec, rate, ch, n) in enumerate(audio_file_items(rng) if "audio_files" in kinds else ()):
        from audio_codecs import encode, extension, signal

        path = folder / "audio_files" / f"{name}.{extension(codec)}"
        path.write_bytes(encode(signal(n, rate, ch, seed + i), rate, codec))
        manifest["audio_files"].append({"name": name, "file": f"audio_files/{path.name}", "codec": codec,
                                        "rate": rate, "channels": ch, "source_samples": n})
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest
