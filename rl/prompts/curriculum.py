"""Online learning: a task distribution that changes while training runs, and how to measure adaptation.

A *schedule* says, at each train step, which task families prompts are drawn from (uniform among
them unless weights are given) and at which arithmetic difficulty. Kinds (``ScheduleConfig.kind``):

* ``none``: the environment's own distribution (the plain :class:`~sao.rl.prompts.tasks.TaskStream`).
* ``phases``: piecewise phases of fixed length. Phase ``i`` covers train steps
  ``(end_{i-1}, end_i]`` with ``end_i = steps_0 + ... + steps_i`` (steps count from 1, as the
  trainer's do; step 0, critic pretraining, belongs to phase 0); the last phase never ends.
* ``drift``: one set of families; difficulty moves linearly from ``start_difficulty`` at step 0 to
  ``end_difficulty`` at step ``over_steps``, then stays there.
* ``reward_gated``: phases in order; at :meth:`Schedule.set_step` the run moves to the next phase
  when (a) at least ``min_steps`` steps passed since the phase began, and (b) the last ``window``
  rewards observed in this phase on the phase's families (pooled) are all there and their mean is
  ``>= advance_at``. Rewards observed for a step before the phase began (late trajectories) and
  rewards of other families are ignored; the window starts empty in each phase.

:class:`ScheduledTaskStream` draws prompt ``i`` as a pure function of ``(seed, i, distribution)``:
``rng = default_rng([seed, i])``, digits first (as :class:`~sao.envs.arithmetic.ArithmeticTasks`
does: level ``1 + difficulty * (max_digits - 1)``, fractional levels mix neighbouring digit counts),
then the family; the task id comes from :func:`~sao.envs.arithmetic.make_task`. All state (cursor,
step, the schedule's phase and reward window, families seen) round-trips through JSON, so a resumed
run draws exactly the prompts an uninterrupted one would.

Forgetting is measured with *probes*: every ``eval_every`` steps a fixed set of ``eval_prompts``
prompts per family seen so far (at the difficulty the family was last trained at), not trained on.

Metrics (pure functions over :class:`FamilyReward` rows): :func:`per_family_reward`,
:func:`adaptation_lag`, :func:`forgetting`; :func:`history_from_metrics` rebuilds the rows from
``metrics.jsonl`` (keys ``reward/family/<f>`` and ``probe/family/<f>``).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections import defaultdict, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from sao.envs import resolve
from sao.envs.arithmetic import OPS, make_task
from sao.hints import did_you_mean
from sao.rl.config import ScheduleConfig
from sao.rl.errors import ScheduleError
from sao.rl.prompts.tasks import TaskStream

FAMILIES: tuple[str, ...] = tuple(OPS.values())  # add, sub, mul, div
PROBE_BASE = 10**12  # probe prompt j has index PROBE_BASE + j: never a training index
_ARITH_ID = re.compile(r"^(add|sub|mul|div)-d\d+-s\d+-i\d+$")


@dataclass(frozen=True)
class Phase:
    """One phase: ``families`` drawn with ``weights`` (normalized; uniform if not given) at ``difficulty``."""

    families: tuple[str, ...]
    weights: tuple[float, ...]
    difficulty: float
    steps: int | None = None
    advance_at: float | None = None
    min_steps: int = 0
    window: int = 32


@dataclass(frozen=True)
class Distribution:
    """What prompts are drawn from now. Empty ``families``: the environment's own (kind ``none``)."""

    families: tuple[str, ...]
    weights: tuple[float, ...]
    difficulty: float | None
    phase: int = 0


@dataclass(frozen=True)
class ScheduledPrompt:
    """A prompt for training (or a probe): the trainer reads ``index`` and ``task_id`` as of a PromptRef."""

    index: int
    task_id: str
    family: str | None
    phase: int
    probe: bool = False


@dataclass(frozen=True)
class FamilyReward:
    """One reward of the history the metrics read; ``probe``: from a probe, not trained on."""

    step: int
    family: str
    reward: float
    probe: bool = False


# ---------------------------------------------------------------- validation

def _known_family(name: str, where: str) -> str:
    if name not in FAMILIES:
        raise ScheduleError(f"{where}: unknown family {name!r}.{did_you_mean(name, list(FAMILIES))} "
                            f"Known: {', '.join(FAMILIES)}")
    return name


def _weights(families: tuple[str, ...], weights: Iterable[float] | None, where: str) -> tuple[float, ...]:
    if weights is None:
        return tuple(1.0 / len(families) for _ in families)
    w = tuple(float(x) for x in weights)
    if len(w) != len(families) or any(x < 0 for x in w) or sum(w) <= 0:
        raise ScheduleError(f"{where}: weights must be {len(families)} non-negative numbers (one per family) "
                            f"with a positive sum, got {list(w)}")
    return tuple(x / sum(w) for x in w)


def _difficulty(x: float, where: str) -> float:
    if not 0.0 <= float(x) <= 1.0:
        raise ScheduleError(f"{where}: difficulty must be in [0, 1], got {x}")
    return float(x)


def _families(names: Any, where: str) -> tuple[str, ...]:
    if isinstance(names, str) or not names:
        raise ScheduleError(f"{where}: families must be a non-empty list such as ['add'], got {names!r}")
    return tuple(_known_family(str(n), where) for n in names)


_PHASE_KEYS = [f.name for f in dataclasses.fields(Phase)]


def parse_phase(raw: Mapping[str, Any], i: int, cfg: ScheduleConfig) -> Phase:
    """One ``phases`` entry as a :class:`Phase`, with the config's defaults; fails on a bad entry."""
    where = f"schedule.phases[{i}]"
    for key in raw:
        if key not in _PHASE_KEYS:
            raise ScheduleError(f"{where}: unknown key {key!r}.{did_you_mean(str(key), _PHASE_KEYS)} "
                                f"Known: {', '.join(_PHASE_KEYS)}")
    if "families" not in raw:
        raise ScheduleError(f"{where}: needs 'families', e.g. {{families: [add], steps: 50}}")
    families = _families(raw["families"], where)
    phase = Phase(families, _weights(families, raw.get("weights"), where),
                  _difficulty(raw.get("difficulty", cfg.difficulty), where),
                  None if raw.get("steps") is None else int(raw["steps"]),
                  None if raw.get("advance_at") is None else float(raw["advance_at"]),
                  int(raw.get("min_steps", cfg.min_steps)), int(raw.get("window", cfg.window)))
    if phase.steps is not None and phase.steps < 1:
        raise ScheduleError(f"{where}: steps must be >= 1, got {phase.steps}")
    if phase.window < 1 or phase.min_steps < 0:
        raise ScheduleError(f"{where}: window must be >= 1 and min_steps >= 0, got {phase.window}, {phase.min_steps}")
    return phase


def _phases(cfg: ScheduleConfig, need: str) -> tuple[Phase, ...]:
    if not cfg.phases:
        raise ScheduleError(f"schedule kind {cfg.kind!r} needs a non-empty schedule.phases list, "
                            f"e.g. [{{families: [add], {need}: ...}}, {{families: [mul]}}]")
    phases = tuple(parse_phase(raw, i, cfg) for i, raw in enumerate(cfg.phases))
    for i, p in enumerate(phases[:-1]):
        if getattr(p, need) is None:
            raise ScheduleError(f"schedule.phases[{i}]: kind {cfg.kind!r} needs {need!r} on every phase but the last")
    return phases


# ---------------------------------------------------------------- schedules

class Schedule(Protocol):
    """The distribution over train steps. ``set_step`` is idempotent for a step and never goes back."""

    def set_step(self, step: int) -> Distribution: ...

    def observe(self, step: int, family: str, reward: float) -> None: ...

    def metrics(self) -> dict[str, float]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class _Stepped:
    """The state of a schedule that is a pure function of the step: the step alone."""

    step: int | None = None

    def _move(self, step: int) -> None:
        if self.step is not None and step < self.step:
            raise ValueError(f"schedule steps only move forward: at step {self.step}, asked for {step}")
        self.step = step

    def observe(self, step: int, family: str, reward: float) -> None:
        pass

    def metrics(self) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = state["step"]


class NoSchedule(_Stepped):
    """``none``: the environment's own distribution."""

    def __init__(self, cfg: ScheduleConfig):
        if cfg.phases:
            raise ScheduleError("schedule.phases is set but kind 'none' uses none; pick kind=phases or reward_gated")

    def set_step(self, step: int) -> Distribution:
        self._move(step)
        return Distribution((), (), None, 0)


class PhaseSchedule(_Stepped):
    """``phases``: phase ``i`` covers steps ``(end_{i-1}, end_i]``; the last phase never ends."""

    def __init__(self, cfg: ScheduleConfig):
        self.phases = _phases(cfg, "steps")
        self.ends = np.cumsum([p.steps or 0 for p in self.phases[:-1]]).tolist()

    def phase_at(self, step: int) -> int:
        return sum(step > end for end in self.ends)

    def set_step(self, step: int) -> Distribution:
        self._move(step)
        i = self.phase_at(step)
        p = self.phases[i]
        return Distribution(p.families, p.weights, p.difficulty, i)


class DriftSchedule(_Stepped):
    """``drift``: difficulty ``start + (end - start) * min(step / over_steps, 1)``; families fixed."""

    def __init__(self, cfg: ScheduleConfig):
        if cfg.phases:
            raise ScheduleError("schedule.phases is set but kind 'drift' uses schedule.families; remove the phases")
        if cfg.over_steps < 1:
            raise ScheduleError(f"schedule.over_steps must be >= 1, got {cfg.over_steps}")
        self.families = _families(cfg.families, "schedule.families")
        self.weights = _weights(self.families, cfg.weights, "schedule.weights")
        self.start = _difficulty(cfg.start_difficulty, "schedule.start_difficulty")
        self.end = _difficulty(cfg.end_difficulty, "schedule.end_difficulty")
        self.over_steps = cfg.over_steps

    def difficulty_at(self, step: int) -> float:
        return self.start + (self.end - self.start) * min(max(step, 0) / self.over_steps, 1.0)

    def set_step(self, step: int) -> Distribution:
        self._move(step)
        return Distribution(self.families, self.weights, self.difficulty_at(step), 0)


class RewardGatedSchedule:
    """``reward_gated``: advance when the phase's reward window clears ``advance_at`` (module doc)."""

    def __init__(self, cfg: ScheduleConfig):
        self.phases = _phases(cfg, "advance_at")
        self.step: int | None = None
        self.phase = 0
        self.phase_start: int | None = None
        self.window: deque[float] = deque(maxlen=self.phases[0].window)

    def _ready(self, step: int) -> bool:
        p = self.phases[self.phase]
        return (self.phase + 1 < len(self.phases) and self.phase_start is not None
                and step - self.phase_start >= p.min_steps and len(self.window) == p.window
                and sum(self.window) / p.window >= p.advance_at)

    def set_step(self, step: int) -> Distribution:
        if self.step is not None and step < self.step:
            raise ValueError(f"schedule steps only move forward: at step {self.step}, asked for {step}")
        if step != self.step:
            if self._ready(step):
                self.phase += 1
                self.phase_start = None
                self.window = deque(maxlen=self.phases[self.phase].window)
            if self.phase_start is None:
                self.phase_start = step
            self.step = step
        p = self.phases[self.phase]
        return Distribution(p.families, p.weights, p.difficulty, self.phase)

    def observe(self, step: int, family: str, reward: float) -> None:
        late = self.phase_start is not None and step < self.phase_start
        if not late and family in self.phases[self.phase].families:
            self.window.append(float(reward))

    def metrics(self) -> dict[str, float]:
        mean = sum(self.window) / len(self.window) if self.window else math.nan
        return {"schedule/gate_reward": mean, "schedule/gate_fill": len(self.window) / self.window.maxlen}

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "phase": self.phase, "phase_start": self.phase_start, "window": list(self.window)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step, self.phase, self.phase_start = state["step"], int(state["phase"]), state["phase_start"]
        if not 0 <= self.phase < len(self.phases):
            raise ScheduleError(f"checkpoint is in phase {self.phase}, but schedule.phases has {len(self.phases)}")
        self.window = deque(state["window"], maxlen=self.phases[self.phase].window)


SCHEDULES: dict[str, type] = {"none": NoSchedule, "phases": PhaseSchedule, "drift": DriftSchedule,
                              "reward_gated": RewardGatedSchedule}


def make_schedule(cfg: ScheduleConfig) -> Schedule:
    """The schedule of ``cfg.kind``; a bad config fails here, with what to change."""
    if cfg.kind not in SCHEDULES:
        raise ScheduleError(f"unknown schedule kind {cfg.kind!r}.{did_you_mean(cfg.kind, list(SCHEDULES))} "
                            f"Known: {', '.join(SCHEDULES)}")
    if cfg.eval_every < 0 or cfg.eval_prompts < 1:
        raise ScheduleError(f"schedule.eval_every must be >= 0 and eval_prompts >= 1, "
                            f"got {cfg.eval_every}, {cfg.eval_prompts}")
    return SCHEDULES[cfg.kind](cfg)


# ---------------------------------------------------------------- the stream

def draw(seed: int, index: int, dist: Distribution, max_digits: int) -> tuple[str, int]:
    """``(family, digits)`` of prompt ``index``: digits first, then the family (module doc)."""
    rng = np.random.default_rng([seed, index])
    level = 1.0 + (dist.difficulty or 0.0) * (max_digits - 1)
    digits = int(level) + int(rng.random() < level - int(level))
    if len(set(dist.weights)) == 1:  # uniform: the same draw as ArithmeticTasks
        k = int(rng.integers(len(dist.families)))
    else:
        k = min(int(np.searchsorted(np.cumsum(dist.weights), rng.random(), side="right")), len(dist.families) - 1)
    return dist.families[k], min(digits, max_digits)


def family_of(item: Any) -> tuple[str, float] | None:
    """``(family, reward)`` of a pair or a trajectory (``info['family']``, else its arithmetic task id);
    None for a trajectory whose status is not ok (an engine failure says nothing about the task)."""
    if isinstance(item, (tuple, list)):
        return str(item[0]), float(item[1])
    if getattr(item, "status", "ok") != "ok":
        return None
    family = (getattr(item, "info", None) or {}).get("family")
    if family is None and _ARITH_ID.match(getattr(item, "task_id", "")):
        family = item.task_id.split("-", 1)[0]
    return (str(family), float(item.reward)) if family is not None else None


def family_rewards(step: int, items: Iterable[Any], *, probe: bool = False) -> list[FamilyReward]:
    """History rows from trajectories or ``(family, reward)`` pairs (see :func:`family_of`)."""
    pairs = (family_of(x) for x in items)
    return [FamilyReward(step, f, r, probe) for f, r in (p for p in pairs if p is not None)]


def family_metrics(rows: Iterable[FamilyReward]) -> dict[str, float]:
    """``reward/family/<f>`` (trained) and ``probe/family/<f>`` (probes): mean reward per family."""
    sums: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        sums[("probe" if r.probe else "reward") + "/family/" + r.family].append(r.reward)
    return {k: sum(v) / len(v) for k, v in sorted(sums.items())}


class ScheduledTaskStream:
    """A :class:`~sao.rl.prompts.tasks.TaskStream` whose distribution follows a schedule (module doc).

    Per train step: ``set_step(step)``, ``take(n)``, run the episodes, ``observe(step, trajectories)``;
    when ``probe_due(step)``, also run ``probes()`` (not trained on) and log their rewards.
    Arithmetic only (the schedule chooses families and difficulty; the env's ``ops`` and
    ``difficulty`` are ignored, its ``seed`` and ``max_digits`` are used); kind ``none`` delegates
    to :class:`TaskStream` for any environment.
    """

    def __init__(self, env_name: str, env_kwargs: dict[str, Any], seed: int, cfg: ScheduleConfig):
        self.env_name = resolve(env_name).name
        self.seed = seed
        self.cfg = cfg
        self.schedule = make_schedule(cfg)
        self.step = 0
        self.seen: dict[str, float] = {}  # family -> the difficulty it was last drawn at
        self._dist: Distribution | None = None
        self._plain: TaskStream | None = None
        self._cursor = 0
        if cfg.kind == "none":
            self._plain = TaskStream(self.env_name, env_kwargs, seed)
        elif self.env_name != "arithmetic":
            raise ScheduleError(f"schedule kind {cfg.kind!r} draws arithmetic families ({', '.join(FAMILIES)}); "
                                f"env {self.env_name!r} has none. Use schedule=none with this environment")
        self.task_seed = int(env_kwargs.get("seed", 0))
        self.max_digits = int(env_kwargs.get("max_digits", 4))
        self.split = str(env_kwargs.get("split", "all"))  # train: held-out problems are never drawn

    @property
    def cursor(self) -> int:
        return self._plain.cursor if self._plain is not None else self._cursor

    @property
    def distribution(self) -> Distribution:
        if self._dist is None:
            self.set_step(self.step)
        return self._dist

    def set_step(self, step: int) -> Distribution:
        """Move the schedule to train ``step`` (may advance a reward-gated phase); call before ``take``."""
        self._dist = self.schedule.set_step(step)
        self.step = step
        for f in self._dist.families:
            self.seen[f] = self._dist.difficulty
        return self._dist

    def take(self, n: int) -> list[ScheduledPrompt]:
        """The next ``n`` prompts under the current distribution; advances the cursor."""
        dist = self.distribution
        if self._plain is not None:
            return [ScheduledPrompt(p.index, p.task_id, p.task_id.split("-", 1)[0] if _ARITH_ID.match(p.task_id)
                                    else None, 0) for p in self._plain.take(n)]
        out = []
        for i in range(self._cursor, self._cursor + n):
            family, digits = draw(self.task_seed, i, dist, self.max_digits)
            out.append(ScheduledPrompt(i, make_task(family, digits, self.task_seed, i, self.split).task_id, family, dist.phase))
        self._cursor += n
        return out

    def observe(self, step: int, items: Iterable[Any]) -> list[FamilyReward]:
        """Feed the rewards of ``step``'s trajectories (or ``(family, reward)`` pairs) to the schedule;
        returns them as history rows. Trajectories that failed are skipped."""
        rows = family_rewards(step, items)
        for r in rows:
            self.schedule.observe(step, r.family, r.reward)
        return rows

    def probe_due(self, step: int) -> bool:
        return self.cfg.eval_every > 0 and step % self.cfg.eval_every == 0 and bool(self.seen)

    def probes(self) -> list[ScheduledPrompt]:
        """The fixed probe set of every family seen so far, at the difficulty it was last trained at."""
        out = []
        for family, difficulty in sorted(self.seen.items()):
            dist = Distribution((family,), (1.0,), difficulty)
            for j in range(self.cfg.eval_prompts):
                _, digits = draw(self.task_seed, PROBE_BASE + j, dist, self.max_digits)
                task_id = make_task(family, digits, self.task_seed, PROBE_BASE + j, self.split).task_id
                out.append(ScheduledPrompt(PROBE_BASE + j, task_id, family, -1, probe=True))
        return out

    def metrics(self) -> dict[str, float]:
        """``schedule/phase``, ``schedule/difficulty`` (and the gate's, for reward_gated)."""
        dist = self.distribution
        out = {"schedule/phase": float(dist.phase)}
        if dist.difficulty is not None:
            out["schedule/difficulty"] = dist.difficulty
        return {**out, **self.schedule.metrics()}

    def state_dict(self) -> dict[str, Any]:
        return {"env": self.env_name, "seed": self.seed, "kind": self.cfg.kind, "cursor": self.cursor,
                "step": self.step, "seen": dict(self.seen), "schedule": self.schedule.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        kind = state.get("kind", "none")  # a plain TaskStream checkpoint has no kind
        if (state["env"], state["seed"], kind) != (self.env_name, self.seed, self.cfg.kind):
            raise ScheduleError(f"checkpoint is for env {state['env']!r} seed {state['seed']} schedule {kind!r}, "
                                f"not {self.env_name!r} seed {self.seed} schedule {self.cfg.kind!r}")
        if self._plain is not None:
            self._plain.load_state_dict(state)
        self._cursor = int(state["cursor"])
        self.step = int(state.get("step", 0))
        self.seen = {str(k): v for k, v in state.get("seen", {}).items()}
        if "schedule" in state:
            self.schedule.load_state_dict(state["schedule"])
        self._dist = None  # recomputed by the (idempotent) set_step of the saved step


# ---------------------------------------------------------------- metrics

def per_family_reward(history: Iterable[FamilyReward], *, probe: bool = False) -> dict[str, dict[int, float]]:
    """``family -> {step: mean reward}`` over the training rows (``probe=False``) or the probe rows."""
    acc: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in history:
        if r.probe == probe:
            acc[r.family][r.step].append(r.reward)
    return {f: {s: sum(v) / len(v) for s, v in sorted(by.items())} for f, by in sorted(acc.items())}


def step_reward(history: Iterable[FamilyReward]) -> dict[int, float]:
    """``step -> `` the mean over the families trained at that step of their mean reward (each family
    weighs the same, so rows and per-family means from ``metrics.jsonl`` give the same numbers)."""
    by_step: dict[int, list[float]] = defaultdict(list)
    for series in per_family_reward(history).values():
        for s, r in series.items():
            by_step[s].append(r)
    return {s: sum(v) / len(v) for s, v in sorted(by_step.items())}


@dataclass(frozen=True)
class Adaptation:
    """One shift: ``pre_level`` = mean step reward over the ``pre_window`` steps before ``shift``;
    ``target = frac * pre_level``; ``lag`` = steps from ``shift`` to the first step (``>= shift`` and
    before the next shift) whose step reward is ``>= target``, None if none is."""

    shift: int
    pre_level: float
    target: float
    lag: int | None


def adaptation_lag(history: Iterable[FamilyReward], shift_steps: Iterable[int], pre_window: int,
                   frac: float = 0.8) -> list[Adaptation]:
    """How fast the policy regains ``frac`` of its pre-shift reward after each shift (see :class:`Adaptation`).

    A shift step is the first step of a new phase; step rewards are from :func:`step_reward`.
    """
    if pre_window < 1:
        raise ValueError(f"pre_window must be >= 1, got {pre_window}")
    rewards = step_reward(history)
    shifts = sorted(shift_steps)
    out = []
    for k, shift in enumerate(shifts):
        pre = [r for s, r in rewards.items() if shift - pre_window <= s < shift]
        if not pre:
            raise ValueError(f"no training rewards in the {pre_window} steps before the shift at step {shift}")
        level = sum(pre) / len(pre)
        stop = shifts[k + 1] if k + 1 < len(shifts) else math.inf
        hit = next((s for s, r in rewards.items() if shift <= s < stop and r >= frac * level), None)
        out.append(Adaptation(shift, level, frac * level, None if hit is None else hit - shift))
    return out


@dataclass(frozen=True)
class Forgetting:
    """A family no longer trained: its best per-step reward while trained vs its latest probe after."""

    family: str
    best: float
    best_step: int
    probe: float
    probe_step: int

    @property
    def drop(self) -> float:
        return self.best - self.probe


def forgetting(history: Iterable[FamilyReward]) -> dict[str, Forgetting]:
    """Per earlier family (last trained before the history's last training step) with a probe after
    its last training step: best trained reward, latest probe, and ``drop = best - probe``."""
    history = list(history)
    trained, probed = per_family_reward(history), per_family_reward(history, probe=True)
    last = max((s for series in trained.values() for s in series), default=None)
    out = {}
    for family, series in trained.items():
        stopped = max(series)
        after = {s: r for s, r in probed.get(family, {}).items() if s > stopped}
        if stopped < last and after:
            best_step = max(series, key=lambda s: (series[s], -s))  # the earliest of equal bests
            probe_step = max(after)
            out[family] = Forgetting(family, series[best_step], best_step, after[probe_step], probe_step)
    return out


def phase_shifts(phase_by_step: Mapping[int, float]) -> list[int]:
    """The steps whose ``schedule/phase`` differs from the previous logged step's (the shift steps)."""
    steps = sorted(phase_by_step)
    return [b for a, b in zip(steps, steps[1:]) if phase_by_step[b] != phase_by_step[a]]


def history_from_metrics(rows: Iterable[Mapping[str, Any]]) -> list[FamilyReward]:
    """History rows from ``metrics.jsonl`` lines (``step`` and ``reward/family/<f>``, ``probe/family/<f>``)."""
    out = []
    for row in rows:
        for key, value in row.items():
            kind, _, family = key.partition("/family/")
            if family and kind in ("reward", "probe") and value is not None and not math.isnan(value):
                out.append(FamilyReward(int(row["step"]), family, float(value), kind == "probe"))
    return out
