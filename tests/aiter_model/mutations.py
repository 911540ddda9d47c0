"""Plausible misreadings of aiter's source, for the tests that must fail when the model is wrong in that way."""
from . import metadata

_TRUE_FRAGMENTS = metadata._ParallelFill.fragments


def misread_fragments(fill, bid):
    """HEAD's parallel fill (v1_2_device.cuh at e4048607a5) with every piece after the first starting a whole CU's
    payload into the segment -- the wasted-start-CU rule (~314) -- rather than after the first piece's blocks
    (~305-306): keys are then read twice or never. Install with
    monkeypatch.setattr(metadata._ParallelFill, "fragments", misread_fragments)."""
    frags, wasted = _TRUE_FRAGMENTS(fill, bid)
    return [(index * fill.per_cu if index else begin, end, cu) for index, (begin, end, cu) in enumerate(frags)], wasted
