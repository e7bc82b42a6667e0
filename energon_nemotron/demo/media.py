"""Synthetic media files for the demo and the tests, written with Pillow and PyAV (no downloads).

Every generator is deterministic for its arguments and returns the encoded file as bytes.
"""

from __future__ import annotations

import io
from fractions import Fraction

import numpy as np
from PIL import Image


def make_image(width: int, height: int, seed: int = 0, fmt: str = "JPEG") -> bytes:
    """A smooth colourful image (gradients plus a few shapes) encoded as ``fmt`` (JPEG, PNG, WEBP)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    base = rng.uniform(0, 1, size=3)
    r = 127 + 127 * np.sin(x / max(width, 1) * 6.28 * (1 + base[0]))
    g = 127 + 127 * np.cos(y / max(height, 1) * 6.28 * (1 + base[1]))
    b = 127 + 127 * np.sin((x + y) / max(width + height, 1) * 6.28 * (1 + base[2]))
    arr = np.stack([r, g, b], axis=-1).astype(np.uint8)
    for _ in range(3):
        cx, cy = rng.integers(0, width), rng.integers(0, height)
        rad = max(2, int(min(width, height) * rng.uniform(0.05, 0.2)))
        mask = (x - cx) ** 2 + (y - cy) ** 2 < rad ** 2
        arr[mask] = rng.integers(0, 255, size=3, dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr, "RGB").save(buf, format=fmt)
    return buf.getvalue()


def make_video(width: int = 160, height: int = 96, seconds: float = 2.0, fps: int = 10, seed: int = 0,
               container: str = "mp4", codec: str = "libx264", with_audio: bool = False) -> bytes:
    """A moving-pattern video (H.264 in MP4 by default; ``container``/``codec`` e.g. ``webm``/``libvpx``)."""
    import av

    rng = np.random.default_rng(seed)
    phase = rng.uniform(0, 6.28)
    buf = io.BytesIO()
    with av.open(buf, mode="w", format=container) as out:
        stream = out.add_stream(codec, rate=fps)
        stream.width, stream.height = width, height
        stream.pix_fmt = "yuv420p"
        if with_audio:
            audio = out.add_stream("aac", rate=16000)
        y, x = np.mgrid[0:height, 0:width].astype(np.float32)
        n = int(round(seconds * fps))
        for i in range(n):
            t = i / fps
            r = 127 + 127 * np.sin(x / width * 6.28 + t * 3 + phase)
            g = 127 + 127 * np.cos(y / height * 6.28 + t * 2)
            b = np.full_like(x, (i * 255 // max(n - 1, 1)) % 256)
            frame = av.VideoFrame.from_ndarray(np.stack([r, g, b], -1).astype(np.uint8), format="rgb24")
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
        if with_audio:
            _write_audio(out, audio, seconds, 16000, 1, seed)
    return buf.getvalue()


def _tone(seconds: float, rate: int, channels: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(round(seconds * rate))) / rate
    freqs = rng.uniform(200, 900, size=channels)
    return np.stack([0.3 * np.sin(2 * np.pi * f * t) for f in freqs]).astype(np.float32)   # [C, n]


def _write_audio(out, stream, seconds: float, rate: int, channels: int, seed: int) -> None:
    import av

    samples = _tone(seconds, rate, channels, seed)
    layout = "mono" if channels == 1 else "stereo"
    chunk = 1024
    for start in range(0, samples.shape[1], chunk):
        part = samples[:, start:start + chunk]
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(part), format="fltp", layout=layout)
        frame.sample_rate = rate
        frame.pts = start
        frame.time_base = Fraction(1, rate)
        for packet in stream.encode(frame):
            out.mux(packet)
    for packet in stream.encode():
        out.mux(packet)


def make_audio(seconds: float = 1.5, sample_rate: int = 22050, channels: int = 2, seed: int = 0,
               container: str = "wav") -> bytes:
    """A sum-of-tones recording: ``wav`` (PCM s16), ``flac``, ``mp3`` or ``ogg`` (Opus: 48, 24, 16, 12
    or 8 kHz only)."""
    import av

    codec = {"wav": "pcm_s16le", "flac": "flac", "mp3": "libmp3lame", "ogg": "libopus"}[container]
    buf = io.BytesIO()
    with av.open(buf, mode="w", format=container) as out:
        stream = out.add_stream(codec, rate=sample_rate)
        stream.layout = "mono" if channels == 1 else "stereo"
        _write_audio(out, stream, seconds, sample_rate, channels, seed)
    return buf.getvalue()
