"""The legacy audio-conversation cookers of NeMo-RL (after Megatron-LM's multimodal examples), by
NeMo-RL's registered names.

Both read ``{"conversations": [{"from": "human"|"gpt", "value": str}], ...}``: ``human`` is the
user, ``gpt`` the assistant, any other sender is ``unknown_role``. A value holds inline tags; the
text between tags is kept as it is (not stripped), white-space-only text is dropped, and a turn
left with nothing is ``[""]``. Each tag may appear at most once in the whole conversation.

- ``nemotron_audio_conversation_jsonl`` (NeMo-RL's ``cook_audio_conversation_jsonl``, Megatron-LM's
  ``audio_conversation`` schema): tags ``<image>``, ``<video>``, ``<sound>``, ``<video-sound>``. A
  tag takes every payload field whose name starts with its prefix, in the JSON's key order:
  ``image`` → ``image*`` (image), ``video`` → ``video*`` (video) except the fields starting with
  ``video-sound`` (the name of the longer tag), ``sound`` → ``sound*`` (audio), ``video-sound`` →
  ``vis_video*`` (video) then ``vis_sound*`` (audio). A field holds one entry: a path or
  ``{"value"|"path"|"member": PATH, "metadata"?: {...}}`` (``value`` first, then ``path``, then
  ``member``), found as ``cookers.media`` finds it (a member of the sample, else a path: the aux
  source, the dataset folder, the media roots). A tag without a field of its prefix is an error.
- ``nemotron_omcat_legacy_conversation_monolithic`` (NeMo-RL's
  ``cook_omcat_legacy_conversation_monolithic``): a WebDataset sample whose ``.json`` member holds the
  conversation and whose media are members named by extension. The fields ``speech``, ``speeches``,
  ``audio``, ``audios`` are renamed ``sound``, ``images`` ``image``, ``videos`` ``video``; the tags
  ``<speech>``, ``<speeches>``, ``<audio>``, ``<audios>``, ``<images>``, ``<videos>`` are read as
  their canonical tag. ``<image>`` takes the first member of ``png``, ``jpeg``, ``jpg``, ``img``,
  ``<video>`` ``mp4``, ``<sound>`` ``wav``, ``flac``, ``mp3`` (audio); ``<video-sound>`` has no member
  mapping in OMCAT's schema and is refused (as NeMo-RL does).

Where NeMo-RL silently drops data these cookers refuse the sample (``media_reference``): a media
field no tag uses (NeMo-RL checks only the exact fields ``image``, ``video``, ``sound`` and
``video-sound``; here every field starting with ``image``, ``video``, ``sound``, ``vis_video`` or
``vis_sound`` counts, so a ``video-sound`` field in the first schema, which no tag reads, is an
error), an alias field next to its canonical one (OMCAT), a media member of the sample no tag uses,
and a member referenced twice. Subflavors: those of the other NeMo-RL-named cookers
(``nemotron_general.NEMOTRON_SUBFLAVORS``), applied as they apply them (``make_conversation(..., format_last_only=True)``:
last-turn-only training and ``tool_response_as_turn_boundary`` left to the prompt format).
"""

from __future__ import annotations

import re
from typing import Any, Callable, Optional

from megatron.energon import stateless

from energon_nemotron.cookers.base import field_list, payload, register, sample_where, text_of
from energon_nemotron.cookers.conversations import check_members_used, make_conversation, merge_text
from energon_nemotron.cookers.media import media_ref
from energon_nemotron.cookers.nemotron_general import NEMOTRON_SUBFLAVORS
from energon_nemotron.errors import DataError
from energon_nemotron.types import Conversation, MediaPart, MediaRef, Message

#: the only senders of these schemas
LEGACY_ROLES = {"human": "user", "gpt": "assistant"}
LEGACY_MODALITIES = ("image", "video", "audio")

AUDIO_TAG_RE = re.compile(r"<(image|video|sound|video-sound)>")
#: tag -> the (field-name prefix, modality) pairs it expands to, in order
AUDIO_TAG_FIELDS = {
    "image": (("image", "image"),),
    "video": (("video", "video"),),
    "sound": (("sound", "audio"),),
    "video-sound": (("vis_video", "video"), ("vis_sound", "audio")),
}
#: prefix -> the longer tag names its fields must not start with
PREFIX_EXCLUDES = {"video": ("video-sound",)}
#: a payload field starting with one of these is a media field (every one must be used by a tag)
MEDIA_PREFIXES = ("image", "video", "sound", "vis_video", "vis_sound")
AUDIO_SCHEMA = ('{"conversations": [{"from": "human"|"gpt", "value"}], "image*"/"video*"/"sound*"/"vis_video*"/'
                '"vis_sound*": PATH | {"value"|"path"|"member", "metadata"}} with one <image>, <video>, <sound>, '
                '<video-sound> tag each at most (Megatron-LM\'s audio_conversation schema)')

OMCAT_ALIASES = {"speech": "sound", "speeches": "sound", "audio": "sound", "audios": "sound",
                 "images": "image", "videos": "video"}
OMCAT_TAG_RE = re.compile(r"<(image|video|sound|video-sound|speech|speeches|audio|audios|images|videos)>")
#: canonical tag -> (member extensions in order of preference, modality)
OMCAT_MEMBERS = {"image": (("png", "jpeg", "jpg", "img"), "image"), "video": (("mp4",), "video"),
                 "sound": (("wav", "flac", "mp3"), "audio")}
#: the canonical payload fields that, when present, a tag must use
OMCAT_FIELDS = ("image", "video", "sound", "video-sound")
OMCAT_SCHEMA = ('WebDataset sample: .json {"conversations": [{"from": "human"|"gpt", "value"}]} with one <image>, '
                '<video>, <sound> (<audio>, <speech>, ...) tag each at most, media members by extension '
                '(png/jpeg/jpg/img, mp4, wav/flac/mp3) (OMCAT\'s legacy monolithic schema)')


def legacy_messages(turns: list, where: str, tag_re: re.Pattern, expand: Callable[[str, int], list],
                    aliases: Optional[dict] = None) -> list[Message]:
    """The messages of a legacy conversation: roles by ``LEGACY_ROLES``, each value split on
    ``tag_re`` (white-space-only text dropped), each tag (normalised by ``aliases``) replaced by
    ``expand(tag, turn_index)``'s parts; a tag seen a second time is ``media_reference``."""
    aliases = aliases or {}
    seen: dict[str, int] = {}
    messages: list[Message] = []
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise DataError(where, f"turn {i} must be an object with 'from' and 'value', got {type(turn).__name__}")
        sender = turn.get("from")
        role = LEGACY_ROLES.get(sender) if isinstance(sender, str) else None
        if role is None:
            raise DataError(where, f"turn {i} has unknown sender {sender!r} (known: {', '.join(LEGACY_ROLES)})",
                            "unknown_role")
        text = text_of(turn.get("value"), where, f"turn {i} value")
        parts: list = []
        for j, piece in enumerate(tag_re.split(text)):
            if j % 2 == 0:                          # text between tags (the odd pieces are the tag names)
                if piece.strip():
                    parts.append(piece)
                continue
            tag = aliases.get(piece, piece)
            if tag in seen:
                named = f"<{piece}> (read as <{tag}>)" if piece != tag else f"<{tag}>"
                raise DataError(where, f"turn {i}: tag {named} appears a second time (first in turn {seen[tag]}); "
                                       "each tag may appear once per conversation", "media_reference")
            seen[tag] = i
            parts.extend(expand(tag, i))
        messages.append(Message(role, merge_text(parts)))
    return messages


def entry_of(value: Any, key: str, where: str) -> tuple[str, Optional[dict]]:
    """(path or member name, metadata) of the media field ``key``: a string, or an object with
    ``value``, ``path`` or ``member`` (in that precedence) and optional ``metadata``."""
    metadata = None
    if isinstance(value, dict):
        name = next((k for k in ("value", "path", "member") if k in value), None)
        if name is None:
            raise DataError(where, f"field {key!r} needs 'value', 'path' or 'member', got keys {sorted(value)}")
        value, metadata = value[name], value.get("metadata")
    if not isinstance(value, str) or not value:
        raise DataError(where, f"field {key!r} must hold one path (a non-empty string) or {{'value'|'path'|'member': "
                               f"PATH, 'metadata'?: {{...}}}}, got {type(value).__name__}")
    return value, metadata


def prefixed_fields(obj: dict, prefix: str) -> list[str]:
    """The payload fields starting with ``prefix`` (JSON key order), without those starting with a
    longer tag's name (``PREFIX_EXCLUDES``: ``video`` does not take ``video-sound``)."""
    excluded = PREFIX_EXCLUDES.get(prefix, ())
    return [k for k in obj if k.startswith(prefix) and not k.startswith(excluded)]


class LegacyMedia:
    """The media of one sample in order of reference, with the payload fields and the sample
    members they used (a member may be referenced once)."""

    def __init__(self, sample: dict, where: str) -> None:
        self.sample, self.where = sample, where
        self.media: list[MediaRef] = []
        self.fields: list[str] = []
        self.members: list[str] = []

    def add(self, ref: MediaRef, tag: str) -> MediaPart:
        """Append ``ref``; a sample member taken a second time is ``media_reference``."""
        member = ref.name if ref.name in self.sample and not ref.name.startswith("__") else None
        if member is not None:
            if member in self.members:
                raise DataError(self.where, f"tag <{tag}> references member {member!r} a second time",
                                "media_reference")
            self.members.append(member)
        self.media.append(ref)
        return MediaPart(ref.modality, len(self.media) - 1)


def audio_tag_media(obj: dict, tag: str, turn: int, media: LegacyMedia) -> list[MediaPart]:
    """The media parts of one ``audio_conversation`` tag: every field of each of its prefixes."""
    parts = []
    for prefix, modality in AUDIO_TAG_FIELDS[tag]:
        keys = prefixed_fields(obj, prefix)
        if not keys:
            raise DataError(media.where, f"turn {turn}: tag <{tag}> needs a field starting with {prefix!r}; the payload "
                                         f"has none (keys: {sorted(obj)})", "media_reference")
        for key in keys:
            value, metadata = entry_of(obj[key], key, media.where)
            parts.append(media.add(media_ref(media.sample, value, modality, media.where, metadata), tag))
            media.fields.append(key)
    return parts


@register("nemotron_audio_conversation_jsonl", NEMOTRON_SUBFLAVORS, schema=AUDIO_SCHEMA,
          modalities=LEGACY_MODALITIES)
@stateless
def cook_audio_conversation_jsonl(sample: dict, **aux) -> Conversation:
    """Megatron-LM's ``audio_conversation`` schema (see the module docstring): tags take the payload
    fields of their prefixes; every media field must be used by a tag."""
    where = sample_where(sample)
    obj = payload(sample, where)
    turns = field_list(obj, "conversations", where)
    media = LegacyMedia(sample, where)
    messages = legacy_messages(turns, where, AUDIO_TAG_RE, lambda tag, i: audio_tag_media(obj, tag, i, media))
    unused = [k for k in obj if k.startswith(MEDIA_PREFIXES) and k not in media.fields]
    if unused:
        more = f" (nor are {unused[1:]})" if len(unused) > 1 else ""
        hint = (" (<video-sound> reads the vis_video*/vis_sound* fields; <video> does not take video-sound*)"
                if unused[0].startswith("video-sound") else "")
        raise DataError(where, f"field {unused[0]!r} is never referenced by a tag{hint}{more}: every media field "
                               "must be used", "media_reference")
    check_members_used(sample, media.members, where)
    return make_conversation(sample, messages, [0], where, media.media, format_last_only=True)


def omcat_payload(obj: dict, where: str) -> dict:
    """The payload with the alias fields renamed to their canonical names (``OMCAT_ALIASES``); an
    alias next to another field of the same canonical name is ``media_reference``."""
    out = dict(obj)
    origin = {c: c for c in set(OMCAT_ALIASES.values()) if c in obj}
    for alias, canonical in OMCAT_ALIASES.items():
        if alias not in out:
            continue
        if canonical in origin:
            raise DataError(where, f"fields {origin[canonical]!r} and {alias!r} both hold the {canonical!r} field "
                                   f"({alias!r} is an alias of {canonical!r}): use one", "media_reference")
        origin[canonical] = alias
        out[canonical] = out.pop(alias)
    return out


def omcat_member(sample: dict, tag: str, where: str) -> tuple[str, str]:
    """(member name, modality) of an OMCAT tag: the first of its extensions (``OMCAT_MEMBERS``)
    that is a member (the exact name, else one whose lower case equals it)."""
    if tag == "video-sound":
        raise DataError(where, "no member mapping is defined for <video-sound> in OMCAT's schema (NeMo-RL refuses "
                               "it too)", "unsupported_media")
    extensions, modality = OMCAT_MEMBERS[tag]
    members = [k for k in sample if not k.startswith("__")]
    for ext in extensions:
        found = [k for k in members if k == ext] or [k for k in members if k.lower() == ext]
        if found:
            return found[0], modality
    raise DataError(where, f"tag <{tag}> needs a member with extension {', '.join(extensions)}; the sample has none "
                           f"(members: {sorted(members)})", "missing_media")


@register("nemotron_omcat_legacy_conversation_monolithic", NEMOTRON_SUBFLAVORS, schema=OMCAT_SCHEMA,
          modalities=LEGACY_MODALITIES)
@stateless
def cook_omcat_legacy_conversation_monolithic(sample: dict, **aux) -> Conversation:
    """OMCAT's legacy monolithic schema (see the module docstring): tags take the sample's members
    by extension; every canonical media field and every media member must be used."""
    where = sample_where(sample)
    obj = omcat_payload(payload(sample, where), where)
    turns = field_list(obj, "conversations", where)
    media = LegacyMedia(sample, where)
    tags: list[str] = []

    def expand(tag: str, turn: int) -> list[MediaPart]:
        member, modality = omcat_member(sample, tag, where)
        tags.append(tag)
        return [media.add(MediaRef(modality, sample[member], {}, name=member), tag)]

    messages = legacy_messages(turns, where, OMCAT_TAG_RE, expand, OMCAT_ALIASES)
    unused = [f for f in OMCAT_FIELDS if f in obj and f not in tags]
    if unused:
        raise DataError(where, f"media field {unused[0]!r} is never referenced by a tag (nor a tag alias): every "
                               "media field must be used", "media_reference")
    check_members_used(sample, media.members, where)
    return make_conversation(sample, messages, [0], where, media.media, format_last_only=True)
