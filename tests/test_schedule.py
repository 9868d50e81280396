"""The online-learning task scheduler: determinism and resume, each kind, config errors, and the
adaptation metrics against numbers derived by hand in the comments."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from sao.rl.prompts.curriculum import (
    PROBE_BASE,
    FamilyReward,
    ScheduleConfig,
    ScheduleError,
    ScheduledTaskStream,
    adaptation_lag,
    family_metrics,
    forgetting,
    history_from_metrics,
    make_schedule,
    per_family_reward,
    phase_shifts,
)
from sao.rl.prompts.tasks import TaskStream

ARITH = {"seed": 0, "max_digits": 4}
CONF = Path(__file__).resolve().parents[1] / "conf" / "schedule"


def stream(cfg: ScheduleConfig, seed: int = 0) -> ScheduledTaskStream:
    return ScheduledTaskStream("arithmetic", ARITH, seed, cfg)


def gated(**phase0) -> ScheduleConfig:
    return ScheduleConfig(kind="reward_gated", phases=[{"families": ["add"], **phase0}, {"families": ["mul"]}])


def digits(task_id: str) -> int:
    return int(task_id.split("-")[1][1:])


def fake_rewards(prompts):
    """A deterministic 'policy': add/sub always right, others right on even indices."""
    return [(p.family, 1.0 if p.family in ("add", "sub") or p.index % 2 == 0 else 0.0) for p in prompts]


# ---- determinism and resume ----------------------------------------------------------------------

@pytest.mark.parametrize("cfg, phases", [
    (ScheduleConfig(kind="phases", phases=[{"families": ["add"], "steps": 3}, {"families": ["mul", "div"]}]), [0, 1]),
    (ScheduleConfig(kind="drift", over_steps=8), [0]),
    # add always right: the window of 8 is full after step 2; min_steps 6 -> advances at step 7, after the resume
    (gated(advance_at=0.9, window=8, min_steps=6), [0, 1]),
])
def test_interrupted_run_resumes_on_the_same_prompts(cfg, phases):
    def run(s: ScheduledTaskStream, steps) -> list:
        seen = []
        for step in steps:
            s.set_step(step)
            prompts = s.take(4)
            s.observe(step, fake_rewards(prompts))
            seen += [(p.index, p.task_id, p.family, p.phase) for p in prompts]
        return seen

    whole = run(stream(cfg), range(1, 11))
    first = stream(cfg)
    part = run(first, range(1, 6))
    state = json.loads(json.dumps(first.state_dict()))  # plain JSON, as a checkpoint stores it
    resumed = stream(cfg)
    resumed.load_state_dict(state)
    assert resumed.take(0) == [] and resumed.distribution.phase == first.distribution.phase  # no re-decision
    assert part + run(resumed, range(6, 11)) == whole
    assert len({t for _, t, _, _ in whole}) == 40  # distinct prompts
    assert sorted({ph for *_, ph in whole}) == phases
    if cfg.kind == "reward_gated":
        assert [ph for i, _, _, ph in whole if i % 4 == 0] == [0] * 6 + [1] * 4  # steps 1..6, then 7..10


def test_constant_drift_reproduces_the_environments_own_stream():
    # same draw order as ArithmeticTasks (digits, then a uniform op) -> the same task ids
    cfg = ScheduleConfig(kind="drift", start_difficulty=0.5, end_difficulty=0.5)
    plain = TaskStream("arithmetic", {**ARITH, "difficulty": 0.5}, 0)
    assert [p.task_id for p in stream(cfg).take(50)] == [p.task_id for p in plain.take(50)]


def test_kind_none_delegates_to_task_stream_and_reads_its_checkpoints():
    plain = TaskStream("arithmetic", ARITH, 0)
    s = ScheduledTaskStream("arithmetic", ARITH, 0, ScheduleConfig())
    assert [p.task_id for p in s.take(5)] == [p.task_id for p in plain.take(5)]
    assert s.cursor == 5 and s.take(1)[0].family in ("add", "sub", "mul", "div")
    legacy = ScheduledTaskStream("arithmetic", ARITH, 0, ScheduleConfig())
    legacy.load_state_dict(plain.state_dict())  # {"env", "seed", "cursor"}: no kind
    assert legacy.cursor == 5 and legacy.take(1)[0].task_id == plain.take(1)[0].task_id


def test_checkpoint_of_another_schedule_is_refused():
    s = stream(ScheduleConfig(kind="drift"))
    with pytest.raises(ScheduleError, match="schedule 'drift'.*not 'arithmetic' seed 0 schedule 'phases'"):
        stream(ScheduleConfig(kind="phases", phases=[{"families": ["add"]}])).load_state_dict(s.state_dict())


# ---- phases --------------------------------------------------------------------------------------

def test_phases_switch_at_the_right_steps():
    # steps 3 and 2 -> ends 3, 5: steps 0..3 add, 4..5 mul, 6.. div (forever)
    cfg = ScheduleConfig(kind="phases", difficulty=0.0, phases=[
        {"families": ["add"], "steps": 3}, {"families": ["mul"], "steps": 2, "difficulty": 1.0}, {"families": ["div"]}])
    s = stream(cfg)
    got = {}
    for step in range(0, 9):
        s.set_step(step)
        prompts = s.take(10)
        got[step] = {(p.family, p.phase, digits(p.task_id)) for p in prompts}
    assert [got[k] for k in range(9)] == [{("add", 0, 1)}] * 4 + [{("mul", 1, 4)}] * 2 + [{("div", 2, 1)}] * 3
    assert s.metrics() == {"schedule/phase": 2.0, "schedule/difficulty": 0.0}


def test_weights_set_the_family_mix():
    # weights [3, 1] -> 75% add, 25% mul; 2000 draws: sd = sqrt(.75*.25/2000) = 0.0097, tolerance 0.04
    cfg = ScheduleConfig(kind="phases", phases=[{"families": ["add", "mul"], "weights": [3, 1]}])
    counts = Counter(p.family for p in stream(cfg).take(2000))
    assert abs(counts["add"] / 2000 - 0.75) < 0.04 and set(counts) == {"add", "mul"}


# ---- drift ---------------------------------------------------------------------------------------

def test_drift_interpolates_the_digit_mix():
    # max_digits 4: level = 1 + 3 d. over 100 steps from 0 to 1:
    # step 25: d 0.25 -> level 1.75 -> 25% 1-digit, 75% 2-digit
    # step 50: d 0.50 -> level 2.5  -> 50% 2-digit, 50% 3-digit
    # step 200: past over_steps -> d 1.0 -> all 4-digit. 2000 draws: sd <= 0.011, tolerance 0.04
    s = stream(ScheduleConfig(kind="drift", start_difficulty=0.0, end_difficulty=1.0, over_steps=100))
    expect = {25: {1: 0.25, 2: 0.75}, 50: {2: 0.5, 3: 0.5}, 200: {4: 1.0}}
    for step, mix in expect.items():
        assert s.set_step(step).difficulty == min(step / 100, 1.0)
        counts = Counter(digits(p.task_id) for p in s.take(2000))
        assert set(counts) == set(mix)
        for d, frac in mix.items():
            assert abs(counts[d] / 2000 - frac) < 0.04, (step, d, counts)


# ---- reward-gated --------------------------------------------------------------------------------

def test_reward_gated_waits_for_min_steps():
    sched = make_schedule(gated(advance_at=0.8, window=4, min_steps=2))
    assert sched.set_step(1).phase == 0  # phase 0 starts at step 1
    for _ in range(4):
        sched.observe(1, "add", 1.0)  # window [1,1,1,1], mean 1.0 >= 0.8
    assert sched.set_step(2).phase == 0  # 2 - 1 = 1 step in the phase < min_steps 2
    assert sched.set_step(3).phase == 1  # 3 - 1 = 2 >= 2 and the window clears the gate
    assert sched.set_step(9).phase == 1  # the last phase never ends
    assert sched.state_dict() == {"step": 9, "phase": 1, "phase_start": 3, "window": []}


def test_reward_gated_needs_a_full_window_over_the_threshold():
    sched = make_schedule(gated(advance_at=0.8, window=4, min_steps=0))
    sched.set_step(1)
    for r in (1.0, 1.0, 1.0):
        sched.observe(1, "add", r)
    assert sched.set_step(2).phase == 0  # 3 of 4 rewards: the window is not full yet
    sched.observe(2, "add", 0.0)
    sched.observe(2, "mul", 1.0)  # not a family of this phase: ignored
    sched.observe(0, "add", 1.0)  # step 0 < phase start 1 (a late trajectory): ignored
    assert sched.metrics() == {"schedule/gate_reward": 0.75, "schedule/gate_fill": 1.0}  # [1,1,1,0]
    assert sched.set_step(3).phase == 0  # 0.75 < 0.8
    sched.observe(3, "add", 1.0)  # [1,1,0,1]: 0.75
    assert sched.set_step(4).phase == 0
    sched.observe(4, "add", 1.0)  # [1,0,1,1]: 0.75
    sched.observe(4, "add", 1.0)  # [0,1,1,1]: 0.75
    assert sched.set_step(4).phase == 0  # the same step again: no new decision
    sched.observe(4, "add", 1.0)  # [1,1,1,1]: 1.0 >= 0.8
    assert sched.set_step(4).phase == 0 and sched.set_step(5).phase == 1
    with pytest.raises(ValueError, match="only move forward"):
        sched.set_step(4)


def test_stream_feeds_trajectories_to_the_gate_and_skips_failed_ones():
    s = stream(gated(advance_at=1.0, window=2, min_steps=0))
    s.set_step(1)
    ok = SimpleNamespace(status="ok", info={"family": "add"}, task_id="add-d1-s0-i0", reward=1.0)
    from_id = SimpleNamespace(status="ok", info={}, task_id="add-d1-s0-i1", reward=1.0)
    failed = SimpleNamespace(status="failed", info={"family": "add"}, task_id="add-d1-s0-i2", reward=0.0)
    rows = s.observe(1, [ok, failed, from_id])
    assert rows == [FamilyReward(1, "add", 1.0), FamilyReward(1, "add", 1.0)]
    assert s.set_step(2).phase == 1 and s.take(3)[0].family == "mul"


# ---- probes --------------------------------------------------------------------------------------

def test_probes_cover_every_family_seen_with_a_fixed_set():
    cfg = ScheduleConfig(kind="phases", eval_every=5, eval_prompts=3,
                         phases=[{"families": ["add"], "steps": 2}, {"families": ["mul"], "difficulty": 1.0}])
    s = stream(cfg)
    s.set_step(1)
    first = s.probes()
    assert [(p.family, p.index, p.probe) for p in first] == [("add", PROBE_BASE + j, True) for j in range(3)]
    s.set_step(3)
    assert not s.probe_due(3) and s.probe_due(5)
    later = s.probes()
    assert later[:3] == first  # the same add probes every time
    assert {(p.family, digits(p.task_id)) for p in later[3:]} == {("mul", 4)}  # at mul's difficulty 1.0


# ---- configuration -------------------------------------------------------------------------------

@pytest.mark.parametrize("cfg, message", [
    (ScheduleConfig(kind="phase"), "unknown schedule kind 'phase'. Did you mean 'phases'?"),
    (ScheduleConfig(kind="phases"), "needs a non-empty schedule.phases"),
    (ScheduleConfig(kind="phases", phases=[{"families": ["mull"]}]),
     r"phases\[0\]: unknown family 'mull'. Did you mean 'mul'"),
    (ScheduleConfig(kind="drift", families=["ad"]), "unknown family 'ad'. Did you mean 'add'"),
    (ScheduleConfig(kind="phases", phases=[{"families": ["add"]}, {"families": ["mul"]}]),
     "needs 'steps' on every phase but the last"),
    (ScheduleConfig(kind="reward_gated", phases=[{"families": ["add"], "steps": 5}, {"families": ["mul"]}]),
     "needs 'advance_at'"),
    (ScheduleConfig(kind="phases", phases=[{"family": ["add"]}]),
     "unknown key 'family'. Did you mean 'families'"),
    (ScheduleConfig(kind="phases", phases=[{"families": []}]), "families must be a non-empty list"),
    (ScheduleConfig(kind="phases", phases=[{"families": ["add", "mul"], "weights": [1]}]), "weights must be 2"),
    (ScheduleConfig(kind="phases", phases=[{"families": ["add"], "difficulty": 1.5}]),
     r"difficulty must be in \[0, 1\]"),
    (ScheduleConfig(kind="drift", phases=[{"families": ["add"]}]), "kind 'drift' uses schedule.families"),
    (ScheduleConfig(kind="drift", over_steps=0), "over_steps must be >= 1"),
])
def test_bad_configs_say_what_to_change(cfg, message):
    with pytest.raises(ScheduleError, match=message):
        make_schedule(cfg)


def test_only_kind_none_runs_on_other_environments():
    cfg = ScheduleConfig(kind="drift")
    with pytest.raises(ScheduleError, match="env 'beyond-aime' has none. Use schedule=none"):
        ScheduledTaskStream("beyond-aime", {}, 0, cfg)


@pytest.mark.parametrize("name", ["none", "phases", "drift", "reward_gated"])
def test_yaml_files_compose_onto_the_schema_and_validate(name):
    merged = OmegaConf.merge(OmegaConf.structured(ScheduleConfig), OmegaConf.load(CONF / f"{name}.yaml"))
    cfg = OmegaConf.to_object(merged)
    assert isinstance(cfg, ScheduleConfig) and cfg.kind == name
    make_schedule(cfg)


# ---- metrics -------------------------------------------------------------------------------------

def rows(step: int, family: str, *rewards: float, probe: bool = False) -> list[FamilyReward]:
    return [FamilyReward(step, family, r, probe) for r in rewards]


def test_per_family_reward_and_logged_metrics():
    h = rows(1, "add", 1.0, 0.0) + rows(1, "mul", 0.0) + rows(2, "add", 1.0) + rows(2, "add", 0.5, probe=True)
    # add: step 1 (1 + 0) / 2 = 0.5, step 2 1.0; mul: step 1 0.0
    assert per_family_reward(h) == {"add": {1: 0.5, 2: 1.0}, "mul": {1: 0.0}}
    assert per_family_reward(h, probe=True) == {"add": {2: 0.5}}
    assert family_metrics(h[:3]) == {"reward/family/add": 0.5, "reward/family/mul": 0.0}
    logged = [{"step": 1, "reward/family/add": 0.5, "reward/family/mul": 0.0, "loss/policy": 3.0},
              {"step": 2, "reward/family/add": 1.0, "probe/family/add": 0.5}]
    assert per_family_reward(history_from_metrics(logged)) == per_family_reward(h)


def test_adaptation_lag():
    # add trained at 0.5 for steps 1..10; shift at 11 to mul: 0.0, 0.2, 0.3, 0.45, 0.6 (steps 11..15)
    h = [r for s in range(1, 11) for r in rows(s, "add", 0.5)]
    h += [r for s, x in zip(range(11, 16), (0.0, 0.2, 0.3, 0.45, 0.6)) for r in rows(s, "mul", x)]
    # second shift at 16 to div, which stays at 0.1 (steps 16..20)
    h += [r for s in range(16, 21) for r in rows(s, "div", 0.1)]
    lags = adaptation_lag(h, [11, 16], pre_window=4)
    # shift 11: pre level = mean(steps 7..10) = 0.5 -> target 0.4; step 14 (0.45) is the first >= 0.4 -> lag 3
    assert (lags[0].shift, lags[0].pre_level, lags[0].lag) == (11, 0.5, 3)
    assert lags[0].target == pytest.approx(0.4)
    # shift 16: pre level = mean(0.2, 0.3, 0.45, 0.6) = 1.55 / 4 = 0.3875 -> target 0.31; div stays 0.1 -> None
    assert lags[1].pre_level == pytest.approx(0.3875) and lags[1].target == pytest.approx(0.31)
    assert lags[1].lag is None
    # the shift's own step counts: frac 0.1 -> target 0.05 at shift 11... 0.0 < 0.05, step 12 (0.2) -> lag 1
    assert adaptation_lag(h, [11], pre_window=4, frac=0.1)[0].lag == 1
    assert phase_shifts({s: (0 if s <= 10 else 1 if s <= 15 else 2) for s in range(1, 21)}) == [11, 16]


def test_adaptation_lag_weighs_families_equally():
    # step 1: add mean (1 + 1 + 1) / 3 = 1, mul 0 -> step reward (1 + 0) / 2 = 0.5, not 3 / 4
    # shift at 2: target 0.8 * 0.5 = 0.4; step 2 div 0.4 -> lag 0
    h = rows(1, "add", 1.0, 1.0, 1.0) + rows(1, "mul", 0.0) + rows(2, "div", 0.4)
    assert adaptation_lag(h, [2], pre_window=1)[0].pre_level == 0.5
    assert adaptation_lag(h, [2], pre_window=1)[0].lag == 0
    with pytest.raises(ValueError, match="no training rewards in the 1 steps before the shift at step 1"):
        adaptation_lag(h, [1], pre_window=1)


def test_forgetting():
    # add trained steps 1..4 at 0.2, 0.6, 0.8, 0.7 -> best 0.8 at step 3
    h = [r for s, x in zip(range(1, 5), (0.2, 0.6, 0.8, 0.7)) for r in rows(s, "add", x)]
    # mul trained steps 5..8 (still trained at the last step: not an earlier family)
    h += [r for s in range(5, 9) for r in rows(s, "mul", 0.3)]
    # probes: add at 4 (while trained: ignored), at 6 (0.5, 0.5 -> 0.5), at 8 (0.2, 0.4 -> 0.3); mul at 8
    h += rows(4, "add", 0.9, probe=True) + rows(6, "add", 0.5, 0.5, probe=True) + rows(8, "add", 0.2, 0.4, probe=True)
    h += rows(8, "mul", 0.3, probe=True)
    out = forgetting(h)
    assert set(out) == {"add"}
    f = out["add"]
    # latest probe after step 4 is step 8: 0.3; drop = 0.8 - 0.3 = 0.5
    assert (f.best, f.best_step, f.probe_step) == (0.8, 3, 8)
    assert f.probe == pytest.approx(0.3) and f.drop == pytest.approx(0.5)
    assert forgetting(h[:4]) == {}  # no probe after add stopped: nothing to report
