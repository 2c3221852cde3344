import math

import pytest

from kdactl.bench.stats import geomean, median, summarize


def test_median_odd_even():
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([4.0, 1.0, 3.0, 2.0]) == 2.5
    with pytest.raises(ValueError):
        median([])


def test_geomean():
    assert geomean([1.0, 4.0]) == pytest.approx(2.0)
    assert geomean([2.0, 2.0, 2.0]) == pytest.approx(2.0)
    assert geomean([]) is None
    assert geomean([1.0, 0.0]) is None
    assert geomean([1.0, float("nan")]) is None


def test_summary_is_median_of_block_medians():
    # block medians 1.0, 2.0, 10.0 -> median 2.0; a plain median of all samples would be 2.0 too,
    # but the outlier 100 must not move it and min/max keep the extremes.
    s = summarize([[1.0, 1.0, 0.9], [2.0, 2.1, 1.9], [10.0, 100.0, 9.0]])
    assert s.median_ms == 2.0
    assert s.min_ms == 0.9 and s.max_ms == 100.0
    assert (s.block_lo_ms, s.block_hi_ms) == (1.0, 10.0)
    assert s.samples == 9 and s.blocks == 3
    assert s.spread == pytest.approx((10.0 - 1.0) / 2.0)


def test_summary_differs_from_flat_median():
    blocks = [[1.0, 1.0, 1.0, 1.0, 1.0], [5.0], [6.0]]
    assert summarize(blocks).median_ms == 5.0  # medians 1, 5, 6
    assert median([t for b in blocks for t in b]) == 1.0


def test_summary_rejects_bad_samples():
    with pytest.raises(ValueError):
        summarize([])
    with pytest.raises(ValueError):
        summarize([[1.0, math.nan]])
    with pytest.raises(ValueError):
        summarize([[1.0, -1.0]])


def test_summary_json():
    j = summarize([[1.0], [3.0]]).to_json()
    assert j["median_ms"] == 2.0 and j["blocks"] == 2 and j["spread"] == pytest.approx(1.0)
