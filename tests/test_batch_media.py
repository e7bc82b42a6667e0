"""``MediaSpan`` and ``BatchMedia``: the typed media of a ``PackedBatch``, its dict views, which items
are a row's, and ``validate`` checking the media against their spans."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from energon_nemotron.batch import BatchMedia, MediaSpan, PackedBatch
from energon_nemotron.tensors import PackedTensor

IMAGE_ID, SOUND_ID = 9, 8


def image(key: str, start: int, grid: tuple[int, int], n: int) -> MediaSpan:
    return MediaSpan(kind="image", sample_key=key, token_start=start, num_tokens=n, placeholder_len=n + 2,
                     runs=((1, n),), grid=grid)


def two_rows() -> PackedBatch:
    """Row 0: an image of sample a; row 1: an audio clip, then an image, of sample b (S = 16)."""
    spans = [[image("a", 2, (2, 2), 3)],
             [MediaSpan(kind="audio", sample_key="b", token_start=1, num_tokens=2, placeholder_len=4,
                        runs=((1, 2),), clips=1), image("b", 8, (1, 2), 2)]]
    tokens = torch.ones(2, 16, dtype=torch.int64)
    tokens[0, 3:6] = IMAGE_ID
    tokens[1, 2:4] = SOUND_ID
    tokens[1, 9:11] = IMAGE_ID
    media = BatchMedia(pixel_values=PackedTensor.from_list([torch.zeros(4, 12), torch.ones(2, 12)]),
                       image_sizes=PackedTensor.from_list([torch.tensor([[2, 2]], dtype=torch.int32),
                                                           torch.tensor([[1, 2]], dtype=torch.int32)]),
                       num_frames=torch.tensor([1, 1], dtype=torch.int32),
                       num_units=torch.tensor([1, 1], dtype=torch.int32), patch_size=2,
                       sound_features=PackedTensor.from_list([torch.zeros(1, 5, 4)]),
                       sound_lengths=PackedTensor.from_list([torch.tensor([5])]))
    bounds = [torch.tensor([0, 16], dtype=torch.int32) for _ in range(2)]
    return PackedBatch(tokens=tokens, labels=torch.full((2, 16), -100), loss_mask=torch.zeros(2, 16),
                       position_ids=torch.arange(16).repeat(2, 1), cu_seqlens=bounds,
                       cu_seqlens_padded=[b.clone() for b in bounds], max_seqlen=[16, 16], sample_keys=[["a"], ["b"]],
                       media=media, media_spans=spans)


def test_as_dict_is_the_preview_view_in_its_order():
    tiled = MediaSpan(kind="image", sample_key="k", token_start=3, num_tokens=8, placeholder_len=10,
                      runs=[[1, 8]], grid=[4, 4], tiles=2)
    assert list(tiled.as_dict().items()) == [("kind", "image"), ("num_tokens", 8), ("placeholder_len", 10),
                                             ("runs", [[1, 8]]), ("grid", [4, 4]), ("tiles", 2),
                                             ("sample_key", "k"), ("token_start", 3)]
    video = MediaSpan(kind="video", sample_key="v", token_start=0, num_tokens=4, placeholder_len=20,
                      runs=((5, 2), (15, 2)), grid=(2, 4), frames=3)
    assert list(video.as_dict()) == ["kind", "num_tokens", "placeholder_len", "runs", "frames", "grid",
                                     "sample_key", "token_start"]
    for span in (tiled, video):
        assert MediaSpan.from_dict(span.as_dict()) == span
    assert tiled.runs == ((1, 8),) and tiled.grid == (4, 4)         # stored as tuples
    with pytest.raises(TypeError):
        MediaSpan(kind="audio", sample_key="s", token_start=0, num_tokens=1, placeholder_len=3, runs=[(1.5, 1)])
    with pytest.raises(ValueError, match="kind"):
        MediaSpan(kind="pointcloud", sample_key="s", token_start=0, num_tokens=1, placeholder_len=3, runs=[(1, 1)])


def test_batch_media_reads_like_the_dict_it_replaced():
    media = two_rows().media
    assert list(media) == media.keys() == ["pixel_values", "image_sizes", "num_frames", "num_units",
                                           "sound_features", "sound_lengths"]
    assert media["pixel_values"] is media.pixel_values and "patch_size" not in media and len(media) == 6
    assert not BatchMedia() and "pixel_values" not in BatchMedia() and BatchMedia().get("pixel_values") is None
    with pytest.raises(KeyError):
        BatchMedia()["pixel_values"]
    moved = media.map(lambda t: t.to(torch.float64) if isinstance(t, torch.Tensor) else t)
    assert moved.num_frames.dtype == torch.float64 and moved.patch_size == 2
    with pytest.raises(TypeError, match="BatchMedia"):
        two_rows().replace(media=dict(media.items()))


def test_media_items_say_which_items_are_a_row():
    batch = two_rows()
    batch.validate()
    assert [(s.kind, i) for s, i in batch.media_items(0)] == [("image", 0)]
    assert [(s.kind, i) for s, i in batch.media_items(1)] == [("audio", 0), ("image", 1)]


def _with_media(**changes):
    batch = two_rows()
    return batch.replace(media=dataclasses.replace(batch.media, **changes))


def _with_span(row: int, k: int, **changes):
    batch = two_rows()
    batch.media_spans[row][k] = dataclasses.replace(batch.media_spans[row][k], **changes)
    return batch


@pytest.mark.parametrize("make, match", [
    (lambda: _with_media(pixel_values=PackedTensor.from_list([torch.zeros(4, 12)])),
     r"^row 1, image of b: no visual item 1 in media.pixel_values"),
    (lambda: _with_media(sound_features=None, sound_lengths=None), r"^row 1, audio of b: no audio item 0"),
    (lambda: _with_media(patch_size=4), r"pixel_values rows are \[12\], patches of 4 px"),
    (lambda: _with_media(num_frames=torch.tensor([1, 2], dtype=torch.int32)), r"^row 1, image of b: .*num_frames"),
    (lambda: _with_media(num_units=torch.tensor([1, 2], dtype=torch.int32)), r"^row 1, image of b: .*num_units"),
    (lambda: _with_media(num_units=None), r"^row 0, image of a: no visual item 0 in media.num_units"),
    (lambda: _with_span(1, 1, grid=(2, 1)), r"^row 1, image of b: image_sizes \[\[1, 2\]\] are not its grid"),
    (lambda: _with_span(0, 0, runs=((2, 4),), num_tokens=4), r"^row 0, image of a: run \(2, 4\) is not inside"),
    (lambda: _with_span(0, 0, token_start=3), r"^row 0, image of a: positions 4..6 are not one run"),
    (lambda: _with_span(0, 0, sample_key="b"), r"^row 0, image of b: not a sample of the row"),
    (lambda: _with_span(1, 1, token_start=2), r"^row 1, image of b: placeholder \[2, 6\) is not inside"),
    (lambda: _with_span(1, 0, clips=2), r"^row 1, audio of b: 2 clips"),
])
def test_validate_checks_the_media_against_their_spans(make, match):
    batch = make()
    with pytest.raises(ValueError, match=match):
        batch.validate()
