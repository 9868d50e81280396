"""Evaluate a model on a benchmark: every (task, sample) pair is one episode of the agent loop.

Outputs in ``output/``:
* ``trajectories.jsonl``, one line per episode, appended as episodes finish;
* ``results.jsonl``, per task: ``task_id`` and the per-sample ``correct`` values;
* ``summary.json``: pass@1, unbiased pass@k, fallback-graded tasks, tokens, wall time, the mode, the
  episodes per ``exit_status`` (:mod:`sao.agents.loop.exits`; more than 5% cut by a limit: a warning,
  :func:`cut_warning`), ``autosubmit``, the budgets the episodes got (``budgets``: the benchmark's,
  :mod:`sao.envs.budgets`, unless a flag set one) and the model's context window (``max_model_len``); with
  an agent plug-in, the capture proxy's counts over its episodes (``capture``: calls, merged, split and
  why, pinned and failed calls; :mod:`.capture_counts`), ...
* ``run.json``: the configuration and the selection of tasks (:mod:`.selection`), checked on ``--resume``,
  and the budgets;
* ``vllm.log`` when a local engine was started;
* SWE benchmarks: ``images.json``, the images this run pulled or built (:mod:`.swe_images`, for
  ``--clean-images``), and in ``summary.json`` the disk the images take at the start and the end;
* SWE benchmarks: ``preds.json`` and ``predictions.jsonl`` (the predictions in swebench's formats),
  ``report.json`` (the harness's run report), ``reports/ID.json`` and ``trajs/ID.traj.json``, per
  sample with ``--samples`` > 1 (see :mod:`.swe_outputs`).

Resume re-reads ``trajectories.jsonl`` and skips every pair that already ended with
``status == "ok"``, failed in the environment's own code (``failure == "env_error"``: it would
fail the same way again) or was failed by an agent plug-in (``failure == "agent_error"``: its
outcome); episodes failed by the infrastructure (engine, container, ...) are run again. ``wall_s`` and ``rollout_s`` in ``summary.json`` are summed over the invocations that ran
episodes (``timed_runs``); one with nothing left to run keeps them.

Before anything starts, :func:`~.outputs.check_output` checks that every output file can be
written, and a plug-in environment gets the short conformance check (one task, sampled actions,
:func:`~sao.envs.checker.check_episode`): a broken one is refused before an engine starts.

The model plays in one of two modes (``endpoint_mode``, see :mod:`sao.agents.clients.endpoint`): the token
loop (:func:`~sao.agents.run_episode`), or, for an endpoint that returns no token ids, the text loop
on the chat API (:func:`~sao.agents.run_text_episode`). Grading, pass@k, resume and the SWE outputs
are the same in both; ``summary.json`` says which mode the episodes ran in. Who plays an episode (the
model, a scripted agent, an agent plug-in, a given prediction) is :class:`~.players.Player`'s part; :func:`run_pairs` runs
the episodes side by side and records each; with a :class:`~.live.Board`, each episode in flight is on it
(sao-eval's status lines).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sao.agents import Trajectory
from sao.agents.clients import ENDPOINT_MODES, Endpoint
from sao.agents.engine import EngineWatch, SpeculativeConfig, rerun_on_death
from sao.agents.interrupts import quiet_interrupts
from sao.agents.loop import INFRASTRUCTURE, opened, task_seed, unplayed
from sao.agents.loop.exits import LIMITS, exit_status
from sao.agents.external.errors import AgentPluginError
from sao.agents.external.registry import find as find_plugin
from sao.agents.external.task import BUILTIN_AGENTS
from sao.agents.store import TrajectoryWriter, read_trajectories
from sao.envs import EnvEntry, EnvError, make, resolve
from sao.envs.capabilities import prediction_grader, scripted_policies
from sao.envs.checker import check_episode
from sao.envs.registry import BUILTINS

from .engines import ENGINE_KEYS, measured, open_engines
from .capture_counts import capture_summary
from .errors import EvalError
from .live import Board, watched
from .metrics import mean_pass_at_k
from .outputs import RESULTS, RUN, SUMMARY, TRAJECTORIES, check_output
from .players import Player, load_predictions
from .selection import Selection, Slice
from .swe_images import RunImages, run_images
from .swe_outputs import SweFiles, model_name_or_path, patch_benchmark

log = logging.getLogger(__name__)

# Fields that must match between a run and its --resume; the rest (concurrency, ...) may change. The
# endpoint mode may change too: each trajectory records its own, and summary.json reports them.
# The selection's fields (Selection.identity) and the seeding scheme are part of it too.
_IDENTITY = ("benchmark", "agent", "model", "data", "split", "samples", "limit", "temperature", "max_tokens",
             "max_tokens_per_turn", "max_turns", "seed", "env_args", "grade_only", "agent_steps")
SEEDS = "task_seed"  # episodes seeded by task id (sao.agents.loop.task_seed); before it, by position
# what a run.json written before a field existed means by its absence
_IDENTITY_BEFORE = {"split": None, "instance_ids": None, "filter": None, "shuffle": False, "slice": None,
                    "seeds": "episode_seed", "max_tokens_per_turn": None, "agent_steps": None}
AGENTS = BUILTIN_AGENTS  # the model, or a scripted baseline that the environment provides; else an agent plug-in
SCRIPTED = ("gold", "empty")
AGENT_TIMEOUT_S = {"coding": 3600.0, "default": 600.0}  # an agent plug-in's wall time per episode, by domain


EVAL_ROUTERS = ("cache_aware", "round_robin")  # sao.agents.routing.routers (pinned needs a scheduler's home replica)
ENDLESS_DEFAULT_LIMIT = 100  # tasks evaluated from an endless source (arithmetic) when --limit is not given


@dataclass(frozen=True)
class EvalConfig:
    benchmark: str
    output: Path
    agent: str = "llm"
    model: str = "smollm2-135m"
    base_url: str | None = None
    api_key: str | None = None
    tokenizer: str | None = None
    data: str | None = None
    samples: int = 1
    limit: int | None = None
    instance_ids: tuple[str, ...] | None = None  # the selection (sao.evals.selection): --instance-ids, ...
    filter: str | None = None  # --filter: a regular expression searched in the task ids
    shuffle: bool = False  # --shuffle, seeded by `seed`
    slice: Slice | None = None  # --slice START:END
    split: str | None = None  # --split: the environment's `split` argument
    concurrency: int = 32
    # The episode budgets: None is the benchmark's (sao.envs.budgets, resolved when the config is made);
    # a resolved max_tokens or max_tokens_per_turn of None is no limit beyond the context
    temperature: float | None = None
    max_tokens: int | None = None
    max_turns: int | None = None
    max_tokens_per_turn: int | None = None
    max_model_len: int | None = None  # a managed engine's context; None: the model's own (config.json)
    seed: int = 0
    timeout_s: float = 600.0
    resume: bool = False
    env_args: dict[str, Any] = field(default_factory=dict)
    grade_only: str | None = None  # predictions.jsonl (instance_id, model_patch) to grade instead of running agents
    endpoint_mode: str = "auto"  # auto | tokens | chat (see sao.agents.clients.endpoint)
    speculative: SpeculativeConfig = SpeculativeConfig()  # how the local vLLM speculates (--speculative)
    max_restarts: int = 3  # restarts of a local vLLM that dies mid-run (sao.agents.engine.watch), per replica
    replicas: int = 1  # local vLLM replicas; more than one: requests placed by `router` (sao.agents.routing.client)
    router: str = "cache_aware"  # cache_aware | round_robin
    # SWE images (sao.evals.swe_images); not part of the run's identity: a --resume may change them
    prepare: bool = False  # --prepare: every selected instance's image found (pulled, built) before anything starts
    clean_images: bool = False  # --clean-images: after grading, remove the images this run pulled or built
    # an agent plug-in (--agent NAME of the sao.agents entry-point group; sao.agents.external)
    agent_timeout_s: float | None = None  # --agent-timeout: its wall time per episode; None: AGENT_TIMEOUT_S
    agent_steps: int | None = None  # --agent-steps: the most model calls it is asked to make; None: its own

    def __post_init__(self) -> None:
        self._resolve_budgets()
        if self.speculative.enabled and self.base_url is not None:
            raise EvalError("--speculative starts a local vLLM with it; a server at --base-url was started with "
                            "its own --speculative-config")
        if self.speculative.enabled and (self.agent != "llm" or self.grade_only is not None):
            raise EvalError("--speculative needs the model to play (--agent llm, no --grade-only)")
        if self.endpoint_mode not in ENDPOINT_MODES:
            raise EvalError(f"--endpoint-mode must be one of {ENDPOINT_MODES}, got {self.endpoint_mode!r}")
        if self.endpoint_mode == "chat" and self.base_url is None and self.model_plays:
            raise EvalError("--endpoint-mode chat needs --base-url: a local vLLM is run in tokens mode")
        for name in ("samples", "concurrency", "max_tokens", "max_turns", "max_tokens_per_turn", "max_model_len"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise EvalError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        self._check_agent()
        if self.grade_only is not None and self.samples != 1:
            raise EvalError("--grade-only grades one prediction per instance: --samples must be 1")
        self.selection()  # a bad --limit, --filter, ... fails here
        if self.split is not None and "split" in self.env_args:
            raise EvalError(f"--split {self.split} and --env-arg split={self.env_args['split']} both set the split: "
                            "keep one")
        if self.max_restarts < 0:
            raise EvalError(f"--max-restarts must be >= 0, got {self.max_restarts}")
        if self.replicas < 1:
            raise EvalError(f"--replicas must be >= 1, got {self.replicas}")
        if self.router not in EVAL_ROUTERS:
            raise EvalError(f"--router must be one of {EVAL_ROUTERS}, got {self.router!r}")
        if (self.prepare or self.clean_images) and not patch_benchmark(self.benchmark):
            raise EvalError(f"{'--prepare' if self.prepare else '--clean-images'}: for the SWE benchmarks only (each "
                            f"task has a Docker image); {self.benchmark} is not one")
        if self.replicas > 1 and (self.base_url is not None or self.agent != "llm" or self.grade_only is not None):
            raise EvalError("--replicas starts that many local vLLM engines for the model to play: it takes no "
                            "--base-url, --agent other than llm, or --grade-only")

    @property
    def plugin(self) -> bool:
        """Whether an agent plug-in plays (``--agent NAME``, not a built-in)."""
        return self.agent not in AGENTS

    @property
    def model_plays(self) -> bool:
        """Whether a model is sampled: the project's loop (``llm``) or an agent plug-in, not ``--grade-only``."""
        return (self.agent == "llm" or self.plugin) and self.grade_only is None

    def agent_timeout(self) -> float:
        """An agent plug-in's wall time per episode: ``--agent-timeout``, else the benchmark's domain's."""
        if self.agent_timeout_s is not None:
            return self.agent_timeout_s
        return AGENT_TIMEOUT_S["coding" if patch_benchmark(self.benchmark) else "default"]

    def _check_agent(self) -> None:
        """A plug-in's name must be registered (:mod:`sao.agents.external.registry`); its flags need one."""
        if self.plugin:
            try:
                find_plugin(self.agent)
            except AgentPluginError as exc:
                raise EvalError(f"--agent: {exc}") from None
            if self.grade_only is not None:
                raise EvalError("--grade-only grades given predictions: it takes no --agent plug-in")
        elif self.agent_timeout_s is not None or self.agent_steps is not None:
            raise EvalError("--agent-timeout and --agent-steps are for an agent plug-in (--agent NAME); "
                            f"{self.agent} is a built-in agent")
        if self.agent_timeout_s is not None and not self.agent_timeout_s > 0:
            raise EvalError(f"--agent-timeout must be > 0, got {self.agent_timeout_s}")
        if self.agent_steps is not None and self.agent_steps < 1:
            raise EvalError(f"--agent-steps must be >= 1, got {self.agent_steps}")

    def _resolve_budgets(self) -> None:
        """Fill the budget fields left None with the benchmark's (an unknown benchmark fails here)."""
        declared = resolve(self.benchmark).episode_budgets()
        for name in ("temperature", "max_tokens", "max_turns", "max_tokens_per_turn"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, getattr(declared, name))

    def budgets(self) -> dict[str, Any]:
        """The budgets this run's episodes get (``summary.json`` and ``run.json``): the resolved fields,
        and the environment's step limit (``--max-steps``, else the benchmark's; None: it has none)."""
        steps = self.env_args.get("max_steps", resolve(self.benchmark).episode_budgets().max_steps)
        return {"max_steps": steps, "max_turns": self.max_turns, "max_tokens": self.max_tokens,
                "max_tokens_per_turn": self.max_tokens_per_turn, "temperature": self.temperature}

    def selection(self) -> Selection:
        return Selection(instance_ids=self.instance_ids, filter=self.filter, shuffle=self.shuffle, seed=self.seed,
                         slice=self.slice, limit=self.limit)

    def identity(self) -> dict[str, Any]:
        """What ``run.json`` records, as JSON reads it back (tuples as lists)."""
        d = asdict(self)
        identity = {k: d[k] for k in _IDENTITY} | self.selection().identity() | {"seeds": SEEDS}
        return json.loads(json.dumps(identity))


def plan(cfg: EvalConfig) -> tuple[list[str], dict[str, Any]]:
    """Resolve the benchmark and select its task ids (:mod:`.selection`); fails fast on a bad name, a
    broken dataset or a selection that names an unknown id or leaves nothing."""
    entry = resolve(cfg.benchmark)
    kwargs = env_kwargs(cfg, entry)
    try:
        env = make(entry.name, **kwargs)
    except (EnvError, *INFRASTRUCTURE):
        raise  # a broken dataset or image map (its message says what to change), or the machine's fault
    except Exception as exc:  # noqa: BLE001 - an argument it does not take (--env-arg), a plug-in's own bug, ...
        shown = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
        raise EvalError(f"{entry.name}({shown}) could not be made: {type(exc).__name__}: {exc}") from exc
    try:
        if cfg.agent in SCRIPTED and scripted_policies(env) is None:
            raise EvalError(f"{entry.name} has no scripted agents; use --agent llm")
        if cfg.plugin and prediction_grader(env) is None:
            raise EvalError(f"{entry.name} cannot grade what an agent plug-in returns (it offers no prediction "
                            "grader); use --agent llm")
        candidates, source = candidate_ids(cfg, env, entry.name)
        ids = cfg.selection().apply(candidates, source=source)
        if ids and cfg.grade_only is None and entry.name not in {e.name for e in BUILTINS}:
            preflight(env, ids[0])
    finally:
        env.close()
    if not ids:
        raise EvalError(f"{cfg.benchmark}: no tasks")
    return ids, kwargs


def env_kwargs(cfg: EvalConfig, entry: EnvEntry) -> dict[str, Any]:
    """The environment's keyword arguments: ``--env-arg``s and the flags for it, ``--data`` and ``--split``
    (refused for an environment whose constructor takes no ``split``)."""
    kwargs = dict(cfg.env_args)
    if cfg.data is not None:
        kwargs["data"] = cfg.data
    if cfg.split is not None:
        if not takes_split(entry):
            raise EvalError(f"--split {cfg.split}: {entry.name} takes no split (its constructor has no 'split' "
                            "argument); leave --split out")
        kwargs["split"] = cfg.split
    return kwargs


def takes_split(entry: EnvEntry) -> bool:
    """Whether the environment's constructor names a ``split`` argument (one it cannot be read from: yes,
    and the environment decides)."""
    from gymnasium.envs.registration import load_env_creator

    try:
        creator = load_env_creator(entry.entry_point) if isinstance(entry.entry_point, str) else entry.entry_point
        return "split" in inspect.signature(creator).parameters
    except (ImportError, AttributeError, TypeError, ValueError):
        return True


def candidate_ids(cfg: EvalConfig, env: Any, name: str) -> tuple[list[str], str]:
    """The ids the selection picks from, in the benchmark's order, and how errors name them: every task;
    the first ones of an endless source (ENDLESS_DEFAULT_LIMIT, or what --limit or --slice asks);
    with ``--grade-only``, the tasks that the predictions file has a patch for."""
    if cfg.grade_only is not None:
        if not patch_benchmark(cfg.benchmark) or prediction_grader(env) is None:  # math grades an answer, not a file
            raise EvalError(f"{name} cannot grade predictions (--grade-only is for SWE benchmarks)")
        wanted = load_predictions(cfg.grade_only)
        every = env.unwrapped.task_ids()
        unknown = sorted(set(wanted) - set(every))
        if unknown:
            raise EvalError(f"{cfg.grade_only}: {len(unknown)} instance(s) not in {name}: {unknown[:5]}")
        return [t for t in every if t in wanted], f"the predictions of {cfg.grade_only}"
    if getattr(env.unwrapped, "endless", False):
        n = cfg.selection().stream_length(ENDLESS_DEFAULT_LIMIT)
        return env.unwrapped.task_ids(n), (f"the first {n} tasks of {name} (endless: a larger --limit or --slice "
                                           "END selects from more)")
    return env.unwrapped.task_ids(), name


def preflight(env: Any, task_id: str) -> None:
    """The short conformance check of a plug-in environment (one task, sampled actions), before any
    engine starts; a broken one is an :class:`EvalError` with the checker's message. (The built-in
    environments pass the full :func:`~sao.envs.check_env` in the test suite.)"""
    try:
        check_episode(env, task_id=task_id)
    except Exception as exc:  # noqa: BLE001 - EnvConformanceError, or the check itself tripped on the env
        raise EvalError(f"{exc}\n(sao-eval checks a plug-in environment before it starts an engine: "
                        "fix the environment, then run again)") from exc


def prepare_output(cfg: EvalConfig) -> set[tuple[str, int]]:
    """Check the output folder against ``--resume``; return the pairs already done."""
    try:
        cfg.output.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EvalError(f"--output {cfg.output}: cannot be created ({exc.strerror or exc})") from exc
    run_file, traj_file = cfg.output / RUN, cfg.output / TRAJECTORIES
    if not cfg.resume:
        if traj_file.exists() and traj_file.stat().st_size > 0:
            raise EvalError(f"{cfg.output} already holds trajectories; pass --resume to continue that run, "
                            "or choose another --output")
        write_run_file(cfg, run_file)
        return set()
    if run_file.exists():
        before = _IDENTITY_BEFORE | json.loads(run_file.read_text())
        changed = {k: (before.get(k), v) for k, v in cfg.identity().items() if before.get(k) != v}
        if changed:
            diff = ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in changed.items())
            why = (" - an older sao-eval seeded that run's episodes by their position in the list; evaluate into a "
                   "new --output") if "seeds" in changed else ""
            raise EvalError(f"--resume with a different configuration than {run_file} ({diff}){why}")
    else:
        write_run_file(cfg, run_file)
    return {(t.task_id, t.sample) for t in read_trajectories(traj_file) if settled(t)}


def write_run_file(cfg: EvalConfig, run_file: Path) -> None:
    """``run.json``: the run's identity (checked on ``--resume``) and the budgets its episodes get."""
    run_file.write_text(json.dumps(cfg.identity() | {"budgets": cfg.budgets()}, indent=2) + "\n")


def settled(t: Trajectory) -> bool:
    """Whether ``--resume`` leaves the episode as it is: it ended, failed in the environment's own
    code (it would fail the same way again), or an agent plug-in failed it (its outcome, as a wrong
    answer is); an infrastructure failure is run again."""
    return t.status == "ok" or t.env_error or t.agent_error


Latest = dict[tuple[str, int], Trajectory]  # (task id, sample) -> the episode that counts (latest_episodes)


def latest_episodes(path: Path) -> Latest:
    """The episode that counts per (task, sample) pair in ``path``: the first settled one, else the last."""
    latest: dict[tuple[str, int], Trajectory] = {}
    for t in read_trajectories(path):
        if latest.get((t.task_id, t.sample)) is None or not settled(latest[(t.task_id, t.sample)]):
            latest[(t.task_id, t.sample)] = t
    return latest


async def run_pairs(
    cfg: EvalConfig,
    endpoint: Endpoint | Sequence[Endpoint] | None,
    env_kwargs: dict[str, Any],
    pairs: list[tuple[str, int]],
    writer: TrajectoryWriter,
    on_done: Callable[[Trajectory], None] = lambda t: None,
    board: Board | None = None,
) -> dict[str, Any]:
    """Run the (task id, sample) pairs with bounded concurrency, writing each as it ends; an episode's
    sampling seed is :func:`~sao.agents.loop.task_seed` of its task id and sample, whatever was selected.

    With an ``endpoint`` the model plays; without one, the environment's scripted agent ``cfg.agent``.
    Several endpoints (``--replicas``): each episode's requests are placed by ``cfg.router``
    (:mod:`sao.agents.routing.client`), and what the routing did is returned (empty otherwise).
    With a ``board``, each episode in flight is on it, its environment steps counted (:mod:`.live`).
    """
    quiet_interrupts()  # SIGTERM and Ctrl-C are reported by sao-eval itself (sao.agents.interrupts)
    endpoints = [] if endpoint is None else [endpoint] if isinstance(endpoint, Endpoint) else list(endpoint)
    env_name = resolve(cfg.benchmark).name
    semaphore = asyncio.Semaphore(cfg.concurrency)
    player = Player(cfg, env_name, endpoints, env_kwargs)

    async def attempt(task_id: str, sample: int) -> Trajectory:
        started = time.monotonic()
        seed = task_seed(cfg.seed, task_id, sample)
        try:
            with watched(board, task_id, sample) as wrap:
                async with opened(env_name, env_kwargs) as env:
                    return await player.play(wrap(env), task_id, sample, seed)
        except INFRASTRUCTURE as exc:  # the environment could not be made (no Docker daemon, say): recorded
            return unplayed(env_name, task_id, sample, seed, exc, time.monotonic() - started)

    async def one(task_id: str, sample: int, watch: EngineWatch | None) -> None:
        async with semaphore:
            # a local engine that dies is restarted; the attempts it cut are dropped and run again
            # (several replicas: the requests it cut go to the others, sao.agents.routing.client)
            trajectory = await rerun_on_death(watch, lambda: attempt(task_id, sample))
            writer.write(trajectory)
            on_done(trajectory)

    async with player.serving() as watch:
        await asyncio.gather(*(one(t, s, watch) for t, s in pairs))
    return player.routing_summary()


def summarize(cfg: EvalConfig, task_ids: list[str], wall_s: float, latest: Latest | None = None
              ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Build results and summary from every trajectory on disk (the latest per pair wins; ``latest``: them,
    already read by :func:`latest_episodes`)."""
    latest = latest_episodes(cfg.output / TRAJECTORIES) if latest is None else latest
    results, outcomes, fallback = [], [], 0
    for task_id in task_ids:
        runs = [latest.get((task_id, s)) for s in range(cfg.samples)]
        correct = [bool(r is not None and r.status == "ok" and r.correct) for r in runs]
        results.append({"task_id": task_id, "correct": correct})
        outcomes.append(correct)
        fallback += any(r is not None and r.info.get("graded_by") == "fallback" for r in runs)
    planned = set(task_ids)
    done = [t for t in latest.values() if t.task_id in planned]
    tokens = sum(t.generated_tokens for t in done)
    played = cfg.model_plays
    modes = sorted({t.mode for t in done}) if played else []
    pass_k = mean_pass_at_k(outcomes)
    summary = {
        "benchmark": cfg.benchmark,
        # the model only when one acted: scripted agents (gold, empty) and --grade-only have none
        "model": cfg.model if cfg.model_plays else None,
        "agent": cfg.agent,
        "n_tasks": len(task_ids),
        "n_instances": len(task_ids),
        "samples_per_task": cfg.samples,
        "resolved": sum(any(o) for o in outcomes),  # tasks solved by at least one sample
        "pass@1": pass_k.get("1", 0.0),
        "pass@k": pass_k,
        "graded_by_fallback": fallback,
        "tokens_generated": tokens,  # text mode: the API's usage.completion_tokens
        # tokens: the token loop (trainable); text: a chat endpoint without token ids; mixed: a resume changed it
        "mode": (modes[0] if len(modes) == 1 else "mixed") if modes else None,
        "turns_without_usage": sum(t.completion_tokens is None for d in done if d.mode == "text" for t in d.turns),
        "wall_s": round(wall_s, 3),
        "n_episodes": len(done),
        "n_missing": len(task_ids) * cfg.samples - len(done),
        "n_failed": sum(t.status == "failed" for t in done),  # infra_errors + env_errors, grading errors aside
        # the episode could not be run or graded for a reason that is not the agent's (engine, container, ...);
        # --resume runs the failed ones again
        "infra_errors": sum((t.status == "failed" and not t.env_error and not t.agent_error)
                            or (t.status == "ok" and bool(t.info.get("error"))) for t in done),
        # the environment's own code raised or broke its return contract: a bug of the environment, not
        # retried by --resume (it would fail the same way)
        "env_errors": sum(t.env_error for t in done),
        # an agent plug-in raised, hung past its timeout (or, in training, never called the model): its own
        # failure, not solved, and not retried by --resume (a retry would re-roll the agent until it succeeds)
        "agent_errors": sum(t.agent_error for t in done),
        # graded, but the grading could not judge (the image cannot run its tests): neither solved nor
        # unresolved, and not retried by --resume (it would fail the same way)
        "eval_errors": sum(t.status == "ok" and bool(t.info.get("eval_error")) for t in done),
        "n_truncated": sum(t.truncated for t in done),
        "mean_reward": sum(t.reward for t in done) / len(done) if done else 0.0,
        "temperature": cfg.temperature,
        "max_tokens": cfg.max_tokens,
        "budgets": cfg.budgets(),  # what the episodes got: the benchmark's (sao.envs.budgets) or the flags'
        "seed": cfg.seed,
        "data": cfg.data,
    }
    return summary | exits_summary(cfg, done) | capture_summary(cfg.plugin, done), results  # capture: plug-ins only


# The flag that raises each limit an episode can be cut by (sao.agents.loop.exits.LIMITS)
LIMIT_FLAGS = {"max_turns": "--max-turns", "max_tokens": "--max-tokens", "max_tokens_per_turn": "--max-tokens",
               "context": "--max-model-len (a local engine's context window; a hosted model's is its own)",
               "max_steps": "--max-steps"}
CUT_WARNING_SHARE = 0.05  # more episodes than this cut by a limit: cut_warning says so


def episode_exit_status(t: Trajectory) -> str:
    """Why ``t`` ended (:mod:`sao.agents.loop.exits`): as recorded, or for a record older than the field,
    as its other fields say."""
    recorded = t.info.get("exit_status") if t.status == "ok" else None
    return recorded if isinstance(recorded, str) and recorded else exit_status(
        status=t.status, failure=t.failure, truncated_by=t.info.get("truncated_by"), info=t.info,
        terminated=t.terminated, truncated=t.truncated)


def exits_summary(cfg: EvalConfig, done: list[Trajectory]) -> dict[str, Any]:
    """``exit_status``: episodes per exit status; ``autosubmit``: whether an episode that ended without
    submitting (a limit cut it) had its diff graded (the SWE environments' ``autosubmit``, ``--no-autosubmit``)."""
    counts = Counter(episode_exit_status(t) for t in done)
    return {"exit_status": dict(sorted(counts.items())), "autosubmit": bool(cfg.env_args.get("autosubmit", True))}


def cut_warning(summary: dict[str, Any]) -> str | None:
    """The warning when more than :data:`CUT_WARNING_SHARE` of the episodes were cut by a limit (turns,
    tokens, context, the environment's steps), naming the flag to raise for each; None otherwise."""
    n, counts = summary.get("n_episodes", 0), summary.get("exit_status") or {}
    cut = {k: v for k, v in counts.items() if k in LIMITS}
    if not n or sum(cut.values()) <= CUT_WARNING_SHARE * n:
        return None
    which = "; ".join(f"{v} by {k} (raise {LIMIT_FLAGS.get(k, k)})" for k, v in cut.items())
    scored = ""
    if patch_benchmark(summary["benchmark"]):
        scored = (" Their diffs were graded as they stood (autosubmit)." if summary.get("autosubmit", True) else
                  " They were scored as empty patches (--no-autosubmit).")
    return (f"{sum(cut.values())} of {n} episodes ({sum(cut.values()) / n:.0%}) were cut by a limit before the "
            f"agent ended them: {which}.{scored} The scores measure the limits as much as the model.")


def write_outputs(cfg: EvalConfig, summary: dict[str, Any], results: list[dict[str, Any]],
                  latest: Latest | None = None) -> None:
    try:
        with (cfg.output / RESULTS).open("w", encoding="utf-8") as fh:
            for row in results:
                fh.write(json.dumps(row) + "\n")
        (cfg.output / SUMMARY).write_text(json.dumps(summary, indent=2) + "\n")
        write_swebench_outputs(cfg, [row["task_id"] for row in results], latest)
    except OSError as exc:
        raise EvalError(f"the outputs cannot be written in {cfg.output} ({exc}); every episode is in "
                        f"{TRAJECTORIES}: fix that, then run again with --resume to write them") from exc


def write_swebench_outputs(cfg: EvalConfig, task_ids: list[str], latest: Latest | None = None) -> None:
    """For environments that grade patches, the files the SWE-bench tools read (:mod:`.swe_outputs`:
    ``preds.json``, ``predictions.jsonl``, ``report.json``, ``reports/``, ``trajs/``), rebuilt from
    every trajectory on disk (``latest``: them, already read)."""
    latest = latest_episodes(cfg.output / TRAJECTORIES) if latest is None else latest
    if not (patch_benchmark(cfg.benchmark) or any("patch" in t.info for t in latest.values())):
        return
    swe_files(cfg).write_all(task_ids, latest)


def swe_files(cfg: EvalConfig) -> SweFiles:
    return SweFiles(cfg.output, cfg.samples, model_name_or_path(cfg.agent, cfg.model, cfg.grade_only))


def evaluate(cfg: EvalConfig, *, progress: Callable[[int, int], Callable[[Trajectory], None]] | None = None,
             board: Board | None = None) -> dict[str, Any]:
    """Run (or resume) an evaluation and write its outputs. ``progress(total, done)`` returns a per-episode
    hook; ``board`` shows the episodes in flight (:mod:`.live`, sao-eval's status lines)."""
    t0 = time.monotonic()
    check_output(cfg.output)
    task_ids, env_kwargs = plan(cfg)
    done = prepare_output(cfg)
    before = previous_summary(cfg)
    pairs = [(t, s) for t in task_ids for s in range(cfg.samples) if (t, s) not in done]
    rollout_s, engine, context = 0.0, None, {}
    with images_of(cfg, env_kwargs) as images:  # SWE: the disk at the start; --prepare's images before any engine
        if cfg.prepare:
            images.prepare(task_ids)
        if pairs:
            with open_engines(cfg) as endpoints, TrajectoryWriter(cfg.output / TRAJECTORIES) as writer:
                # the model's context window: --max-model-len, else what the engine took (the model's own)
                context = {"max_model_len": endpoints[0].max_model_len} if endpoints else {}
                hook = progress(len(task_ids) * cfg.samples, len(task_ids) * cfg.samples - len(pairs)) if progress else None
                # SWE: each episode's trajs/ file as it ends (swe_outputs); the rest at the end
                hooks = [h for h in (hook, swe_files(cfg).write_traj if patch_benchmark(cfg.benchmark) else None) if h]
                t_rollout = time.monotonic()
                engine = asyncio.run(measured(cfg, endpoints, lambda: run_pairs(
                    cfg, endpoints or None, env_kwargs, pairs, writer, lambda t: [h(t) for h in hooks], board)))
                rollout_s = time.monotonic() - t_rollout
        latest = latest_episodes(cfg.output / TRAJECTORIES)  # every episode on disk, read once for all below
        # after grading: the images the episodes pulled recorded, --clean-images, the disk at the end
        images_summary = {} if images is None else images.finish(latest.values(), clean=cfg.clean_images)
    summary, results = summarize(cfg, task_ids, time.monotonic() - t0, latest)
    summary |= run_times(before, wall_s=summary["wall_s"], rollout_s=rollout_s, ran=bool(pairs)) | context
    summary |= images_summary
    if engine is not None:
        summary |= engine
    elif not pairs:  # nothing ran: the engine figures of the run that did the work stay
        summary |= {k: v for k, v in before.items() if k in ENGINE_KEYS}
    write_outputs(cfg, summary, results, latest)
    if (warning := cut_warning(summary)) is not None:
        log.warning("%s", warning)
    return summary


def images_of(cfg: EvalConfig, env_kwargs: dict[str, Any], *,
              required: bool = False) -> AbstractContextManager[RunImages | None]:
    """The run's instance images (:mod:`.swe_images`) for a SWE benchmark; None for the others."""
    if not patch_benchmark(cfg.benchmark):
        return nullcontext(None)
    return run_images(cfg.benchmark, cfg.output, env_kwargs, required=required or cfg.prepare or cfg.clean_images)


def prepare_images(cfg: EvalConfig) -> Any:
    """``--prepare-only``: check the output folder, select the tasks and find (pull, build) every one's image,
    as :func:`evaluate` does before it starts anything; :class:`~.swe_images.ImagesMissing` when any is
    missing, else the preparation (:class:`~sao.envs.swebench.image_prep.ImagePreparation`)."""
    check_output(cfg.output)
    task_ids, env_kwargs = plan(cfg)
    prepare_output(cfg)
    with images_of(cfg, env_kwargs, required=True) as images:
        if images is None:
            raise EvalError(f"--prepare-only: for the SWE benchmarks only; {cfg.benchmark} is not one")
        return images.prepare(task_ids)


def previous_summary(cfg: EvalConfig) -> dict[str, Any]:
    """The ``summary.json`` that an earlier invocation left, on ``--resume`` (empty without one)."""
    path = cfg.output / SUMMARY
    if not cfg.resume or not path.is_file():
        return {}
    try:
        before = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        log.warning("%s cannot be read (%s); its run times are not carried over", path, exc)
        return {}
    return before if isinstance(before, dict) else {}


def run_times(before: dict[str, Any], *, wall_s: float, rollout_s: float, ran: bool) -> dict[str, Any]:
    """``wall_s`` and ``rollout_s`` summed over the invocations that ran episodes (``timed_runs`` of them;
    rollout: the episodes only, engine start-up excluded). An invocation with nothing left to run
    keeps the earlier figures; an earlier run killed before its summary was written is not counted."""
    if not isinstance(before.get("wall_s"), (int, float)):
        return {"wall_s": round(wall_s, 3), "rollout_s": round(rollout_s, 3), "timed_runs": 1}
    runs = before.get("timed_runs", 1)  # a summary written before the field: one run
    if not ran:
        return {"wall_s": before["wall_s"], "rollout_s": before.get("rollout_s", 0.0), "timed_runs": runs}
    return {"wall_s": round(before["wall_s"] + wall_s, 3), "rollout_s": round(before.get("rollout_s", 0.0) + rollout_s, 3),
            "timed_runs": runs + 1}
