"""The audio path against the Omni processor loading the same files by path (``transformers`` 5.24's
``load_audio``: soundfile + soxr without torchcodec, then ``_process_audio``; run in ``.venv-ref`` on
``tests/media_corpus.py``'s audio-file set): every codec (WAV, FLAC, MP3, Ogg Vorbis and Opus, M4A/AAC),
source rates 8-48 kHz, mono and stereo, lengths across the 160-sample residues, and the short band."""

from __future__ import annotations

import collections

import numpy as np
import pytest

from energon_nemotron.errors import MediaError
from energon_nemotron.media.audio import AudioOptions, audio_metadata, plan_audio, process_audio
from hf_reference import run_reference


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return run_reference(tmp_path_factory.mktemp("omni_audio_files"), kinds=("audio_files",))


def loadable(reference):
    """``(item, result, bytes)`` of the files the processor loads, 2 hops or longer."""
    for item in reference.items("audio_files"):
        result = reference.results["audio_files"][item["name"]]
        if "error" not in result and result["num_samples"] >= 320:
            yield item, result, (reference.corpus / item["file"]).read_bytes()


def test_the_set_covers_every_codec_rate_and_layout(reference):
    configs = collections.Counter((i["codec"], i["rate"], i["channels"]) for i in reference.items("audio_files"))
    assert {c for c, _, _ in configs} == {"wav", "flac", "mp3", "vorbis", "opus", "m4a"}
    assert {r for c, r, _ in configs if c == "wav"} >= {8000, 16000, 22050, 44100, 48000}
    assert {ch for _, _, ch in configs} == {1, 2}
    residues = {r["num_samples"] % 160 for _, r, _ in loadable(reference)}
    assert len(residues) >= 90            # of 160


def test_planned_length_and_tokens_equal_the_processor(reference):
    """The length planned from the headers alone is the processor's waveform length, and so are the
    token counts: Opus's pre-skip and MP3's delay are not counted, and resampled lengths are
    ``ceil(n * 16000 / rate)`` (436 lengths per rate differed when they were rounded)."""
    checked = collections.Counter()
    for item, result, data in loadable(reference):
        plan = plan_audio(audio_metadata(data))
        assert plan.num_samples == result["num_samples"], item["name"]
        assert plan.tokens == (result["num_tokens"],), item["name"]
        checked[item["codec"]] += 1
    assert set(checked) == {"wav", "flac", "mp3", "vorbis", "opus"}


def test_features_equal_the_processor_bit_for_bit(reference):
    """Decoded, mixed, resampled and featurised as the processor's ``load_audio`` does: equal features
    for every codec it loads, at every rate, mono and stereo."""
    for item, result, data in loadable(reference):
        plan = plan_audio(audio_metadata(data))
        features, lengths = process_audio(data, plan)
        theirs = reference.array("audio_files", item["name"])
        assert lengths.tolist() == [result["num_frames"]], item["name"]
        ours = features[0, :result["num_frames"]].numpy()
        assert np.array_equal(ours, theirs), (item["name"], float(np.abs(ours - theirs).max()))


def test_m4a_needs_torchcodec_in_the_processor_and_decodes_here(reference):
    """M4A/AAC: the processor's ``load_audio`` refuses it without torchcodec (FFmpeg); the project
    decodes it with FFmpeg (PyAV), plans it from the container headers and keeps the decoded length
    within ``tolerance_seconds`` of the plan."""
    items = [i for i in reference.items("audio_files") if i["codec"] == "m4a"]
    assert items
    for item in items:
        assert "torchcodec" in reference.results["audio_files"][item["name"]]["error"], item["name"]
        data = (reference.corpus / item["file"]).read_bytes()
        plan = plan_audio(audio_metadata(data))
        assert abs(plan.num_samples - item["source_samples"] * 16000 / item["rate"]) <= 0.05 * 16000
        features, lengths = process_audio(data, plan)
        assert lengths.tolist() == list(plan.frames) and not features.isnan().any()


def test_short_audio_bands(reference):
    """Under 320 samples (2 hops) the processor's features are NaN: a clear per-sample error
    (``audio_too_short``); from 320 samples on, equal to the processor (1 token under 1280 samples,
    no padding to 0.1 s)."""
    short = [i for i in reference.items("audio_files") if i["codec"] == "wav" and i["rate"] == 16000
             and i["source_samples"] <= 1601]
    seen = set()
    for item in short:
        result = reference.results["audio_files"][item["name"]]
        data = (reference.corpus / item["file"]).read_bytes()
        n = item["source_samples"]
        if n < 320:
            assert result["nan"], item["name"]
            with pytest.raises(MediaError) as e:
                plan_audio(audio_metadata(data))
            assert e.value.code == "audio_too_short"
            seen.add("error")
            continue
        assert not result["nan"]
        plan = plan_audio(audio_metadata(data))
        assert plan.clip_samples == (n,) and plan.tokens == (result["num_tokens"],), item["name"]
        assert result["num_tokens"] == (1 if n < 1280 else 2), item["name"]
        features, _ = process_audio(data, plan)
        assert np.array_equal(features[0].numpy(), reference.array("audio_files", item["name"])), item["name"]
        seen.add("equal")
    assert seen == {"error", "equal"}


def test_sound_length_valid_counts_the_same_samples(reference):
    """``audio.sound_length: valid`` (Bridge main) counts ``n // hop`` frames of the same waveform."""
    options = AudioOptions(sound_length="valid")
    for item, result, data in list(loadable(reference))[:20]:
        plan = plan_audio(audio_metadata(data), options)
        assert plan.num_samples == result["num_samples"] and plan.frames == (result["num_samples"] // 160,)
