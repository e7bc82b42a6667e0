"""NeMo-RL's Nemotron ``general_conversations`` cookers, by NeMo-RL's registered names.

The schema (NeMo-RL's ``cookers/nemotron.py``, after Megatron-LM's multimodal cookers):
``{"conversations": [{"from": "system"|"user"|"human"|"assistant"|"gpt"|"agent"|"tool", "value": str}],
"image"|"images": ..., "video"|"videos": ..., "audio"|"audios"|"sound"|"speech"|"speeches": ...,
"video-sound": ...}``. A value holds inline tags: ``<image>``, ``<images>``, ``<video>``, ``<videos>``,
``<audio>``, ``<audios>``, ``<sound>``, ``<speech>``, ``<speeches>`` (the aliases of the three
kinds) and ``<video-sound>`` (a clip's video and its audio: two media items from one file). The
n-th tag of a kind takes the n-th entry of that kind's field (a string or a list; an entry is a path
or ``{"value"|"member"|"path": PATH, "metadata"?: {...}}``).

- ``nemotron_general_conversations_webdataset``: an entry names a member of the WebDataset sample
  (``"0.jpg"``, ``"jpg"``, a path whose file name is ``KEY.EXT``: its ``EXT``), else the first unused
  member with the kind's default extension (``png``, ``jpeg``, ``jpg``, ``img``; ``mp4``; ``wav``,
  ``flac``, ``mp3``), else a path (``cookers.media``: the aux source, the dataset folder).
- ``nemotron_general_conversations_jsonl``: an entry is a path.
- ``nemotron_general_conversations_jsonl_explicit_loss_v1``: as ``_jsonl``, and every assistant turn
  carries ``"loss": true|false`` (its train flag; at least one true). The subflavors must say so:
  ``cook: general_conversations_jsonl_explicit_loss_v1``, ``loss_mask_mode:
  explicit_assistant_turns``, ``assistant_loss_mask_field: "conversations[*].loss"``; it does not go
  with ``train_only_on_last_assistant_turn``, ``skip_chat_template``,
  ``tool_response_as_turn_boundary`` or ``offline_packed_messages``.
- ``nemotron_granary_english_webdataset`` / ``_jsonl``: ``{"audio_filepath", "text"}``, the user turn
  ``GRANARY_ENGLISH_PROMPT`` (the audio tag in front), the assistant turn the transcript.

Text between tags is kept as it is, white-space-only text dropped; a turn without text gets ``" "``
(NeMo-RL's rendering). Where NeMo-RL silently drops data these cookers refuse the sample: a media
entry no tag uses (NeMo-RL checks only the kinds some tag used), two alias fields of one kind
(NeMo-RL keeps the last), an unused media member of a WebDataset sample. ``loss`` on a turn is an
error except in ``explicit_loss_v1``. ``train_only_on_last_assistant_turn`` is left to the prompt
format (NeMo-RL's formats have their own rule); ``tool_response_as_turn_boundary`` reaches it.
"""

from __future__ import annotations

import posixpath
import re
from typing import Any, Optional

from megatron.energon import stateless

from energon_nemotron.cookers.base import payload, register, sample_where, text_of
from energon_nemotron.cookers.conversations import check_members_used, make_conversation
from energon_nemotron.cookers.media import media_ref, path_media
from energon_nemotron.errors import DataError
from energon_nemotron.types import Conversation, MediaPart, MediaRef, Message

#: tag (and field) name -> the kind of media it stands for
TAG_KINDS = {"image": "image", "images": "image", "video": "video", "videos": "video", "audio": "audio",
             "audios": "audio", "sound": "audio", "speech": "audio", "speeches": "audio",
             "video-sound": "video-audio"}
TAG_RE = re.compile("(" + "|".join(f"<{re.escape(t)}>" for t in sorted(TAG_KINDS, key=len, reverse=True)) + ")")
#: the members a WebDataset sample's entry falls back to, per kind, in order
DEFAULT_MEMBERS = {"image": ("png", "jpeg", "jpg", "img"), "video": ("mp4",), "video-audio": ("mp4",),
                   "audio": ("wav", "flac", "mp3")}
ROLES = {"system": "system", "user": "user", "human": "user", "assistant": "assistant", "gpt": "assistant",
         "agent": "assistant", "tool": "tool"}
GRANARY_ENGLISH_PROMPT = ("<audio>. \nTranscribe the spoken content to written english text, "
                          "with punctuations and capitalizations.")
EXPLICIT_COOK = "general_conversations_jsonl_explicit_loss_v1"
EXPLICIT_MODE = "explicit_assistant_turns"
EXPLICIT_FIELD = "conversations[*].loss"
#: subflavors that explicit per-turn loss does not go with
EXPLICIT_EXCLUDES = ("train_only_on_last_assistant_turn", "skip_chat_template", "tool_response_as_turn_boundary",
                     "offline_packed_messages")
#: subflavor keys these cookers read beyond ``cooker`` / ``skip_chat_template`` / ``media_source``
NEMOTRON_SUBFLAVORS: dict[str, type] = {
    "train_only_on_last_assistant_turn": bool, "tool_response_as_turn_boundary": bool, "aux_data_prefixes": dict,
    "data_augment": bool, "cook": str, "loss_mask_mode": str, "assistant_loss_mask_field": str}
SCHEMA = ('{"conversations": [{"from", "value"}], "image(s)"/"video(s)"/"audio(s)"/"sound"/"speech(es)"/'
          '"video-sound": PATH | [PATH | {"value"|"member"|"path", "metadata"}]} with inline <image>, <video>, '
          '<audio>, <sound>, <speech>, <video-sound> ... tags (NeMo-RL\'s Nemotron general conversations)')
GRANARY_SCHEMA = '{"audio_filepath": PATH, "text": TRANSCRIPT} (NeMo-RL\'s Granary English prompt)'


def media_fields(obj: dict, where: str) -> dict[str, list]:
    """The media entries of a payload by kind (one field per kind; a single entry as a list)."""
    out: dict[str, list] = {}
    named: dict[str, str] = {}
    for name, kind in TAG_KINDS.items():
        if name not in obj:
            continue
        if kind in out:
            raise DataError(where, f"fields {named[kind]!r} and {name!r} both hold {kind} media: use one",
                            "media_reference")
        value = obj[name]
        out[kind], named[kind] = (value if isinstance(value, list) else [value]), name
    return out


def entry_value(entry: Any, where: str, kind: str) -> tuple[Any, Optional[dict]]:
    """(path or member name, metadata) of one media entry."""
    if isinstance(entry, dict):
        for key in ("value", "member", "path"):
            if key in entry:
                return entry[key], entry.get("metadata")
        raise DataError(where, f"a {kind} entry needs 'value', 'member' or 'path', got keys {sorted(entry)}")
    return entry, None


class EntryResolver:
    """Media entries → ``MediaRef``s: members of a WebDataset sample (``members``) or paths."""

    def __init__(self, sample: dict, where: str, members: bool) -> None:
        self.sample, self.where, self.members = sample, where, members
        self.used: list[str] = []

    def __call__(self, entry: Any, kind: str, modality: str) -> MediaRef:
        value, metadata = entry_value(entry, self.where, kind)
        if self.members and isinstance(value, str):
            base = posixpath.basename(value)
            named = [c for c in (value, base, base.split(".", 1)[-1]) if c in self.sample and not c.startswith("__")]
            fallback = [c for c in DEFAULT_MEMBERS[kind] if c in self.sample and c not in self.used]
            member = (named or fallback or [None])[0]
            if member is not None:
                if member not in self.used:
                    self.used.append(member)
                return media_ref(self.sample, member, modality, self.where, metadata)
        if not isinstance(value, str):
            raise DataError(self.where, f"a {kind} entry must name a path, got {type(value).__name__}")
        return media_ref(self.sample, value, modality, self.where, metadata) if metadata else \
            path_media(self.sample, value, modality, self.where)


def general_messages(sample: dict, obj: dict, where: str, members: bool,
                     loss: bool = False) -> tuple[list[Message], list[MediaRef]]:
    """Messages and media of a general-conversations payload (see the module docstring); ``loss``:
    the turns' ``loss`` flags are their train flags (``explicit_loss_v1``)."""
    turns = obj.get("conversations")
    if not isinstance(turns, list) or not turns:
        raise DataError(where, f"'conversations' must be a non-empty list (keys: {sorted(obj)})")
    fields = media_fields(obj, where)
    taken = {kind: 0 for kind in fields}
    resolve = EntryResolver(sample, where, members)
    messages: list[Message] = []
    media: list[MediaRef] = []
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise DataError(where, f"turn {i} must be an object with 'from' and 'value'")
        role = ROLES.get(turn.get("from")) if isinstance(turn.get("from"), str) else None
        if role is None:
            raise DataError(where, f"turn {i} has unknown role {turn.get('from')!r} (known: {', '.join(ROLES)})",
                            "unknown_role")
        if "loss" in turn and not loss:
            raise DataError(where, f"turn {i} has an explicit 'loss' field: only the cooker "
                                   "nemotron_general_conversations_jsonl_explicit_loss_v1 reads it")
        parts: list = []
        for piece in TAG_RE.split(text_of(turn.get("value"), where, f"turn {i} value")):
            tag = piece[1:-1] if TAG_RE.fullmatch(piece) else None
            if tag is None:
                if piece.strip():
                    parts.append(piece)
                continue
            kind = TAG_KINDS[tag]
            entries = fields.get(kind, [])
            if taken.get(kind, 0) >= len(entries):
                raise DataError(where, f"turn {i}: tag <{tag}> has no {kind} entry left ({len(entries)} in the "
                                       "sample)", "media_reference")
            entry = entries[taken[kind]]
            taken[kind] += 1
            for modality in (("video", "audio") if kind == "video-audio" else (kind,)):
                media.append(resolve(entry, kind, modality))
                parts.append(MediaPart(modality, len(media) - 1))
        if not any(isinstance(p, str) for p in parts):
            parts.append(" ")
        messages.append(Message(role, parts, train=turn["loss"] if loss and role == "assistant" else None))
    unused = {kind: len(fields[kind]) - n for kind, n in taken.items() if n < len(fields[kind])}
    if unused:
        raise DataError(where, f"media entries no tag uses: {unused} (every entry must be referenced by a tag)",
                        "media_reference")
    if members:
        check_members_used(sample, resolve.used, where)
    return messages, media


def check_loss_subflavors(sample: dict, where: str, explicit: bool) -> None:
    """The loss-mask subflavors must agree with the cooker (see the module docstring)."""
    sub = sample.get("__subflavors__") or {}
    mode, field, cook = sub.get("loss_mask_mode"), sub.get("assistant_loss_mask_field"), sub.get("cook")
    if mode not in (None, "", EXPLICIT_MODE):
        raise DataError(where, f"subflavor loss_mask_mode {mode!r}: the only mode is {EXPLICIT_MODE!r}")
    wanted = {"loss_mask_mode": EXPLICIT_MODE, "assistant_loss_mask_field": EXPLICIT_FIELD, "cook": EXPLICIT_COOK}
    if explicit:
        wrong = [f"{k}: {v!r}" for k, v in wanted.items() if sub.get(k) != v]
        clash = [k for k in EXPLICIT_EXCLUDES if sub.get(k)]
        if wrong or clash:
            raise DataError(where, "nemotron_general_conversations_jsonl_explicit_loss_v1 needs the subflavors "
                                   f"{', '.join(wrong) or 'as set'}" + (f" and not {', '.join(clash)}" if clash else ""))
    elif mode == EXPLICIT_MODE or field is not None or cook == EXPLICIT_COOK:
        raise DataError(where, "subflavors loss_mask_mode / assistant_loss_mask_field / cook select explicit per-turn "
                               "loss: use the cooker nemotron_general_conversations_jsonl_explicit_loss_v1")


def check_explicit_loss(obj: dict, where: str) -> None:
    """Every assistant turn has a bool ``loss``, no other turn has one, at least one is true."""
    trained = False
    for i, turn in enumerate(obj.get("conversations") or []):
        if not isinstance(turn, dict):
            continue
        if ROLES.get(turn.get("from")) == "assistant":
            if not isinstance(turn.get("loss"), bool):
                raise DataError(where, f"turn {i} (assistant) needs 'loss': true or false, got {turn.get('loss')!r}")
            trained = trained or turn["loss"]
        elif "loss" in turn:
            raise DataError(where, f"turn {i}: 'loss' is read on assistant turns only")
    if not trained:
        raise DataError(where, "no assistant turn has loss: true", "no_assistant")


def general_cook(sample: dict, members: bool, explicit: bool = False) -> Conversation:
    """One general-conversations sample (``members``: WebDataset members; ``explicit``: per-turn loss)."""
    where = sample_where(sample)
    check_loss_subflavors(sample, where, explicit)
    obj = payload(sample, where)
    if explicit:
        check_explicit_loss(obj, where)
    messages, media = general_messages(sample, obj, where, members, loss=explicit)
    return make_conversation(sample, messages, [0], where, media, format_last_only=True)


def granary_cook(sample: dict, members: bool) -> Conversation:
    """One Granary sample as a general conversation: the prompt with the audio, the transcript."""
    where = sample_where(sample)
    check_loss_subflavors(sample, where, False)
    obj = payload(sample, where)
    if "audio_filepath" not in obj:
        raise DataError(where, f"a Granary sample needs 'audio_filepath' (keys: {sorted(obj)})")
    text = text_of(obj.get("text"), where, "'text'")
    rewritten = {"audio": obj["audio_filepath"], "conversations": [
        {"from": "user", "value": GRANARY_ENGLISH_PROMPT}, {"from": "assistant", "value": text}]}
    messages, media = general_messages(sample, rewritten, where, members)
    return make_conversation(sample, messages, [0], where, media, format_last_only=True)


@register("nemotron_general_conversations_webdataset", NEMOTRON_SUBFLAVORS, schema=SCHEMA)
@stateless
def cook_nemotron_general_conversations_webdataset(sample: dict, **aux) -> Conversation:
    """NeMo-RL's cooker of that name: media entries name members of the sample."""
    return general_cook(sample, members=True)


@register("nemotron_general_conversations_jsonl", NEMOTRON_SUBFLAVORS, schema=SCHEMA)
@stateless
def cook_nemotron_general_conversations_jsonl(sample: dict, **aux) -> Conversation:
    """NeMo-RL's cooker of that name: media entries are paths."""
    return general_cook(sample, members=False)


@register("nemotron_general_conversations_jsonl_explicit_loss_v1", NEMOTRON_SUBFLAVORS,
          schema=SCHEMA + '; every assistant turn has "loss": true|false')
@stateless
def cook_nemotron_general_conversations_jsonl_explicit_loss_v1(sample: dict, **aux) -> Conversation:
    """NeMo-RL's cooker of that name: paths, and each assistant turn's ``loss`` is its train flag."""
    return general_cook(sample, members=False, explicit=True)


@register("nemotron_granary_english_webdataset", NEMOTRON_SUBFLAVORS, schema=GRANARY_SCHEMA,
          modalities=("audio",), requires=("audio",))
@stateless
def cook_nemotron_granary_english_webdataset(sample: dict, **aux) -> Conversation:
    """NeMo-RL's cooker of that name: the audio is a member of the sample."""
    return granary_cook(sample, members=True)


@register("nemotron_granary_english_jsonl", NEMOTRON_SUBFLAVORS, schema=GRANARY_SCHEMA,
          modalities=("audio",), requires=("audio",))
@stateless
def cook_nemotron_granary_english_jsonl(sample: dict, **aux) -> Conversation:
    """NeMo-RL's cooker of that name: the audio is a path."""
    return granary_cook(sample, members=False)
