"""Media (image, video, audio): planned from headers before packing, decoded only when packed.

Each kind has ``plan_*`` (token counts and layout from metadata, nothing decoded) and
``process_*`` (decode, resize, patchify or compute features) in its module; ``handlers`` wires them
for the task encoder (``MediaHandlers``) and names the placeholder tokens.
"""

from energon_nemotron.media.audio import AudioOptions, AudioPlan, plan_audio, process_audio
from energon_nemotron.media.handlers import MEDIA_COUNTERS, MediaHandlers, PlannedMedia, read_payload
from energon_nemotron.media.image import ImageOptions, ImagePlan, plan_image
from energon_nemotron.media.image_pixels import process_image
from energon_nemotron.media.video import VideoOptions, VideoPlan, plan_video
from energon_nemotron.media.video_frames import process_video

__all__ = ["MediaHandlers", "PlannedMedia", "MEDIA_COUNTERS", "read_payload", "ImageOptions", "ImagePlan",
           "plan_image", "process_image", "VideoOptions", "VideoPlan", "plan_video", "process_video", "AudioOptions",
           "AudioPlan", "plan_audio", "process_audio"]
