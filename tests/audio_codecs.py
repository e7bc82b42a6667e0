"""Audio files of an exact length in every codec the project accepts, written with PyAV (FFmpeg's
encoders), for the tests that compare the audio path with the Omni processor's ``load_audio``.

``encode(samples, rate, codec)``: ``samples`` float32 ``[channels, n]`` in [-1, 1]; ``codec`` one of
:data:`CODECS` (``wav`` PCM s16, ``flac``, ``mp3`` LAME, ``vorbis`` libvorbis in Ogg (written with
``soundfile``: FFmpeg's own Vorbis encoder is stereo-only and pads the end), ``opus`` libopus in Ogg,
``m4a`` AAC in MP4). Opus takes 8, 12, 16, 24 or 48 kHz only.
"""

from __future__ import annotations

import io
from fractions import Fraction

import numpy as np

#: codec -> (container format, encoder, file extension, encoder options)
CODECS = {
    "wav": ("wav", "pcm_s16le", "wav", {}),
    "flac": ("flac", "flac", "flac", {}),
    "mp3": ("mp3", "libmp3lame", "mp3", {}),
    "vorbis": ("ogg", None, "ogg", {}),
    "opus": ("ogg", "libopus", "opus", {}),
    "m4a": ("ipod", "aac", "m4a", {}),
}


def signal(n: int, rate: int, channels: int, seed: int) -> np.ndarray:
    """float32 ``[channels, n]``: a chirp per channel plus a little noise, peak below 0.5."""
    rng = np.random.default_rng(seed)
    t = np.arange(n) / rate
    rows = [0.3 * np.sin(2 * np.pi * (180 + 90 * c + 400 * t) * t) + 0.04 * rng.standard_normal(n)
            for c in range(channels)]
    return np.asarray(rows, dtype=np.float32)


def encode(samples: np.ndarray, rate: int, codec: str) -> bytes:
    """The encoded file of ``samples`` (float32 ``[channels, n]``) at ``rate`` Hz."""
    import av

    fmt, encoder, _, options = CODECS[codec]
    if encoder is None:
        import soundfile

        buf = io.BytesIO()
        soundfile.write(buf, np.ascontiguousarray(samples.T), rate, format="OGG", subtype="VORBIS")
        return buf.getvalue()
    channels = samples.shape[0]
    layout = "mono" if channels == 1 else "stereo"
    buf = io.BytesIO()
    with av.open(buf, mode="w", format=fmt) as out:
        stream = out.add_stream(encoder, rate=rate, options=dict(options))
        stream.layout = layout
        for start in range(0, samples.shape[1], 1024):
            frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(samples[:, start:start + 1024]), format="fltp",
                                               layout=layout)
            frame.sample_rate, frame.pts, frame.time_base = rate, start, Fraction(1, rate)
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()


def extension(codec: str) -> str:
    return CODECS[codec][2]
