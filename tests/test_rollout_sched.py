"""Unit tests of the clock-agnostic rollout schedulers, driven by small hand-built event sequences.

Each test plays the driver: it feeds events with a made-up clock and checks the actions. After
every event the scheduler's own invariant check (ledger balance, C1, ...) must pass.
"""

from __future__ import annotations

import ast
from dataclasses import replace
import subprocess
import sys
from pathlib import Path

import pytest

from sao.rl.rollout.schedulers import (
    AsyncScheduler,
    ConfigError,
    Discard,
    Ledger,
    LedgerError,
    MoveTrajectory,
    MultiVersionScheduler,
    OneStepOffScheduler,
    PipeScheduler,
    Prompt,
    RecordFailed,
    ReplicaDied,
    ReplicaRestarted,
    Requeue,
    SchedulerConfig,
    StartTrajectory,
    SyncDone,
    SyncReplica,
    SyncScheduler,
    TrainOn,
    TrainStepDone,
    TrajectoryFinished,
    make_scheduler,
)

ROLLOUT_DIR = Path(__file__).resolve().parents[1] / "rl" / "rollout"


def of(actions, kind):
    return [a for a in actions if isinstance(a, kind)]


def feed(s, event, now=0.0):
    out = s.on_event(event, now)
    s.check()
    return out


def done(start: StartTrajectory, *versions: int, failed: bool = False) -> TrajectoryFinished:
    return TrajectoryFinished(start.traj_id, versions or (start.version,), 10, failed, "boom" if failed else "")


# ---------------------------------------------------------------- sync and one_step_off


def test_sync_generates_trains_then_syncs_everything():
    s = SyncScheduler(SchedulerConfig(batch_size=4, max_concurrency=2), n_replicas=2)
    starts = s.start(0.0)
    assert len(starts) == 4 and {a.replica for a in starts} == {0, 1} and {a.version for a in starts} == {0}
    for a in starts[:3]:
        assert feed(s, done(a)) == []  # the trainer waits for the whole batch
    (train,) = feed(s, done(starts[3]))
    assert train == TrainOn(0, tuple(a.traj_id for a in starts), final=True)
    syncs = feed(s, TrainStepDone(1))
    assert syncs == [SyncReplica(0, 1), SyncReplica(1, 1)]  # engines idle during train + sync
    assert feed(s, SyncDone(0, 1)) == []  # the next batch waits for every replica
    nxt = feed(s, SyncDone(1, 1))
    assert len(of(nxt, StartTrajectory)) == 4 and {a.version for a in nxt} == {1}


def test_one_step_off_generates_next_batch_while_training():
    s = OneStepOffScheduler(SchedulerConfig(batch_size=2, max_concurrency=2), n_replicas=1)
    b0 = s.start(0.0)
    feed(s, done(b0[0]))
    out = feed(s, done(b0[1]))
    assert of(out, TrainOn) == [TrainOn(0, (b0[0].traj_id, b0[1].traj_id))]
    b1 = of(out, StartTrajectory)
    assert [a.version for a in b1] == [0, 0]  # batch 1 generates on version 0 while step 0 trains
    feed(s, done(b1[0]))
    assert feed(s, done(b1[1])) == []  # ready, but the trainer is busy
    out = feed(s, TrainStepDone(1))
    assert of(out, TrainOn) == [TrainOn(1, (b1[0].traj_id, b1[1].traj_id))]
    assert of(out, SyncReplica) == [SyncReplica(0, 1)]
    assert s.stats()["staleness/max"] == 1.0
    b2 = feed(s, SyncDone(0, 1))
    assert [a.version for a in b2] == [1, 1]


# ---------------------------------------------------------------- async


def _async_with_stale_trajectory(policy: str):
    """Trajectory 1 runs on while the learner moves two versions ahead (k = 1)."""
    s = AsyncScheduler(SchedulerConfig(batch_size=1, max_concurrency=2, staleness=1, stale_policy=policy), 1)
    t0, t1 = s.start(0.0)  # outstanding limit (k + 1) * batch = 2
    out = feed(s, done(t0))
    assert of(out, TrainOn) == [TrainOn(0, (t0.traj_id,))]
    (t2,) = of(out, StartTrajectory)
    assert feed(s, TrainStepDone(1)) == [SyncReplica(0, 1)]  # weights update under running t1, t2
    feed(s, SyncDone(0, 1))
    out = feed(s, done(t2, 0, 1))
    assert of(out, TrainOn) == [TrainOn(1, (t2.traj_id,))]  # staleness 1: fine
    (t3,) = of(out, StartTrajectory)
    feed(s, TrainStepDone(2))
    feed(s, SyncDone(0, 2))
    return s, t1, t3, feed(s, done(t1, 0, 1, 2))  # staleness 2 - 0 = 2 > k


def test_async_drop_requeues_a_stale_trajectory():
    s, t1, _, out = _async_with_stale_trajectory("drop")
    assert of(out, Discard) == [Discard(t1.traj_id, "staleness 2 > 1")]
    assert of(out, Requeue) == [Requeue(t1.traj_id, t1.prompt, "stale")]
    assert not of(out, TrainOn)
    (retry,) = of(out, StartTrajectory)
    assert retry.prompt == Prompt(t1.prompt.group_id, attempt=1) and retry.version == 2
    assert s.stats()["ledger/requeued"] == 1


def test_async_mask_trains_the_stale_trajectory():
    s, t1, _, out = _async_with_stale_trajectory("mask")
    assert of(out, TrainOn) == [TrainOn(2, (t1.traj_id,))]
    assert s.stats()["staleness/masked"] == 1 and s.stats()["staleness/max"] == 2


def test_replica_death_requeues_in_flight_and_loses_nothing():
    s = AsyncScheduler(SchedulerConfig(batch_size=2, max_concurrency=2, max_failures=2), n_replicas=2)
    starts = s.start(0.0)
    on0 = [a for a in starts if a.replica == 0]
    out = feed(s, ReplicaDied(0))
    assert sorted(a.traj_id for a in of(out, Requeue)) == sorted(a.traj_id for a in on0)
    assert not of(out, StartTrajectory) or all(a.replica == 1 for a in of(out, StartTrajectory))
    assert feed(s, done(on0[0])) == []  # a late answer from the dead replica is ignored
    assert feed(s, ReplicaRestarted(0)) == [SyncReplica(0, 0)]  # synced before it serves
    again = of(feed(s, SyncDone(0, 0)), StartTrajectory)
    assert {a.prompt.attempt for a in again} == {1}
    c = s.stats()
    assert c["ledger/admitted"] == c["ledger/requeued"] + c["ledger/in_flight"]
    out = feed(s, ReplicaDied(0))  # second failure of the same requests: recorded failed
    assert len(of(out, RecordFailed)) == len(again) and not of(out, Requeue)


@pytest.mark.parametrize("mode", ["sync", "one_step_off", "async", "multi_version", "pipe"])
def test_a_resumed_schedule_starts_at_the_checkpoint_version(mode: str):
    """A run resumed from the checkpoint of step 5: work starts on version 5, the first optimizer
    step is step 5 (-> version 6), and staleness counts from there."""
    group = 2 if mode == "pipe" else 1
    s = make_scheduler(mode, SchedulerConfig(batch_size=2, group_size=group, max_concurrency=2, staleness=1),
                       2, start_version=5)
    starts = of(s.start(0.0), StartTrajectory)
    assert starts and {a.version for a in starts} == {5}
    trains = []
    for a in starts:
        trains += of(feed(s, done(a)), TrainOn)
    assert trains and trains[-1].step == 5 and trains[-1].final
    feed(s, TrainStepDone(6))
    assert s.stats()["learner/version"] == 6 and s.stats()["staleness/max"] <= 1  # from 5, not from 0
    with pytest.raises(LedgerError):
        make_scheduler(mode, SchedulerConfig(batch_size=2, group_size=group), 1, start_version=-1)


# ---------------------------------------------------------------- multi_version (DORA)


def test_multi_version_never_syncs_a_replica_with_work_in_flight():
    s = MultiVersionScheduler(SchedulerConfig(batch_size=1, max_concurrency=1, staleness=2), n_replicas=2)
    a, b = s.start(0.0)
    assert {a.replica, b.replica} == {0, 1}
    out = feed(s, done(a))
    assert of(out, TrainOn) == [TrainOn(0, (a.traj_id,))]
    (c,) = of(out, StartTrajectory)  # a's replica is free again, still on version 0
    out = feed(s, TrainStepDone(1))
    assert of(out, SyncReplica) == []  # both replicas busy on version 0: C1 says keep serving
    out = feed(s, done(c))  # c's replica is now empty and old: it upgrades
    assert of(out, SyncReplica) == [SyncReplica(c.replica, 1)]
    assert of(out, TrainOn) == [TrainOn(1, (c.traj_id,))]
    out = feed(s, SyncDone(c.replica, 1))
    (d,) = of(out, StartTrajectory)
    assert d.version == 1  # new work starts on the newest version
    with pytest.raises(LedgerError, match="C1"):
        s.on_event(done(b, 0, 1), 1.0)  # a driver that switched b's weights breaks C1


def test_multi_version_trainer_waits_rather_than_exceed_staleness():
    cfg = SchedulerConfig(batch_size=1, max_concurrency=4, staleness=1, admit_lag=0)
    s = MultiVersionScheduler(cfg, n_replicas=1)
    first = s.start(0.0)
    assert len(first) == 2  # at most (k + 1) * batch untrained trajectories at once
    long, short = first
    out = feed(s, done(short))
    assert of(out, TrainOn) == [TrainOn(0, (short.traj_id,))]
    out = feed(s, TrainStepDone(1))  # the replica still runs `long` on version 0: no sync, no new work
    assert not of(out, SyncReplica)
    # step 1 needs `long` (version 0 must be trained by version 1): nothing else can be trained
    out = feed(s, done(long))
    assert of(out, TrainOn) == [TrainOn(1, (long.traj_id,))]
    assert s.stats()["staleness/max"] == 1.0


@pytest.mark.parametrize("admit_lag", [0, 1])
def test_multi_version_starts_new_work_on_the_newest_version_unless_lag_is_allowed(admit_lag):
    """METHOD.md 2: new trajectories start on the newest version (admit_lag=0, the default); the
    lagged option lets a replica one version behind keep admitting while it is busy."""
    cfg = SchedulerConfig(batch_size=1, max_concurrency=2, staleness=3, admit_lag=admit_lag)
    s = MultiVersionScheduler(cfg, n_replicas=1)
    a, b = s.start(0.0)
    out = feed(s, done(a))
    assert of(out, TrainOn) == [TrainOn(0, (a.traj_id,))]
    (c,) = of(out, StartTrajectory)  # version 0 is still the newest: c starts on it
    assert c.version == 0
    out = feed(s, TrainStepDone(1))  # the replica still runs b and c on version 0: no sync (C1)
    assert not of(out, SyncReplica) and not of(out, StartTrajectory)
    out = feed(s, done(b))  # a slot frees on the version-0 replica while the learner is at 1
    starts = of(out, StartTrajectory)
    if admit_lag == 0:
        assert starts == []  # the old replica drains instead
        out = feed(s, done(c))
        assert of(out, SyncReplica) == [SyncReplica(0, 1)]
        assert {x.version for x in of(feed(s, SyncDone(0, 1)), StartTrajectory)} == {1}
    else:
        assert [x.version for x in starts] == [0]  # overflow admitted one version behind


def test_admit_lag_defaults_to_the_spec_rule_and_is_bounded_by_k():
    assert SchedulerConfig().admit_lag == 0
    with pytest.raises(ConfigError, match="admit_lag"):
        SchedulerConfig(staleness=2, admit_lag=3)


def _two_stragglers(rebalance: bool, drain_below: float = 0.5):
    """2 replicas x 4 slots, batch 2, k = 1: four trajectories start (t0, t2 on replica 0; t1, t3 on 1),
    t0 and t1 finish and are trained; at t = 10 step 0 ends and each replica holds one straggler of
    version 0."""
    cfg = SchedulerConfig(batch_size=2, max_concurrency=4, staleness=1, drain_below=drain_below, rebalance=rebalance)
    s = MultiVersionScheduler(cfg, n_replicas=2)
    t0, t1, t2, t3 = s.start(0.0)
    assert [t.replica for t in (t0, t1, t2, t3)] == [0, 1, 0, 1]
    feed(s, done(t0), 1.0)
    assert of(feed(s, done(t1), 2.0), TrainOn) == [TrainOn(0, (t0.traj_id, t1.traj_id))]
    return s, t2, t3, feed(s, TrainStepDone(1), 10.0)


def test_rebalance_empties_the_lighter_old_replica_into_its_peer_of_the_same_version():
    s, t2, t3, out = _two_stragglers(rebalance=True)
    # both replicas hold 1 <= 0.5 x 4 stragglers; replica 0 sorts first (load 1, id 0) and moves its
    # straggler onto replica 1 (load 1, id 1: the larger key), then upgrades at once
    assert of(out, MoveTrajectory) == [MoveTrajectory(t2.traj_id, 0, 1, 0)]
    assert of(out, SyncReplica) == [SyncReplica(0, 1)]
    assert out.index(of(out, MoveTrajectory)[0]) < out.index(SyncReplica(0, 1))  # moved before the sync
    assert s.book.pool[1].in_flight == {t2.traj_id, t3.traj_id}
    new = of(feed(s, SyncDone(0, 1), 12.0), StartTrajectory)
    assert new and {a.replica for a in new} == {0} and {a.version for a in new} == {1}
    out = feed(s, done(t2), 15.0)  # the moved trajectory ends on replica 1, all its tokens of version 0 (C1)
    assert not of(out, SyncReplica)  # replica 1 still runs t3
    assert of(feed(s, done(t3), 20.0), SyncReplica) == [SyncReplica(1, 1)]
    st = s.stats()
    assert st["multi_version/moves"] == 1.0
    # draining: replica 0 none (it moved its straggler and synced at t = 10); replica 1 from 10 to 20
    assert st["multi_version/drain_replica_s"] == pytest.approx(10.0)


def test_without_rebalance_each_old_replica_drains_alone():
    s, t2, t3, out = _two_stragglers(rebalance=False)
    assert not of(out, MoveTrajectory) and not of(out, SyncReplica)
    assert of(feed(s, done(t2), 15.0), SyncReplica) == [SyncReplica(0, 1)]
    feed(s, SyncDone(0, 1), 16.0)
    assert of(feed(s, done(t3), 20.0), SyncReplica) == [SyncReplica(1, 1)]
    # draining: replica 0 from 10 to 15, replica 1 from 10 to 20: 5 + 10 replica-seconds
    assert s.stats()["multi_version/drain_replica_s"] == pytest.approx(15.0)
    assert s.stats()["multi_version/moves"] == 0.0


def test_rebalance_leaves_a_replica_with_more_than_a_few_stragglers():
    s, _, _, out = _two_stragglers(rebalance=True, drain_below=0.1)  # 0.1 x 4 = 0.4 < 1 straggler
    assert not of(out, MoveTrajectory) and not of(out, SyncReplica)


def test_rebalance_moves_only_when_the_whole_replica_fits_elsewhere():
    """3 trajectories on replica 0 (full), 1 on replica 1 (3 slots each): after the step replica 1's
    straggler would need a free slot on replica 0, which has none; replica 0 only moves onto a more
    loaded peer, and there is none: nothing moves."""
    cfg = SchedulerConfig(batch_size=1, max_concurrency=3, staleness=4, drain_below=1.0, rebalance=True)
    s = MultiVersionScheduler(cfg, n_replicas=2)
    starts = s.start(0.0)
    assert len(starts) == 5  # (k + 1) x batch
    first = next(a for a in starts if a.replica == 1)
    out = feed(s, done(first), 1.0)  # replica 1 now holds 1, replica 0 holds 3
    assert of(out, TrainOn)
    assert not of(out, StartTrajectory)  # 4 untrained fill the k + 1 = 5 steps' budget at next step 1
    assert [s.book.pool[r].load for r in (0, 1)] == [3, 1]
    out = feed(s, TrainStepDone(1), 2.0)
    assert not of(out, MoveTrajectory) and not of(out, SyncReplica)
    assert [s.book.pool[r].status.value for r in (0, 1)] == ["draining", "draining"]


def test_a_move_between_versions_is_refused():
    cfg = SchedulerConfig(batch_size=1, max_concurrency=2, staleness=2, rebalance=True)
    s = MultiVersionScheduler(cfg, n_replicas=2)
    a = s.start(0.0)[0]
    s.book.pool[1].version = 5  # the other replica serves another version
    with pytest.raises(LedgerError, match="C1"):
        s.book.move(a.traj_id, 1)


def test_rebalance_is_validated_like_the_other_fields():
    assert SchedulerConfig().rebalance is False
    with pytest.raises(ConfigError, match="rebalance"):
        SchedulerConfig(rebalance="yes")  # type: ignore[arg-type]


def test_rebalance_reaches_the_real_multi_version_scheduler_and_other_modes_refuse_it():
    from hydra import compose, initialize_config_module

    from sao.rl.cli.train import to_config
    from sao.rl.config import scheduler_config, validate

    with initialize_config_module("sao.conf", version_base="1.3"):
        cfg = to_config(compose("config", overrides=["rollout=multi_version", "rollout.rebalance=true"]))
        validate(cfg)
        assert scheduler_config(cfg).rebalance is True  # the real driver executes the moves (sao.rl.rollout.moves)
        assert scheduler_config(replace(cfg, rollout=replace(cfg.rollout, rebalance=False))).rebalance is False
        for mode in ("async", "one_step_off"):
            other = replace(cfg, rollout=replace(cfg.rollout, mode=mode))
            with pytest.raises(ConfigError, match=f"rollout.rebalance=true .* only rollout=multi_version .*rollout={mode}"):
                validate(other)


# ---------------------------------------------------------------- pipe (RolloutPipe)


def test_pipe_admits_frontier_group_first_and_ships_complete_groups_fifo():
    cfg = SchedulerConfig(batch_size=6, group_size=2, max_concurrency=1, micro_groups=1)
    s = PipeScheduler(cfg, n_replicas=2)
    g0a, g0b = s.start(0.0)
    assert (g0a.prompt.group_id, g0b.prompt.group_id) == (0, 0)  # FGD: group 0's two samples first
    (g1a,) = of(feed(s, done(g0a)), StartTrajectory)
    assert g1a.prompt.key == (1, 0)
    out = feed(s, done(g0b))  # group 0 complete -> first micro-batch, while group 1 still runs
    assert of(out, TrainOn) == [TrainOn(0, (g0a.traj_id, g0b.traj_id), final=False)]
    (g1b,) = of(out, StartTrajectory)
    assert g1b.prompt.key == (1, 1)
    (g2a,) = of(feed(s, done(g1a)), StartTrajectory)
    (g2b,) = of(feed(s, done(g2a)), StartTrajectory)
    out = feed(s, done(g2b))  # group 2 completes before group 1: FIFO of completion
    assert of(out, TrainOn) == [TrainOn(0, (g2a.traj_id, g2b.traj_id), final=False)]
    out = feed(s, done(g1b))
    assert of(out, TrainOn) == [TrainOn(0, (g1a.traj_id, g1b.traj_id), final=True)]
    assert of(feed(s, TrainStepDone(1)), SyncReplica) == [SyncReplica(0, 1), SyncReplica(1, 1)]


def test_pipe_without_fgd_admits_sample_major():
    cfg = SchedulerConfig(batch_size=4, group_size=2, max_concurrency=1, frontier_first=False)
    a, b = PipeScheduler(cfg, n_replicas=2).start(0.0)
    assert (a.prompt.key, b.prompt.key) == ((0, 0), (1, 0))


def test_a_request_that_fails_for_good_fails_its_group_and_a_fresh_group_replaces_it():
    cfg = SchedulerConfig(batch_size=4, group_size=2, max_concurrency=4, max_failures=1)
    s = SyncScheduler(cfg, n_replicas=1)
    g0a, g0b, g1a, g1b = s.start(0.0)
    feed(s, done(g0a))
    out = feed(s, done(g0b, failed=True))
    assert {(a.traj_id, a.cause) for a in of(out, RecordFailed)} == {(g0b.traj_id, "boom"), (g0a.traj_id, "group failed")}
    fresh = of(out, StartTrajectory)
    assert {a.prompt.group_id for a in fresh} == {2}
    for a in (g1a, g1b, *fresh):
        out = feed(s, done(a))
    assert of(out, TrainOn) == [TrainOn(0, (g1a.traj_id, g1b.traj_id, *(a.traj_id for a in fresh)))]


# ---------------------------------------------------------------- ledger, config, registry


def test_ledger_refuses_illegal_moves_and_balances():
    led = Ledger()
    led.admit(0, Prompt(0), replica=0, version=0, now=0.0)
    with pytest.raises(LedgerError, match="admitted twice"):
        led.admit(0, Prompt(1), replica=0, version=0, now=0.0)
    with pytest.raises(LedgerError, match="in_flight"):
        led.train([0], step=0)  # not finished yet
    led.finish(0, (0,), 5, now=1.0)
    assert led.train([0], step=3) == [3]
    with pytest.raises(LedgerError, match="trained"):
        led.requeue(0, "stale")
    led.check()
    led.counts["trained"] += 1  # a corrupted count is caught
    with pytest.raises(LedgerError, match="admitted 1"):
        led.check()


def test_bad_config_fails_with_a_clear_message():
    with pytest.raises(ConfigError, match="multiple of group_size"):
        SchedulerConfig(batch_size=10, group_size=4)
    with pytest.raises(ConfigError, match="did you mean 'drop'"):
        SchedulerConfig(stale_policy="dorp")
    with pytest.raises(ConfigError, match="did you mean 'multi_version'"):
        make_scheduler("multiversion", SchedulerConfig(), 2)
    with pytest.raises(ConfigError, match="group_size=1"):
        make_scheduler("async", SchedulerConfig(batch_size=8, group_size=2), 2)


# pure modules outside the package that it may use: the request routers, shared with sao-eval's routing client,
# and the leaf of error-message hints (sao.hints: the standard library only) and rl/'s errors
LEAVES = ("sao.hints",)
ROLLOUT_MAY_IMPORT = ("sao.agents.routing", "sao.agents.routing.routers", "sao.rl.errors", *LEAVES)
PURE_PACKAGES = ("sao.rl.rollout.schedulers", "sao.rl.rollout.sim")


def pure_rollout_files() -> list[Path]:
    """The schedulers and their simulator, every file below their folders (not the real driver in
    rl/rollout/, which needs torch), sao-sim's entry point, and the package __init__s importing them runs."""
    rl = ROLLOUT_DIR.parent
    files = [*sorted((ROLLOUT_DIR / "schedulers").rglob("*.py")), *sorted((ROLLOUT_DIR / "sim").rglob("*.py"))]
    assert {"core.py", "streaming.py", "simulator.py", "fleet.py"} <= {p.name for p in files}, files
    return [*files, rl / "cli" / "sim.py", rl / "__init__.py", ROLLOUT_DIR / "__init__.py", rl / "cli" / "__init__.py"]


def test_rollout_package_does_not_import_torch():
    """The schedulers must stay light: no torch, and nothing of the learner, in sao.rl.rollout.schedulers
    and sao.rl.rollout.sim; the routers they share with the real paths import nothing of sao and no torch either."""
    agents = ROLLOUT_DIR.parents[1] / "agents"
    shared = [agents / "routing" / "routers.py", agents / "errors.py",
              agents / "__init__.py", agents / "routing" / "__init__.py", agents.parent / "hints" / "__init__.py",
              ROLLOUT_DIR.parent / "errors.py"]
    for path in [*pure_rollout_files(), *shared]:
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for name in names:
                assert not name.startswith("torch"), f"{path.name} imports {name}"
                if path in shared:
                    relative = isinstance(node, ast.ImportFrom) and node.level
                    assert (not name.startswith("sao") or name in LEAVES) and \
                        (not relative or f"{name}.py" in {p.name for p in shared}), \
                        f"{path.name} imports {name}"
                    continue
                assert not name.startswith("sao.") or name.startswith(PURE_PACKAGES) or name in ROLLOUT_MAY_IMPORT, \
                    f"{path.name} imports {name}"


def test_the_schedulers_and_the_simulator_load_without_torch():
    """What the rule above guards, run: importing them (and the packages above them) loads no torch."""
    modules = [".".join(("sao", *p.relative_to(ROLLOUT_DIR.parents[1]).with_suffix("").parts)).removesuffix(".__init__")
               for p in pure_rollout_files()]
    code = f"import importlib, sys\nfor m in {modules!r}: importlib.import_module(m)\nprint(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0 and out.stdout.strip() == "[]", (out.stdout, out.stderr[-2000:])


def test_every_mode_tells_events_apart_in_one_dispatch():
    """One ``dispatch`` picks the handler method for each event kind; a kind it does not know is a TypeError
    naming the mode. Every mode is such a handler."""
    from sao.rl.rollout.schedulers.dispatch import EventHandler, dispatch

    class Recorder:
        name = "recorder"

        def __init__(self) -> None:
            self.calls: list[tuple[str, object]] = []

        def on_finished(self, event, now):
            self.calls.append(("finished", now))
            return []

        def on_step_done(self, event, now):
            self.calls.append(("step_done", now))
            return []

        def on_sync_done(self, event):
            self.calls.append(("sync_done", event.version))
            return []

        def on_replica_died(self, event):
            self.calls.append(("died", event.replica))
            return []

        def on_replica_restarted(self, event):
            self.calls.append(("restarted", event.replica))
            return []

    r: EventHandler = Recorder()
    for event in (TrajectoryFinished(0, (0,)), TrainStepDone(1), SyncDone(0, 3), ReplicaDied(2), ReplicaRestarted(1)):
        assert dispatch(event, r, 7.0) == []
    assert r.calls == [("finished", 7.0), ("step_done", 7.0), ("sync_done", 3), ("died", 2), ("restarted", 1)]
    with pytest.raises(TypeError, match="recorder: unknown event 'nope'"):
        dispatch("nope", r, 0.0)  # type: ignore[arg-type]
    for mode in ("sync", "one_step_off", "async", "multi_version", "pipe"):
        s = make_scheduler(mode, SchedulerConfig(batch_size=2, group_size=2 if mode == "pipe" else 1), n_replicas=1)
        with pytest.raises(TypeError, match=f"{mode}: unknown event"):
            s.on_event("nope", 0.0)  # type: ignore[arg-type]
