"""Property tests of the schedulers under the simulator, and the ``sao-sim`` command.

Hypothesis draws small clusters with random lengths, turn counts, latencies, episode failures and
replica deaths; the simulator calls the scheduler's own invariant check after every event and
audits the result independently (staleness from the engines' versions, ``lost`` from its own
account of every attempt).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sao.agents.routing.routers import ROUTERS
from sao.rl.rollout.schedulers import MoveTrajectory, SchedulerConfig, StartTrajectory
from sao.rl.rollout.schedulers.lengths import LengthStats, quantile
from sao.rl.rollout.sim.simulator import SIM_MODES, SimError, Simulation, simulate
from sao.rl.rollout.sim.config import (
    EngineConfig,
    Lognormal,
    RoutingConfig,
    SimConfig,
    TrainerConfig,
    WorkloadConfig,
    scenario,
)


@st.composite
def small_runs(draw) -> SimConfig:
    group = draw(st.sampled_from([1, 2, 3]))
    batch = group * draw(st.integers(1, 4))
    die = draw(st.booleans())
    return SimConfig(
        workload=WorkloadConfig(
            prompt_tokens=Lognormal(draw(st.integers(1, 200)), draw(st.floats(0, 1)), 1, 1000),
            turns=Lognormal(draw(st.integers(1, 4)), draw(st.floats(0, 1.2)), 1, 12),
            response_tokens=Lognormal(draw(st.integers(1, 300)), draw(st.floats(0, 1.5)), 1, 4000),
            observation_tokens=Lognormal(draw(st.integers(0, 100)), 0.5, 0, 500),
            env_latency_s=Lognormal(draw(st.floats(0, 3)), draw(st.floats(0, 1.5)), 0, 30),
            episode_failure_prob=draw(st.sampled_from([0.0, 0.05, 0.3])),
        ),
        engine=EngineConfig(single_stream_tps=50, max_aggregate_tps=draw(st.sampled_from([50, 200, 1000])),
                            sync_s=draw(st.sampled_from([0.0, 0.5, 5.0])),
                            mtbf_s=draw(st.floats(20, 400)) if die else None, restart_s=draw(st.floats(0, 30))),
        trainer=TrainerConfig(tokens_per_s=draw(st.sampled_from([100, 1000, 10_000])), step_overhead_s=0.5),
        scheduler=SchedulerConfig(batch_size=batch, max_concurrency=draw(st.integers(1, 4)),
                                  staleness=draw(st.integers(0, 3)), stale_policy=draw(st.sampled_from(["drop", "mask"])),
                                  max_failures=draw(st.integers(1, 3))),
        routing=RoutingConfig(router=draw(st.sampled_from(ROUTERS)), cache_tokens=draw(st.sampled_from([None, 0, 300, 3000])),
                              flush_on_sync=draw(st.booleans())),
        grpo_group_size=group,
        micro_groups=draw(st.integers(1, 2)),
        steps=draw(st.integers(2, 5)),
        seed=draw(st.integers(0, 10_000)),
    )


def run(mode: str, config: SimConfig, engines: int) -> Simulation:
    sim = Simulation(mode, config, engines, check_every=1)  # the scheduler's invariants after every event
    sim.result = sim.run()
    return sim


FAST = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(config=small_runs(), engines=st.integers(1, 4))
def test_every_mode_balances_its_ledger_and_loses_nothing(config, engines):
    for mode in SIM_MODES:
        r = run(mode, config, engines).result
        assert r.lost == 0, mode
        assert r.steps == config.steps and r.trained == config.steps * config.scheduler.batch_size, mode
        assert r.admitted >= r.trained + r.requeued + r.failed, mode
        assert r.dropped_stale <= r.requeued, mode


@FAST
@given(config=small_runs(), engines=st.integers(1, 4))
def test_staleness_bound_and_one_version_per_trajectory(config, engines):
    k = config.scheduler.staleness
    mv = run("multi_version", config, engines).result
    assert mv.max_staleness <= k and mv.mixed_version == 0 and mv.dropped_stale == 0  # C3, C1, C2
    for mode in ("sync", "one_step_off", "pipe", "sync_grpo"):
        r = run(mode, config, engines).result
        assert r.mixed_version == 0, mode
        assert r.max_staleness == (1 if mode == "one_step_off" and config.steps > 1 else 0) or \
            (mode == "one_step_off" and r.max_staleness <= 1), mode
    a = run("async", config, engines).result
    if config.scheduler.stale_policy == "drop":
        assert a.max_staleness <= k and a.masked == 0
    else:
        assert a.dropped_stale == 0 and a.masked == sum(n for s, n in a.staleness_hist.items() if s > k)


@FAST
@given(config=small_runs(), engines=st.integers(2, 5), drain_below=st.sampled_from([0.25, 0.5, 1.0]),
       lag=st.integers(0, 3))
def test_rebalancing_loses_nothing_and_keeps_versions_honest(config, engines, drain_below, lag):
    """With moves between replicas (drawn up to every draining replica's whole load), the scheduler's
    checks hold after every event (ledger, one version per replica's in-flight work), the fleet refuses
    any move across versions, and the audit finds nothing lost, no mixed versions, staleness <= k."""
    k = config.scheduler.staleness
    config = replace(config, scheduler=replace(config.scheduler, drain_below=drain_below, admit_lag=min(lag, k),
                                               rebalance=True))
    sim = run("multi_version", config, engines)
    r = sim.result
    assert r.lost == 0 and r.mixed_version == 0 and r.dropped_stale == 0 and r.max_staleness <= k
    assert r.trained == config.steps * config.scheduler.batch_size
    assert r.moves == sim.scheduler.moves  # every move the scheduler issued was executed (about 1 run in 4 moves)
    assert 0.0 <= r.drain_share <= 1.0


def test_rebalancing_moves_stragglers_and_cuts_draining_time():
    cfg = _multi_turn(staleness=2, drain_below=0.5)
    base = simulate("multi_version", cfg, 4)
    moved = simulate("multi_version_rebalance", cfg, 4)
    assert base.moves == 0 and moved.moves > 0
    assert moved.move_prefill_tokens > 0  # mid-turn moves recomputed their prefix on the target
    assert moved.drain_replica_s < base.drain_replica_s
    assert moved.lost == 0 and moved.mixed_version == 0 and moved.max_staleness <= 2


def test_a_mid_turn_move_pays_its_prefix_on_the_target():
    """Cost model of a move: cancelled on the source, the target prefills prompt + tokens generated so
    far (``prefill_cost`` each; nothing cached there) and decodes the rest of the turn."""
    cfg = _multi_turn(staleness=2, rebalance=True)
    sim = Simulation("multi_version_rebalance", cfg, 2)
    sim._execute(sim.scheduler.start(0.0))
    fleet, c = sim.fleet, cfg.engine.prefill_cost
    tid = min(fleet.on_engine[0])
    tr, src, dst = fleet.trajs[tid], fleet.engines[0], fleet.engines[1]
    turn = tr.spec.turns[0]
    finish = next(f for f, t in src._heap if t == tid)  # work: prefill (P x c) first, then R response tokens
    sim.now = (finish - turn.response_tokens / 2) / cfg.engine.per_sequence_tps(src.decoding)  # half its response out
    src.advance(sim.now)
    left = next(f for f, t in src._heap if t == tid) - src._S
    assert left == pytest.approx(turn.response_tokens / 2)
    generated = turn.response_tokens - round(left)
    fleet.move(MoveTrajectory(tid, 0, 1, 0))
    assert tid not in src.decoding_ids() and tr.engine == tr.at == 1 and tr.versions == [0]
    dst.advance(sim.now)
    work = next(f for f, t in dst._heap if t == tid) - dst._S
    assert work == pytest.approx(left + (turn.prefill_tokens + generated) * c)
    assert fleet.move_prefill_tokens == turn.prefill_tokens + generated
    with pytest.raises(SimError, match="C1"):  # a target at another version is refused
        dst.version = 7
        fleet.move(MoveTrajectory(min(fleet.on_engine[0]), 0, 1, 0))


@FAST
@given(config=small_runs(), engines=st.integers(1, 4))
def test_pipe_ships_only_complete_groups_and_admits_frontier_groups_first(config, engines):
    sim = run("pipe", config, engines)
    g = config.grpo_group_size
    prompt_of = {a.traj_id: a.prompt for a in sim.start_log}
    for job in sim.train_log:
        members: dict[int, set[int]] = defaultdict(set)
        for tid in job.traj_ids:
            members[prompt_of[tid].group_id].add(prompt_of[tid].index)
        assert all(idx == set(range(g)) for idx in members.values()), job
    firsts = [a.prompt.group_id for a in sim.start_log if a.prompt.attempt == 0]
    assert firsts == sorted(firsts)  # FGD: a later group's first request never goes before an earlier group's
    finals = [job for job in sim.train_log if job.final]
    assert [j.step for j in finals] == list(range(config.steps))


def test_the_same_seed_gives_the_same_run():
    cfg = scenario("calibrated_cpu")
    assert simulate("multi_version", cfg, 2) == simulate("multi_version", cfg, 2)


def test_every_mode_sees_the_same_trajectory_for_the_same_request():
    """Fairness: a request's (and attempt's) cost does not depend on the mode that runs it."""
    cfg = scenario("calibrated_cpu")
    a, b = Simulation("sync", cfg, 1), Simulation("async", cfg, 1)
    a.run(), b.run()
    starts_a = {s.prompt: s.traj_id for s in a.start_log}
    common = [s.prompt for s in b.start_log if s.prompt in starts_a]
    assert len(common) > 100


@pytest.mark.slow
def test_sao_sim_command_writes_the_json(tmp_path):
    out = tmp_path / "sim.json"
    cmd = [sys.executable, "-m", "sao.rl.cli.sim", "--modes", "sync,one_step_off,async,multi_version,pipe",
           "--engines", "16", "--steps", "4", "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    assert set(doc) == {"sync", "one_step_off", "async", "multi_version", "pipe", "sync_grpo"}
    for mode, m in doc.items():
        for key in ("trajectories_per_hour", "trainer_idle_ratio", "trainer_wait_ratio", "rollout_to_train_end_s",
                    "max_staleness", "lost"):
            assert key in m, (mode, key)
        assert m["lost"] == 0
    assert doc["async"]["ratios"]["trajectories_per_hour_vs_sync"]["value"] > 0
    assert "async / sync trajectories/h" in proc.stdout


@pytest.mark.parametrize("args, message", [
    (["--modes", "sync,asynk"], "did you mean 'async'"),
    (["--engines", "8,x"], "comma list of integers"),
    (["--engines", "0"], "positive"),
    (["--stale-policy", "keep"], "invalid choice"),
    (["--scenario", "paper"], "invalid choice"),
    (["--steps", "0", "--engines", "2"], "steps must be >= 1"),
    (["--router", "cache-aware"], "invalid choice"),
    (["--admit-lag", "9", "--engines", "2"], "admit_lag must lie in [0, staleness=4]"),
])
def test_sao_sim_rejects_bad_input_with_exit_2(args, message, capsys):
    from sao.rl.cli.sim import main

    try:
        code = main(args)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    assert code == 2 and message in capsys.readouterr().err


def test_batch_per_engine_scales_the_batch_with_the_fleet() -> None:
    from sao.rl.rollout.sim.compare import scaled
    from sao.rl.rollout.sim.config import paper_like

    base = paper_like()  # GRPO groups of 8
    assert scaled(base, 64, None) is base
    assert scaled(base, 64, 4).scheduler.batch_size == 256  # 4 x 64, already whole groups
    assert scaled(base, 3, 1).scheduler.batch_size == 8  # 3 rounded up to one group of 8
    assert scaled(base, 10, 1).scheduler.batch_size == 16  # 10 -> two groups


# ---------------------------------------------------------------- admission, routing, lengths (issue 11)


def _multi_turn(router: str = "pinned", cache_tokens: int | None = None, flush: bool = False, trainer_tps: float = 200_000,
                **sched) -> SimConfig:
    """Long multi-turn contexts (prefill dear: a miss shows), no failures: a small, fast paper-like run."""
    return SimConfig(
        workload=WorkloadConfig(prompt_tokens=Lognormal(1500, 0.2, 500, 4000), turns=Lognormal(6, 0.4, 2, 12),
                                response_tokens=Lognormal(100, 0.5, 10, 800), observation_tokens=Lognormal(400, 0.5, 10, 2000),
                                env_latency_s=Lognormal(0.5, 0.5, 0.05, 5), episode_failure_prob=0.0),
        engine=EngineConfig(single_stream_tps=60, max_aggregate_tps=1500, prefill_cost=0.1, sync_s=2.0, mtbf_s=None),
        trainer=TrainerConfig(tokens_per_s=trainer_tps, step_overhead_s=1.0),
        scheduler=SchedulerConfig(**{"batch_size": 16, "max_concurrency": 8, "staleness": 2, **sched}),
        routing=RoutingConfig(router=router, cache_tokens=cache_tokens, flush_on_sync=flush),
        grpo_group_size=8, steps=4, seed=3)


def test_default_routing_is_the_old_model_every_later_turn_finds_its_prefix():
    r = simulate("async", _multi_turn(), 3)
    assert r.prefix_turn_hit_rate == 1.0 and r.routed_moves == 0
    assert 0.5 < r.prefix_cache_hit_rate < 1.0  # turn-0 prompts are misses


def test_cache_aware_routing_keeps_prefixes_that_round_robin_loses():
    rr = simulate("multi_version", _multi_turn("round_robin"), 4)
    ca = simulate("multi_version", _multi_turn("cache_aware"), 4)
    assert ca.prefix_cache_hit_rate > rr.prefix_cache_hit_rate + 0.2
    assert rr.routed_moves > ca.routed_moves
    assert ca.wall_s < rr.wall_s  # recomputed prefill is engine time
    assert rr.mixed_version == ca.mixed_version == 0  # routing keeps C1


def test_a_cache_too_small_for_any_prefix_never_hits():
    r = simulate("multi_version", _multi_turn("pinned", cache_tokens=10), 2)
    assert r.prefix_turn_hit_rate == 0.0 and r.prefix_cache_hit_rate == 0.0


def test_lagged_admission_starts_work_on_old_versions_and_the_default_does_not():
    cfg = _multi_turn(staleness=4)  # 2 engines x 8 slots < (k + 1) x 16: slots, not staleness, bound admission
    new, lag = simulate("multi_version", cfg, 2), simulate("multi_version_lag", cfg, 2)
    assert new.old_version_starts == 0
    assert lag.old_version_starts > 0 and lag.max_staleness <= 4 and lag.mixed_version == 0


def test_length_stats_report_generated_trained_and_dropped():
    s = LengthStats()
    for n in (10, 20, 30, 40, 100):
        s.on_generated(n)
    for n in (10, 20, 30):
        s.on_trained(n)
    s.on_dropped(100)
    m = s.metrics()
    assert m["rollout/len_long_tokens"] == 30  # the median of what was generated
    assert m["rollout/len_generated_mean"] == 40 and m["rollout/len_generated_p50"] == 30
    assert m["rollout/len_generated_p90"] == pytest.approx(76)  # 40 + 0.6 * (100 - 40)
    assert m["rollout/len_trained_long_share"] == 0 and m["rollout/len_dropped_long_share"] == 1
    assert m["rollout/len_generated_long_share"] == pytest.approx(0.4)
    assert m["rollout/len_trained_bias"] == pytest.approx(20 / 40 - 1)
    assert "rollout/len_admitted_n" not in m  # only recorded where lengths are known at the start
    assert quantile([], 0.5) == 0.0


def test_stale_drops_fall_on_long_trajectories():
    cfg = replace(scenario("paper_like"), steps=6)
    drop = simulate("async_drop", cfg, 16)
    L = drop.lengths
    assert drop.dropped_stale > 20
    assert L["rollout/len_dropped_mean"] > 1.5 * L["rollout/len_trained_mean"]
    assert L["rollout/len_dropped_long_share"] > 0.8


def test_sao_sim_routes_and_reports_the_hit_rate(tmp_path):
    from sao.rl.cli.sim import main

    out = tmp_path / "sim.json"
    code = main(["--modes", "multi_version,multi_version_lag", "--engines", "4", "--steps", "2", "--router", "cache_aware",
                 "--cache-tokens", "50000", "--flush-on-sync", "--json", str(out)])
    assert code == 0
    doc = json.loads(out.read_text())
    assert set(doc) == {"multi_version", "multi_version_lag"}
    for m in doc.values():
        assert 0 < m["prefix_cache_hit_rate"] < 1 and "rollout/len_trained_mean" in m["lengths"]
        assert m["lost"] == 0
