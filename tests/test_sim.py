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

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sao.rl.rollout import SchedulerConfig, StartTrajectory
from sao.rl.rollout.sim import SIM_MODES, Simulation, simulate
from sao.rl.rollout.simconfig import EngineConfig, Lognormal, SimConfig, TrainerConfig, WorkloadConfig, scenario


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
    cmd = [sys.executable, "-m", "sao.rl.rollout.sim_cli", "--modes", "sync,one_step_off,async,multi_version,pipe",
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
])
def test_sao_sim_rejects_bad_input_with_exit_2(args, message, capsys):
    from sao.rl.rollout.sim_cli import main

    try:
        code = main(args)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    assert code == 2 and message in capsys.readouterr().err


def test_batch_per_engine_scales_the_batch_with_the_fleet() -> None:
    from sao.rl.rollout.compare import scaled
    from sao.rl.rollout.simconfig import paper_like

    base = paper_like()  # GRPO groups of 8
    assert scaled(base, 64, None) is base
    assert scaled(base, 64, 4).scheduler.batch_size == 256  # 4 x 64, already whole groups
    assert scaled(base, 3, 1).scheduler.batch_size == 8  # 3 rounded up to one group of 8
    assert scaled(base, 10, 1).scheduler.batch_size == 16  # 10 -> two groups
