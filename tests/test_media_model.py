"""The media protocols the encoding room declares match what implements and calls them."""

from __future__ import annotations

import inspect

import pytest

from energon_packing.encoding.chat import VideoCosting

video = pytest.importorskip("energon_packing.media.video")


def _shape(function) -> list[tuple[str, object, bool]]:
    """Parameter names, kinds and whether each has a default (annotations aside)."""
    return [
        (p.name, p.kind, p.default is not inspect.Parameter.empty)
        for p in inspect.signature(function).parameters.values()
    ]


@pytest.mark.parametrize("method", ["plan", "media"])
def test_the_video_protocol_is_the_video_side(method):
    """``VideoCosting`` is how the layouts call a video side; ``VideoSide`` is the one there
    is: their signatures are one (the protocol once said ``media(self, data)`` while both
    layouts called ``media(data, plan)``)."""
    assert _shape(getattr(VideoCosting, method)) == _shape(getattr(video.VideoSide, method))


def test_the_processor_layout_calls_media_with_the_protocols_arguments():
    from energon_packing.encoding.processor import ProcessorChat

    source = inspect.getsource(ProcessorChat._videos)
    assert "self.videos.media(data, plan)" in source
    assert [name for name, *_ in _shape(VideoCosting.media)][1:] == ["data", "plan"]
