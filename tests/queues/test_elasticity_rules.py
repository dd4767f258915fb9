"""Properties of the elasticity formulas (SPEC), checked over many random inputs."""

import math
from fractions import Fraction

from hypothesis import given
from hypothesis import strategies as st

from queues.elasticity import Signals, desired_count, normalise

CAP = 1000
counts = st.integers(min_value=0, max_value=5000)
thresholds = st.sampled_from([0.05, 0.1, 0.25, 0.3, 0.5, 0.6, 0.7, 0.75, 0.9, 1.0])


@st.composite
def bounds(draw):
    low = draw(st.integers(min_value=0, max_value=50))
    high = draw(st.one_of(st.none(), st.integers(min_value=max(low, 1), max_value=2000)))
    return low, high


@given(bounds(), counts, counts)
def test_fully_elastic_is_busy_plus_pending_clamped(limits, busy, pending):
    low, high = limits
    got = desired_count(
        "fully_elastic", {"min": low, "max": high}, Signals(busy + 1, busy, pending), cap=CAP
    )
    top = CAP if high is None else min(high, CAP)
    assert got == max(low, min(busy + pending, top))


@given(bounds(), thresholds, counts, counts)
def test_pool_with_threshold_keeps_utilisation_at_or_below_the_threshold(
    limits, threshold, busy, pending
):
    low, high = limits
    params = {"min": low, "max": high, "threshold": threshold}
    got = desired_count("pool_with_threshold", params, Signals(busy, busy, pending), cap=CAP)
    top = CAP if high is None else min(high, CAP)
    assert max(low, 0) <= got <= max(low, top)
    work = busy + pending
    if low <= math.ceil(Fraction(work) / Fraction(str(threshold))) <= top:
        # the fewest daemons with utilisation work/got at or below the threshold
        assert work == 0 or Fraction(work, got) <= Fraction(str(threshold))
        # (one daemon is the fewest for any work: zero daemons hold none)
        assert got in (0, 1, low) or Fraction(work, got - 1) > Fraction(str(threshold))


@given(st.integers(min_value=1, max_value=2000), counts, counts)
def test_max_count_scales_to_zero_and_never_past_max(high, busy, pending):
    got = desired_count("max_count", {"max": high}, Signals(busy, busy, pending), cap=CAP)
    assert got == min(busy + pending, high, CAP)


@given(st.integers(min_value=0, max_value=3000), counts, counts)
def test_fixed_is_min_whatever_the_load(low, busy, pending):
    assert desired_count("fixed", {"min": low}, Signals(busy, busy, pending), cap=CAP) == min(
        low, CAP
    )


@given(
    st.sampled_from(["fixed", "fully_elastic", "pool_with_threshold", "max_count"]),
    st.one_of(st.none(), st.integers(min_value=-5, max_value=40)),
    st.one_of(st.none(), st.integers(min_value=-5, max_value=40)),
    st.one_of(st.none(), st.floats(min_value=-1, max_value=2, allow_nan=False)),
)
def test_normalise_accepts_only_what_the_kind_can_use(kind, low, high, threshold):
    values, errors = normalise(kind, {"min": low, "max": high, "threshold": threshold})
    if not errors:
        # whatever is accepted makes sense: ordered bounds, a usable threshold
        if values["min"] is not None and values["max"] is not None:
            assert 0 <= values["min"] <= values["max"]
        if values["max"] is not None:
            assert values["max"] >= 1
        if values["threshold"] is not None:
            assert 0 < values["threshold"] <= 1
        assert kind != "max_count" or (values["max"] is not None and low is None)
        assert kind != "fixed" or (values["min"] is not None and high is None)
        assert kind != "pool_with_threshold" or values["threshold"] is not None
