"""The ``granary_asr`` cooker: speech-recognition samples → a transcription turn.

A sample is ``{"audio_filepath": PATH, "text": TRANSCRIPT}`` (JSONL; the path is found as
``cookers.media`` finds paths: the dataset folder, the media roots, the dataset's aux source) or a
WebDataset sample with one audio member (wav/flac/mp3/ogg) and a ``.json`` member holding
``{"text": TRANSCRIPT}``. The user turn is the audio followed by the prompt (``subflavors.asr_prompt``
overrides the default); the assistant turn is the transcript.
"""

from __future__ import annotations

from megatron.energon import basic_sample_keys, stateless

from energon_nemotron.cookers.base import payload, register, sample_where, subflavor_flag, text_of
from energon_nemotron.cookers.media import member_media, path_media
from energon_nemotron.errors import DataError
from energon_nemotron.types import Conversation, MediaPart, Message

ASR_PROMPT = "Transcribe the spoken content to written text, with punctuation and capitalization."
SCHEMA = ('{"audio_filepath": "clips/a.wav", "text": "the transcript"} (JSONL; the path found as cookers.media '
          'finds paths), or a WebDataset sample with one audio member and a .json member {"text": ...}')


@register("granary_asr", {"asr_prompt": str}, schema=SCHEMA, modalities=("audio",), requires=("audio",))
@stateless
def cook_granary_asr(sample: dict, **aux) -> Conversation:
    where = sample_where(sample)
    obj = payload(sample, where)
    transcript = text_of(obj.get("text"), where, "'text'")
    if not transcript.strip():
        raise DataError(where, "'text' (the transcript) is empty")
    members = member_media(sample, "audio")
    if "audio_filepath" in obj:
        if members:
            raise DataError(where, f"both 'audio_filepath' and audio members {[m.name for m in members]}")
        audio = path_media(sample, obj["audio_filepath"], "audio", where)
    elif len(members) == 1:
        audio = members[0]
    else:
        raise DataError(where, f"expected one audio item ('audio_filepath' or one audio member), found {len(members)}")
    prompt = (sample.get("__subflavors__") or {}).get("asr_prompt", ASR_PROMPT)
    prompt = text_of(prompt, where, "subflavor 'asr_prompt'")
    messages = [Message("user", [MediaPart("audio", 0), "\n" + prompt]), Message("assistant", [transcript])]
    return Conversation(**basic_sample_keys(sample), messages=messages, media=[audio],
                        preformatted=subflavor_flag(sample, "skip_chat_template", where))
