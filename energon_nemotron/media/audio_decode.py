"""Audio decoding for :mod:`energon_nemotron.media.audio`: the header metadata of the first audio
stream and its waveform as float32 mono at the model's rate (PyAV).
"""

from __future__ import annotations

import contextlib
import io
import os
from typing import Union

import numpy as np

from energon_nemotron.errors import MediaError

AudioSource = Union[bytes, bytearray, memoryview, str, os.PathLike]

_CHUNK = 1 << 15            # native-rate mono samples gathered before one resampler call


# FFmpeg's default probe reads up to 5 MB (about 30 ns a byte for WAV: 34 ms for a 20 s stereo file);
# 32 KiB is enough for common audio headers, and an incomplete probe is retried with the defaults.
_FAST_PROBE = {"probesize": "32768"}


def _open_once(data: AudioSource, options: dict | None):
    import av

    try:
        src = io.BytesIO(data) if isinstance(data, (bytes, bytearray, memoryview)) else os.fspath(data)
        return av.open(src, mode="r", options=options)
    except (av.FFmpegError, OSError, ValueError, EOFError) as e:
        raise MediaError(f"cannot open audio: {e}") from e


@contextlib.contextmanager
def _open_audio(data: AudioSource):
    """``(container, first audio stream)``; a quick probe first, the full FFmpeg probe when the quick
    one misses the audio stream or its rate / channels. :class:`MediaError` if there is no audio."""
    container = _open_once(data, _FAST_PROBE)
    audio = container.streams.audio
    if not (audio and audio[0].codec_context.sample_rate and audio[0].codec_context.channels):
        container.close()
        container = _open_once(data, None)
    with container:
        if not container.streams.audio:
            raise MediaError("no audio stream")
        yield container, container.streams.audio[0]


# Header-less ADTS AAC: FFmpeg's duration is a bitrate guess, so packet durations are summed (demux only).
_GUESSED_DURATION = frozenset({"aac"})


def audio_metadata(data: AudioSource) -> dict:
    """``{"duration": float seconds, "sample_rate": int, "channels": int}`` of the first audio stream.

    Duration: the stream header (``stream.duration * time_base``), else the container's; ADTS sums
    its packets' durations; only without any duration is the stream decoded to count samples.
    Raises :class:`MediaError` for unreadable data, no audio stream or zero length.
    """
    import av

    with _open_audio(data) as (container, stream):
        cc = stream.codec_context
        rate, channels = int(cc.sample_rate or 0), int(cc.channels or 0)
        try:
            if container.format.name in _GUESSED_DURATION:
                duration = float(sum(p.duration or 0 for p in container.demux(stream)) * stream.time_base)
            elif stream.duration is not None and stream.time_base is not None:
                duration = float(stream.duration * stream.time_base)
            elif container.duration is not None:
                duration = container.duration / av.time_base
            else:
                duration = sum(f.samples for f in container.decode(stream)) / rate if rate else 0.0
        except av.FFmpegError as e:
            raise MediaError(f"cannot read audio: {e}") from e
    if rate <= 0 or channels <= 0:
        raise MediaError(f"audio stream without sample rate / channels ({rate} Hz, {channels} ch)")
    if not duration > 0:
        raise MediaError("audio has zero length")
    return {"duration": duration, "sample_rate": rate, "channels": channels}


def _to_mono(frame) -> np.ndarray:
    """A decoded frame as float32 mono ``[samples]``: the channel mean, integer formats scaled to
    [-1, 1) as FFmpeg does (s16: x / 32768, u8: (x - 128) / 128). One matrix-vector product."""
    a = frame.to_ndarray()                # planar: [C, n]; packed: [1, n * C]
    c, kind = frame.layout.nb_channels, a.dtype.kind
    scale = 1.0 if kind == "f" else 1.0 / 2 ** (8 * a.dtype.itemsize - 1)
    x = a.astype(np.float32, copy=False)
    if c == 1:
        mono = x.reshape(-1) * np.float32(scale) if scale != 1.0 else x.reshape(-1)
    else:
        w = np.full(c, scale / c, dtype=np.float32)
        mono = w @ x if frame.format.is_planar else x.reshape(-1, c) @ w
    return mono - np.float32(1.0) if kind == "u" else mono


def decode_audio(data: AudioSource, options=None) -> np.ndarray:
    """Decode the first audio stream (any container, e.g. an MP4 with video) to float32 ``[n]`` mono
    at ``options.sample_rate`` (an ``AudioOptions``; None: 16 kHz): channel mean, then
    ``av.AudioResampler`` (flt, mono), flushed at the end. Raises :class:`MediaError` for unreadable
    data or when nothing decodes."""
    import av

    target = 16000 if options is None else options.sample_rate
    out: list[np.ndarray] = []
    pending: list[np.ndarray] = []
    rate = resampler = None

    def feed(final: bool) -> None:      # resample the gathered mono samples; flush at the end
        if pending:
            frame = av.AudioFrame.from_ndarray(np.concatenate(pending)[None, :], format="flt", layout="mono")
            frame.sample_rate = rate
            pending.clear()
            out.extend(o.to_ndarray()[0] for o in resampler.resample(frame))
        if final and resampler is not None:
            out.extend(o.to_ndarray()[0] for o in resampler.resample(None))

    with _open_audio(data) as (container, stream):
        try:
            gathered = 0
            for frame in container.decode(stream):
                if frame.sample_rate != rate:       # first frame, or a mid-stream rate change
                    feed(final=True)
                    rate = frame.sample_rate
                    resampler = av.AudioResampler(format="flt", layout="mono", rate=target)
                pending.append(_to_mono(frame))
                gathered += frame.samples
                if gathered >= _CHUNK:
                    feed(final=False)
                    gathered = 0
            feed(final=True)
        except av.FFmpegError as e:
            raise MediaError(f"cannot decode audio: {e}") from e
    if not out:
        raise MediaError("audio decodes to zero samples")
    return np.concatenate(out).astype(np.float32, copy=False)
