"""Several CPU tensors as one flat byte buffer, for pickling a batch between processes.

PyTorch's ``DataLoader`` sends every tensor of a batch from a worker through its own shared-memory
segment: with the default ``file_descriptor`` strategy each one is a file descriptor handed over a
Unix socket (the worker's resource-sharer thread accepts a connection per tensor, the main process
maps each segment). A text batch has six or more small tensors, and those hand-overs cost the main
process a third of its time at two workers, and even one hand-over costs about a millisecond (a
connection with an authentication handshake). :func:`pack` puts the tensors into one buffer: up to
:data:`BY_VALUE_MAX` bytes a NumPy array, which pickles by value (through the queue's pipe, no
segment at all); above it a tensor (in a worker allocated directly in shared memory), so a large
batch crosses as one segment. :func:`unpack` gives back views with the original dtypes and shapes
(bit-identical values).
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import numpy as np
import torch

from energon_nemotron.tensors.common import shared_empty

#: byte alignment of each tensor in the buffer (a view of any dtype needs its item size)
ALIGN = 16
#: the largest buffer sent by value (about four copies of it cost less than one segment hand-over)
BY_VALUE_MAX = 1 << 20


def pack(tensors: Sequence[torch.Tensor]) -> Optional[tuple[Any, list[tuple]]]:
    """``(buffer uint8 [N], layout)`` holding ``tensors`` (CPU, any dtype and shape), or None when
    one is not a CPU tensor (the caller pickles as usual). ``layout``: per tensor (byte offset,
    dtype, shape). The buffer is a NumPy array up to :data:`BY_VALUE_MAX` bytes, else a tensor,
    allocated in shared memory in a ``DataLoader`` worker."""
    layout, at = [], 0
    for t in tensors:
        if not isinstance(t, torch.Tensor) or t.device.type != "cpu" or t.is_sparse or t.requires_grad:
            return None
        layout.append((at, t.dtype, tuple(t.shape)))
        at += -(-t.numel() * t.dtype.itemsize // ALIGN) * ALIGN
    shared = at > BY_VALUE_MAX and torch.utils.data.get_worker_info() is not None
    buffer = shared_empty((at,), torch.uint8) if shared else torch.empty(at, dtype=torch.uint8)
    for t, view in zip(tensors, unpack(buffer, layout)):
        view.copy_(t)
    return (buffer.numpy() if at <= BY_VALUE_MAX else buffer), layout


def unpack(buffer: Any, layout: Sequence[tuple]) -> list[torch.Tensor]:
    """Views of ``buffer`` (uint8 [N] tensor or NumPy array, from :func:`pack`) with the dtypes and
    shapes of ``layout``."""
    if isinstance(buffer, np.ndarray):
        buffer = torch.from_numpy(buffer)
    return [buffer[offset:offset + math.prod(shape) * dtype.itemsize].view(dtype).view(shape)
            for offset, dtype, shape in layout]
