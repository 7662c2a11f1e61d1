"""Property tests of the pure pod pickers: least-load (power of two choices), prefix affinity (consistent
hashing with bounded loads), round-robin, the prompt prefix they hash, and outlier detection."""

from __future__ import annotations

import random
from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servlane_core.routing.bounded_hashing import home, load_bound, pick_bounded, ring_of
from servlane_core.routing.endpoint_pick import Endpoint, RoundRobin, candidates, least_loaded, service_of
from servlane_core.routing.outliers import OutlierDetector, OutlierRules
from servlane_core.routing.prompt_prefix import prompt_prefix

PROPERTY_SETTINGS = settings(
    max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)


def endpoint(i: int, ready: bool = True, terminating: bool = False) -> Endpoint:
    return Endpoint(f"10.0.0.{i}:8000", f"pod-{i}", ready, terminating)


endpoints_st = st.lists(
    st.builds(endpoint, st.integers(1, 40), st.booleans(), st.booleans()),
    min_size=1,
    max_size=12,
    unique_by=lambda e: e.address,
)


@PROPERTY_SETTINGS
@given(
    endpoints=endpoints_st,
    ejected_bits=st.lists(st.booleans(), min_size=12, max_size=12),
    loads=st.lists(st.integers(0, 50), min_size=12, max_size=12),
    seed=st.integers(0, 2**32),
)
def test_least_load_never_picks_an_ejected_or_ineligible_endpoint(
    endpoints: list[Endpoint], ejected_bits: list[bool], loads: list[int], seed: int
) -> None:
    ejected = {e.address for e, bit in zip(endpoints, ejected_bits, strict=False) if bit}
    load = {e.address: n for e, n in zip(endpoints, loads, strict=False)}
    options = candidates(endpoints, ejected)
    picked = least_loaded(options, load, random.Random(seed))
    eligible = [e for e in endpoints if e.eligible]
    if not eligible:
        assert picked is None
        return
    assert picked is not None
    assert picked.eligible
    if any(e.address not in ejected for e in eligible):
        assert picked.address not in ejected
    # Power of two choices: never the single most loaded candidate when there are at least two.
    if len(options) >= 2:
        assert load[picked.address] <= max(load[e.address] for e in options)
        worst = max(options, key=lambda e: load[e.address])
        if sum(load[e.address] == load[worst.address] for e in options) == 1:
            assert picked != worst


@PROPERTY_SETTINGS
@given(endpoints=endpoints_st, exclude_bits=st.lists(st.booleans(), min_size=12, max_size=12))
def test_candidates_leave_out_the_excluded_and_fall_back_to_ejected_ones_only(
    endpoints: list[Endpoint], exclude_bits: list[bool]
) -> None:
    exclude = {e.address for e, bit in zip(endpoints, exclude_bits, strict=False) if bit}
    every = {e.address for e in endpoints}
    options = candidates(endpoints, ejected=every, exclude=exclude)  # all ejected: still some to try
    assert {e.address for e in options} == {e.address for e in endpoints if e.eligible and e.address not in exclude}


def test_least_load_spreads_to_the_less_loaded() -> None:
    pods = [endpoint(i) for i in range(1, 4)]
    load = {pods[0].address: 10, pods[1].address: 0, pods[2].address: 0}
    rng = random.Random(1)
    picks = Counter(least_loaded(pods, load, rng).address for _ in range(3000))  # type: ignore[union-attr]
    assert pods[0].address not in picks or picks[pods[0].address] == 0


@PROPERTY_SETTINGS
@given(size=st.integers(1, 10), rounds=st.integers(1, 30))
def test_round_robin_is_even(size: int, rounds: int) -> None:
    pods = [endpoint(i) for i in range(1, size + 1)]
    rr = RoundRobin()
    shuffled = random.Random(rounds)
    counts: Counter[str] = Counter()
    for _ in range(rounds * size + rounds % size):
        order = pods[:]
        shuffled.shuffle(order)  # the list may arrive in any order
        picked = rr.pick("svc", order)
        assert picked is not None
        counts[picked.address] += 1
    assert max(counts.values()) - min(counts.get(p.address, 0) for p in pods) <= 1


@PROPERTY_SETTINGS
@given(size=st.integers(2, 8), keys=st.lists(st.text(min_size=1, max_size=30), min_size=1, max_size=40, unique=True))
def test_chwbl_removing_a_pod_moves_only_its_keys(size: int, keys: list[str]) -> None:
    pods = [endpoint(i) for i in range(1, size + 1)]
    ring = ring_of(tuple(p.address for p in pods))
    gone = pods[size // 2]
    fewer = [p for p in pods if p != gone]
    smaller = ring_of(tuple(p.address for p in fewer))
    for key in keys:
        before = home(ring, key, pods)
        after = home(smaller, key, fewer)
        assert before is not None
        assert after is not None
        if before != gone:
            assert after == before
        # Walking past a candidate the ring still holds (ejected, not ready) moves the same keys, the same way.
        assert home(ring, key, fewer) == after


@PROPERTY_SETTINGS
@given(
    size=st.integers(1, 8),
    key=st.text(min_size=1, max_size=50),
    loads=st.lists(st.integers(0, 20), min_size=8, max_size=8),
)
def test_chwbl_keeps_a_prefix_home_while_under_its_bound_and_never_picks_over_it(
    size: int, key: str, loads: list[int]
) -> None:
    pods = [endpoint(i) for i in range(1, size + 1)]
    ring = ring_of(tuple(p.address for p in pods))
    load = {p.address: n for p, n in zip(pods, loads, strict=False)}
    bound = load_bound(sum(load.values()), size)
    picked = pick_bounded(ring, key, pods, load)
    assert picked is not None
    assert load[picked.address] < bound
    own = home(ring, key, pods)
    assert own is not None
    if load[own.address] < bound:
        assert picked == own
    assert pick_bounded(ring, key, pods, load) == picked  # deterministic: the same key, the same loads


def test_chwbl_overflow_stays_bounded_under_one_hot_prefix() -> None:
    pods = [endpoint(i) for i in range(1, 5)]
    ring = ring_of(tuple(p.address for p in pods))
    load: Counter[str] = Counter()
    for _ in range(100):  # 100 concurrent requests with the same prefix
        picked = pick_bounded(ring, "one system prompt", pods, load)
        assert picked is not None
        load[picked.address] += 1
    assert max(load.values()) <= load_bound(99, 4)
    assert len(load) == 4


def test_prompt_prefix_keeps_a_conversation_on_one_key() -> None:
    first = {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]}
    later = {
        "messages": [
            *first["messages"],
            {"role": "assistant", "content": "hi there"},
            {"role": "user", "content": "and then?"},
        ]
    }
    other = {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "bonjour"}]}
    assert prompt_prefix(first) == prompt_prefix(later)
    assert prompt_prefix(first) != prompt_prefix(other)
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hello"}]}]}
    assert prompt_prefix(parts) == prompt_prefix({"messages": [{"role": "user", "content": "hello"}]})
    assert prompt_prefix({"prompt": "x" * 5000}) == "x" * 2048
    assert prompt_prefix({"prompt": ["abc", "def"]}) == "abc"
    assert prompt_prefix({"input": [1, 2, 3]}) == "[1,2,3]"
    assert prompt_prefix({"model": "m"}) is None


def test_service_of_reads_cluster_dns_urls_only() -> None:
    assert service_of("http://model-chat.prod.svc.cluster.local:8000") == ("prod", "model-chat")
    assert service_of("http://model-chat.prod.svc:8000") == ("prod", "model-chat")
    assert service_of("http://127.0.0.1:9000") is None
    assert service_of("http://example.com:80") is None
    assert service_of("") is None


RULES = OutlierRules(consecutive=3, base_seconds=10.0, max_seconds=25.0)


def test_outliers_eject_after_consecutive_failures_for_a_growing_time() -> None:
    detector = OutlierDetector(RULES)
    group = ["a", "b"]
    assert not detector.record_failure("a", group, 0.0)
    detector.record_success("a", 0.5)  # a success clears the count
    assert not detector.record_failure("a", group, 1.0)
    assert not detector.record_failure("a", group, 1.0)
    assert detector.record_failure("a", group, 1.0)
    assert detector.is_ejected("a", 10.9)
    assert not detector.is_ejected("a", 11.0)
    for _ in range(3):
        ejected = detector.record_failure("a", group, 12.0)
    assert ejected
    assert detector.is_ejected("a", 31.9)
    assert not detector.is_ejected("a", 32.0)
    for _ in range(3):
        detector.record_failure("a", group, 40.0)
    assert detector.is_ejected("a", 64.9)
    assert not detector.is_ejected("a", 65.0)


def test_outliers_never_eject_the_last_endpoint() -> None:
    detector = OutlierDetector(RULES)
    for _ in range(3):
        detector.record_failure("b", ["a", "b"], 0.0)
    assert detector.is_ejected("b", 1.0)
    for _ in range(5):
        assert not detector.record_failure("a", ["a", "b"], 1.0)  # b is out: a is the last one
    assert not detector.is_ejected("a", 1.0)
    assert detector.record_failure("a", ["a", "b"], 11.0)  # b is back: a's failures count now


@PROPERTY_SETTINGS
@given(events=st.lists(st.tuples(st.sampled_from("abc"), st.booleans(), st.floats(0, 5)), max_size=80))
def test_outliers_always_leave_one_endpoint_of_the_group(events: list[tuple[str, bool, float]]) -> None:
    detector = OutlierDetector(RULES)
    group = ["a", "b", "c"]
    now = 0.0
    for address, failed, step in events:
        now += step
        if failed:
            detector.record_failure(address, group, now)
        else:
            detector.record_success(address, now)
        assert len(detector.ejected(group, now)) < len(group)


def test_outliers_shrink_the_penalty_after_healthy_time() -> None:
    detector = OutlierDetector(RULES)
    for at in (0.0, 20.0):  # ejected twice: the second time for 2 x base, until 40
        for _ in range(3):
            detector.record_failure("a", ["a", "b"], at)
    detector.record_success("a", 70.0)  # 30 s healthy since coming back: the count shrinks to zero
    for _ in range(3):
        detector.record_failure("a", ["a", "b"], 71.0)
    assert not detector.is_ejected("a", 81.0)  # one base time again, not three
