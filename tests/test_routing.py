"""Unit tests of the request routers (agents/routing/routers.py) and the simulator's prefix cache, on hand-made states."""

from __future__ import annotations

import pytest

from sao.agents.routing.routers import (
    CacheAware,
    Pinned,
    ReplicaView,
    RoundRobin,
    RouterConfigError,
    RouteRequest,
    eligible,
    make_router,
)
from sao.rl.rollout.sim.config import RoutingConfig
from sao.rl.rollout.sim.routing import PrefixCache, Slot, TurnPlacer


def view(rid: int, running: int = 0, *, version: int = 0, holds: tuple[int, ...] = (), kv: float = 0.0,
         accepting: bool = True, capacity: int = 10) -> ReplicaView:
    return ReplicaView(rid, version, running, 0, kv, capacity, frozenset(holds), accepting)


# ---------------------------------------------------------------- constraints


def test_eligible_keeps_c1_and_the_version_floor():
    rs = [view(0, version=3), view(1, version=4), view(2, version=4, accepting=False), view(3, version=5)]
    assert [r.rid for r in eligible(RouteRequest(7, version=4), rs)] == [1]  # C1: exactly 4; 2 is syncing
    assert [r.rid for r in eligible(RouteRequest(7, min_version=4), rs)] == [1, 3]  # async: never older
    assert [r.rid for r in eligible(RouteRequest(7), rs)] == [0, 1, 3]


def test_pressure_is_the_larger_of_slot_use_and_kv_use():
    assert view(0, 5, capacity=10).pressure == 0.5
    assert view(0, 1, capacity=10, kv=0.9).pressure == 0.9  # KV nearly full though few requests run
    assert ReplicaView(0, 0, running=2, queued=3, capacity=10).pressure == 0.5  # queued requests count


# ---------------------------------------------------------------- cache-aware


def test_a_later_turn_stays_with_its_prefix_within_the_margin():
    r = CacheAware(margin=0.25, margin_per_ktoken=0.0)
    rs = [view(0, 4, holds=(7,)), view(1, 2)]  # holder 0.4 vs least loaded 0.2: gap 0.2 <= 0.25
    assert r.choose(RouteRequest(7, turn=2), rs) == 0


def test_a_later_turn_leaves_an_overloaded_holder():
    r = CacheAware(margin=0.25, margin_per_ktoken=0.0)
    rs = [view(0, 6, holds=(7,)), view(1, 2), view(2, 3)]  # gap 0.6 - 0.2 = 0.4 > 0.25
    assert r.choose(RouteRequest(7, turn=2), rs) == 1


def test_a_longer_prefix_earns_a_wider_margin():
    # gap 0.3: margin 0.25 alone moves it; + 0.05 per 1k tokens x 2000 tokens = 0.35 keeps it
    r = CacheAware(margin=0.25, margin_per_ktoken=0.05)
    rs = [view(0, 5, holds=(7,)), view(1, 2)]
    assert r.allowed_gap(RouteRequest(7, turn=1, prefix_tokens=2000)) == pytest.approx(0.35)
    assert r.choose(RouteRequest(7, turn=1, prefix_tokens=0), rs) == 1
    assert r.choose(RouteRequest(7, turn=1, prefix_tokens=2000), rs) == 0


def test_new_trajectories_go_to_the_least_loaded_replica():
    r = CacheAware()
    rs = [view(0, 3), view(1, 1, kv=0.5), view(2, 2), view(3, 2)]  # pressures 0.3, 0.5, 0.2, 0.2
    assert r.choose(RouteRequest(9, turn=0), rs) == 2  # tie 2 vs 3: fewer requests, then lowest id
    rs_holding = [view(0, 9, holds=(9,)), view(1, 0)]
    assert r.choose(RouteRequest(9, turn=0), rs_holding) == 1  # turn 0 has no prefix to follow


def test_cache_aware_never_follows_a_prefix_onto_the_wrong_version():
    r = CacheAware()
    rs = [view(0, 0, version=3, holds=(7,)), view(1, 8, version=4)]
    assert r.choose(RouteRequest(7, turn=3, version=4), rs) == 1  # C1 beats locality
    assert r.choose(RouteRequest(7, turn=3, min_version=4), rs) == 1  # async: never staler
    assert r.choose(RouteRequest(7, turn=3, version=5), rs) is None  # nobody serves version 5


def test_cache_aware_rejects_negative_margins():
    with pytest.raises(RouterConfigError, match="margins"):
        CacheAware(margin=-0.1)


# ---------------------------------------------------------------- round robin and pinned


def test_round_robin_cycles_over_eligible_replicas_and_ignores_caches():
    r = RoundRobin()
    rs = [view(0, holds=(7,)), view(1), view(2, accepting=False), view(3)]
    picks = [r.choose(RouteRequest(7, turn=t), rs) for t in range(1, 6)]
    assert picks == [0, 1, 3, 0, 1]  # 2 is skipped; the holder gets no preference
    assert r.choose(RouteRequest(7, turn=1), [view(0, accepting=False)]) is None


def test_pinned_keeps_the_home_replica_and_falls_back_to_the_least_loaded():
    r = Pinned()
    rs = [view(0, 1), view(1, 9), view(2, 5)]
    assert r.choose(RouteRequest(7, turn=4, home=1), rs) == 1  # busy, but home
    rs[1] = view(1, 9, accepting=False)
    assert r.choose(RouteRequest(7, turn=4, home=1), rs) == 0


def test_make_router_knows_the_names_and_suggests_the_closest():
    assert isinstance(make_router("cache_aware", margin=0.5), CacheAware)
    assert make_router("cache_aware", margin=0.5).margin == 0.5
    assert isinstance(make_router("round_robin"), RoundRobin)
    with pytest.raises(RouterConfigError, match="did you mean 'cache_aware'"):
        make_router("cache-aware")


# ---------------------------------------------------------------- the simulator's prefix cache and placer


def test_prefix_cache_evicts_the_least_recently_used_by_tokens():
    c = PrefixCache(capacity=100)
    assert c.put(1, 40) == [] and c.put(2, 40) == []
    assert c.get(1) == 40  # 1 is now more recent than 2
    assert c.put(3, 40) == [2]  # 120 > 100: the least recently used goes
    assert 2 not in c and c.tokens == 80
    assert c.put(1, 70) == [3]  # a grown prefix replaces the old entry: 70 + 40 > 100
    assert c.put(4, 200) == [1, 4]  # larger than the whole cache: nothing of it stays
    assert len(c) == 0 and c.tokens == 0
    unbounded = PrefixCache(None)
    unbounded.put(1, 10**9)
    assert unbounded.get(1) == 10**9


def test_placer_charges_the_prefix_a_replica_does_not_hold():
    p = TurnPlacer(RoutingConfig(router="round_robin"), n=2, capacity=4, one_version=True)
    slots = [Slot(0, 0, True), Slot(0, 0, True)]
    assert p.prefill(0, 7, 0, 0, 100) == 0  # turn 0: no prefix
    p.cached(0, 7, 150)  # replica 0 ran turn 0: 100 prompt + 50 response tokens
    rid = p.place(7, 1, 150, home=0, last=0, versions=(0,), slot=lambda r: slots[r])
    assert rid == 0  # round robin starts at replica 0
    assert p.prefill(rid, 7, 1, 150, 30) == 0
    p.cached(0, 7, 230)
    rid = p.place(7, 2, 230, home=0, last=0, versions=(0,), slot=lambda r: slots[r])
    assert rid == 1 and p.prefill(1, 7, 2, 230, 30) == 230  # a miss recomputes the whole prefix
    assert p.counters.presented == 100 + 180 + 260 and p.counters.reused == 150
    assert p.counters.turn_hit_rate == 0.5 and p.counters.moved == 1
    p.flush(0)
    assert p.prefill(0, 7, 3, 300, 10) == 300  # a weight load emptied replica 0's cache
    p.forget(7)
    assert all(len(c) == 0 for c in p.caches)


def test_placer_keeps_c1_and_never_overfills_another_replica():
    p = TurnPlacer(RoutingConfig(router="cache_aware"), n=3, capacity=2, one_version=True)
    p.cached(2, 7, 500)  # replica 2 holds the prefix but serves version 1
    slots = [Slot(0, 2, True), Slot(0, 2, True), Slot(1, 0, True)]
    # home 0 is full but always eligible; 1 is full; 2 has the wrong version
    assert p.place(7, 1, 500, home=0, last=0, versions=(0,), slot=lambda r: slots[r]) == 0
    async_placer = TurnPlacer(RoutingConfig(router="cache_aware"), n=3, capacity=2, one_version=False)
    async_placer.cached(2, 7, 500)
    assert async_placer.place(7, 1, 500, home=0, last=0, versions=(0,), slot=lambda r: slots[r]) == 2
    slots[2] = Slot(1, 0, False)  # loading weights: not available
    assert async_placer.place(7, 1, 500, home=0, last=0, versions=(0,), slot=lambda r: slots[r]) == 2  # not told yet
    async_placer.mark(2)
    assert async_placer.place(7, 1, 500, home=0, last=0, versions=(0,), slot=lambda r: slots[r]) == 0


# ---------------------------------------------------------------- cores of local CPU replicas


def test_cpu_replicas_get_disjoint_cores_and_a_lone_one_on_a_small_machine_all(monkeypatch):
    import sao.agents.engine.server as engine
    from sao.agents.engine.fleet import cpu_share

    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.setattr(engine, "_cuda_present", lambda: False)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2, 3, 4})
    # 5 cores, 2 replicas: 2 each (the fifth stays with the front-ends and the learner), no overlap
    assert [cpu_share(i, 2) for i in range(2)] == [{"VLLM_CPU_OMP_THREADS_BIND": "0,1"},
                                                  {"VLLM_CPU_OMP_THREADS_BIND": "2,3"}]
    assert cpu_share(0, 1) == {}  # one replica on 5 cores: vLLM's own choice (it reserves a core for its front-end)
    assert cpu_share(5, 6) == {}  # more replicas than cores: no share to give
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    assert cpu_share(0, 1) == {"VLLM_CPU_OMP_THREADS_BIND": "0,1"}  # one replica on 2 cores: both
    assert cpu_share(0, 1, beside_learner=True) == {}  # ... unless a learner trains meanwhile
    assert [cpu_share(i, 2) for i in range(2)] == [{"VLLM_CPU_OMP_THREADS_BIND": "0"},
                                                  {"VLLM_CPU_OMP_THREADS_BIND": "1"}]
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0-1|0-1")  # the user's choice stands
    assert cpu_share(1, 2) == {}
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND")
    monkeypatch.setattr(engine, "_cuda_present", lambda: True)  # a GPU: the engines do not compute on the CPU
    assert cpu_share(1, 2) == {}
