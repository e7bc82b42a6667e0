"""Resume: loader states saved, checked and restored exactly, on the same shape or another.

A loader's ``state_dict()`` holds its position and the configuration's :func:`fingerprint`;
:func:`save_state_file` / :func:`load_state_file` write and read it as JSON (``codec``: tagged
JSON, never pickle); ``checks`` matches a saved state to the loader restoring it, key by key, before
Energon sees it; ``worker_checkpoints`` settles the checkpoints of workers that delivered nothing;
``elastic`` resumes the epoch in progress on another data-parallel size or worker count
(:func:`merge_rank_states`).
"""

from energon_nemotron.resume.codec import decode_state, encode_state
from energon_nemotron.resume.elastic import merge_rank_states
from energon_nemotron.resume.files import FORMAT, VERSION, load_state_file, save_state_file
from energon_nemotron.resume.fingerprint import check_fingerprint, fingerprint, fingerprint_diff

__all__ = ["save_state_file", "load_state_file", "merge_rank_states", "fingerprint", "fingerprint_diff",
           "check_fingerprint", "encode_state", "decode_state", "FORMAT", "VERSION"]
