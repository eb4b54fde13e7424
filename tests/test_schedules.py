from __future__ import annotations

import math

import pytest

from attnlab.training.schedules import cosine, inverse_sqrt, lr_multiplier


def test_inverse_sqrt_peaks_at_warmup_then_decays():
    assert inverse_sqrt(1, 100) == pytest.approx(0.01)
    assert inverse_sqrt(100, 100) == pytest.approx(1.0)
    assert inverse_sqrt(400, 100) == pytest.approx(0.5)


def test_inverse_sqrt_matches_t2t_noam_shape():
    d, warmup = 512, 4000
    noam = lambda s: d**-0.5 * min(s**-0.5, s * warmup**-1.5)
    peak = noam(warmup)
    for step in (1, 100, 4000, 10000, 100000):
        assert inverse_sqrt(step, warmup) * peak == pytest.approx(noam(step))


def test_cosine_warmup_and_floor():
    assert cosine(50, 100, 1000) == pytest.approx(0.5)
    assert cosine(100, 100, 1000) == pytest.approx(1.0)
    assert cosine(1000, 100, 1000, min_ratio=0.1) == pytest.approx(0.1)
    mid = cosine(550, 100, 1000)
    assert mid == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.5)))


def test_unknown_schedule_is_refused():
    with pytest.raises(ValueError, match="valid: inverse_sqrt"):
        lr_multiplier("linear", warmup_steps=1, total_steps=2)
