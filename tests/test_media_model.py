"""The media protocols the encoding room declares match what implements and calls them."""

from __future__ import annotations

import inspect

import pytest

from energon_packing.encoding.chat import VideoCosting

video = pytest.importorskip("energon_packing.media.video_side")


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


def test_the_layouts_call_media_with_the_protocols_arguments():
    """Both layouts decode their videos through ``decode_once(self.videos.media, videos,
    plans)``: each distinct clip once, called as the protocol declares ``media(data, plan)``
    (a call that did not bind to the protocol's signature raises here)."""
    from energon_packing.encoding.chat import decode_once

    calls = []

    class Side:
        def media(self, data, plan=None):
            inspect.signature(VideoCosting.media).bind(self, data, plan)
            calls.append((data, plan))
            return len(calls)

    assert _shape(Side.media) == _shape(VideoCosting.media)
    assert decode_once(Side().media, [b"a", b"b", b"a"], ["p0", "p1", "p2"]) == [1, 2, 1]
    assert calls == [(b"a", "p0"), (b"b", "p1")]
