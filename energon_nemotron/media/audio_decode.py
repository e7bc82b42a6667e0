"""Audio decoding for :mod:`energon_nemotron.media.audio`: the header metadata of the first audio
stream and its waveform as float32 mono at the model's rate, as the Omni processor loads audio.

The processor (``transformers.audio_utils.load_audio``, what ``NemotronH_Omni_Reasoning_V3Processor``
calls on a path; its default without torchcodec) decodes with ``soundfile`` (libsndfile: WAV, FLAC,
MP3, Ogg Vorbis and Opus, AIFF, ...), takes the channel mean, and resamples with ``soxr`` (``soxr_hq``)
to ``ceil(n * 16000 / rate)`` samples. This module does the same: what libsndfile opens is decoded
by it, so the samples, their number and the features are the processor's bit for bit (Opus's
pre-skip and MP3's encoder delay are libsndfile's to remove, before any length is planned: the
planned length is ``frames`` as libsndfile counts them). What it cannot open (M4A/AAC, an MP4's or
a WebM's audio track: the processor needs torchcodec, i.e. FFmpeg, for those) is decoded with PyAV
(FFmpeg), its length planned from the container headers, then resampled by the same rule.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
from typing import Union

import numpy as np

from energon_nemotron.errors import MediaError

AudioSource = Union[bytes, bytearray, memoryview, str, os.PathLike]

#: errors of a file libsndfile cannot read (its own, a bad argument, a file-like it cannot seek)
_SF_ERRORS = (RuntimeError, TypeError, ValueError, OSError, EOFError)


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


def _soundfile(data: AudioSource):
    """An open ``soundfile.SoundFile`` of ``data``, or None where libsndfile cannot read it."""
    import soundfile

    src = io.BytesIO(bytes(data)) if isinstance(data, (bytes, bytearray, memoryview)) else os.fspath(data)
    try:
        return soundfile.SoundFile(src)
    except _SF_ERRORS:
        return None


def audio_metadata(data: AudioSource) -> dict:
    """``{"duration": float seconds, "sample_rate": int, "channels": int}`` of the first audio stream,
    plus ``"frames"`` (int: samples per channel at ``sample_rate``) where libsndfile reads the file.

    libsndfile's count is exact (after Opus's pre-skip and MP3's encoder delay). Otherwise (PyAV):
    duration from the stream header (``stream.duration * time_base``), else the container's; ADTS sums
    its packets' durations; only without any duration is the stream decoded to count samples.
    Raises :class:`MediaError` for unreadable data, no audio stream or zero length.
    """
    import av

    f = _soundfile(data)
    if f is not None:
        with f:
            rate, channels, frames = int(f.samplerate), int(f.channels), int(f.frames)
        if rate > 0 and channels > 0 and 0 < frames < 1 << 48:
            return {"duration": frames / rate, "sample_rate": rate, "channels": channels, "frames": frames}

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


def resample(wave: np.ndarray, rate: int, target: int) -> np.ndarray:
    """float32 ``[n]`` at ``rate`` as float32 ``[ceil(n * target / rate)]`` at ``target``: ``soxr``'s
    ``soxr_hq`` resampler, zero-padded or cut to that length (the processor's ``load_audio``)."""
    if rate == target:
        return np.ascontiguousarray(wave, dtype=np.float32)
    import soxr

    n = math.ceil(wave.shape[-1] * target / rate)
    out = soxr.resample(wave, rate, target, quality="soxr_hq")
    return np.ascontiguousarray(np.pad(out, (0, max(0, n - len(out))))[:n], dtype=np.float32)


def channel_mean(frames: np.ndarray) -> np.ndarray:
    """float32 ``[n]``: the mean over the channels of float32 ``[n, channels]``, bit for bit what
    ``frames.T.mean(axis=0)`` gives (the processor's down-mix): numpy sums up to 7 channels in order,
    then divides, which is done here on contiguous columns (about 18x faster for stereo); from 8
    channels on its pairwise summation is used as it is."""
    c = frames.shape[1]
    if c == 1:
        return frames[:, 0]
    if c > 7:
        return frames.T.mean(axis=0)
    acc = frames[:, 0] + frames[:, 1]
    for k in range(2, c):
        acc += frames[:, k]
    acc /= np.float32(c)
    return acc


def _read_soundfile(f) -> tuple[np.ndarray, int]:
    """``(float32 mono [n], rate)`` of an open ``SoundFile``: float32 samples, the channel mean."""
    with f:
        rate = int(f.samplerate)
        try:
            frames = f.read(dtype="float32", always_2d=True)        # [n, channels]
        except _SF_ERRORS as e:
            raise MediaError(f"cannot decode audio: {e}") from e
    return channel_mean(frames), rate


def _read_pyav(data: AudioSource) -> list[tuple[np.ndarray, int]]:
    """``[(float32 mono [n], rate), ...]`` of the first audio stream decoded by PyAV, one entry per run
    of one sample rate (a stream may change its rate). A single-rate stream that decodes to less than
    one codec frame more than its header's duration is cut to that duration: the last frame's padding
    (AAC in MP4: FFmpeg removes the encoder's priming by the edit list, not the tail)."""
    import av

    runs: list[tuple[list[np.ndarray], int]] = []
    with _open_audio(data) as (container, stream):
        header = (stream.duration * stream.time_base if stream.duration and stream.time_base else None)
        frame_size = int(stream.codec_context.frame_size or 0)
        try:
            for frame in container.decode(stream):
                if not runs or frame.sample_rate != runs[-1][1]:
                    runs.append(([], frame.sample_rate))
                runs[-1][0].append(_to_mono(frame))
        except av.FFmpegError as e:
            raise MediaError(f"cannot decode audio: {e}") from e
    out = [(np.concatenate(parts), rate) for parts, rate in runs]
    if len(out) == 1 and header is not None:
        wave, rate = out[0]
        keep = int(round(header * rate))
        if 0 < wave.shape[0] - keep < frame_size:
            out = [(wave[:keep], rate)]
    return out


def decode_audio(data: AudioSource, options=None) -> np.ndarray:
    """Decode the first audio stream to float32 ``[n]`` mono at ``options.sample_rate`` (an
    ``AudioOptions``; None: 16 kHz), as the processor's ``load_audio`` (module docs): libsndfile where
    it reads the data, else PyAV (any container, e.g. an MP4 with video); the channel mean; then
    :func:`resample`. Raises :class:`MediaError` for unreadable data or when nothing decodes."""
    target = 16000 if options is None else options.sample_rate
    f = _soundfile(data)
    runs = [_read_soundfile(f)] if f is not None else _read_pyav(data)
    out = [resample(wave, rate, target) for wave, rate in runs if wave.size]
    if not out:
        raise MediaError("audio decodes to zero samples")
    return out[0] if len(out) == 1 else np.concatenate(out)
