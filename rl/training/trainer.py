"""The training loop: rollout -> batch -> update -> weight sync -> log -> checkpoint, one policy step at a time.

    resume from RUN_DIR/checkpoints/latest (resume=true), else start at step 0
    sync the learner's policy into the engine as version `step`      # the engine serves what we train
    critic-only pretraining: value_pretrain_steps batches (critic algorithms only), while the
        held-out baseline is evaluated at version 0
    for step in step+1 .. max_steps:
        batch   = source.next_batch(batch_size, version)              # finished, rewarded trajectories
        metrics = algo.update(learner, collate(batch))                # the critic's steps, one policy step
        sync(policy, version = step)                                  # save + reload into vLLM (+ probe: engine.probe_every)
        log(step, metrics); checkpoint every `checkpoint_every` steps and at the end
        eval.patience: after each held-out evaluation, stop when it has not risen for that many (early_stop)
    at the end: the held-out change, and the critic's mean explained variance (critic_summary)

Files in RUN_DIR: ``metrics.jsonl`` (one line per policy step), ``value_pretrain.jsonl`` (one per
critic-only step), ``trajectories.jsonl`` (every episode as it ends, failed ones included, with
``rollout.train_step`` = the step being sampled for when it ended, 0 for pretraining), ``batches.jsonl``
(one line per policy step: which episodes -- prompt index, sample, attempt, version -- it trained
on; the audit trail that no prompt is trained twice), ``checkpoints/``, ``weights/``
(the engine's versioned safetensors), and the trackers' files (``tensorboard/``, ``wandb/``, ``mlflow.db``:
:mod:`sao.rl.training.trackers`, which also receive every step's scalars and, at each held-out evaluation,
its episodes). :func:`sao.rl.training.build.run_training` builds
the real parts (vLLM, the HF model); tests build fakes and drive :class:`Trainer` directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from pathlib import Path
from collections.abc import Sequence
from typing import Any, Protocol

from torch import nn

from sao.rl.algos import Algorithm
from sao.rl.algos.base import PartwiseAlgorithm
from sao.rl.config import TrainConfig
from sao.rl.errors import TrainError
from sao.rl.learner import Learner, collate, release, rss_gb
from sao.rl.training.checkpoint import Checkpointer, TrainState
from sao.rl.training.critic_summary import critic_summary_of
from sao.rl.training.early_stop import EarlyStop
from sao.rl.training.engine_step import StepEngineMetrics
from sao.rl.training.heldout import HeldOutEval, improvement
from sao.rl.training.metrics_log import JsonlSink, MetricsSink, MultiSink
from sao.rl.training.run_folder import RunFiles, RunRecords, start_or_resume
from sao.rl.training.trackers import Tracker, TrackerSink
from sao.rl.rollout import (
    ProbingSource,
    RolloutBatch,
    RolloutSource,
    ScheduledSource,
    StreamingSource,
    rollout_meta,
)
from sao.rl.learner import TorchThread, failure

log = logging.getLogger(__name__)


class Syncer(Protocol):
    async def sync(self, model: nn.Module, version: int, *, probe: bool = True,
                   recent: Sequence[Any] = ()) -> dict[str, float]: ...


class Trainer:
    """Drives one run (module doc). ``sinks`` receive the per-step metrics besides ``metrics.jsonl``;
    ``trackers`` receive them too, and the held-out episodes of each evaluation (closed at the end)."""

    def __init__(
        self,
        cfg: TrainConfig,
        run_dir: Path,
        *,
        learner: Learner,
        algo: Algorithm,
        source: RolloutSource,
        weight_sync: Syncer,
        pad_id: int,
        sinks: list[MetricsSink] | None = None,
        trackers: Sequence[Tracker] = (),
        tasks: Any = None,
        heldout: HeldOutEval | None = None,
        thread: TorchThread | None = None,
        engine_metrics: StepEngineMetrics | None = None,
        early_stop: EarlyStop | None = None,
    ):
        self.cfg, self.files = cfg, RunFiles(Path(run_dir))
        self.learner, self.algo, self.source, self.weight_sync = learner, algo, source, weight_sync
        self.pad_id = pad_id
        self.tasks = tasks  # a ScheduledTaskStream the source draws from (online learning), or None
        self.extra_sinks = list(sinks or [])
        self.trackers = list(trackers)
        self.heldout = heldout  # held-out accuracy before the first step, every eval.every steps, at the end
        self.thread = thread or TorchThread()  # every torch call of the run happens on this one thread
        self.engine_metrics = engine_metrics  # the replicas' /metrics per step (prefix-cache hits, speculation)
        self.early_stop = early_stop  # eval.patience: the stop rule on held-out accuracy, and the best model
        self.checkpointer = Checkpointer(self.files.checkpoints, keep=cfg.keep_checkpoints)
        self.state = TrainState(0, 0, 0, {}, {})
        self.records = RunRecords()  # trajectories.jsonl and batches.jsonl while run() runs

    # ---- start / resume --------------------------------------------------------------------------

    def prepare(self) -> TrainState:
        """Load the latest checkpoint (``resume=true``) or check that the folder is free; rewind the logs."""
        self.state = start_or_resume(self.files, self.checkpointer, resume=self.cfg.resume, learner=self.learner,
                                     source=self.source, algo=self.algo, state=self.state)
        return self.state

    # ---- the loop --------------------------------------------------------------------------------

    async def run(self) -> dict[str, Any]:
        cfg, files = self.cfg, self.files
        state = await self.thread.run(self.prepare)  # a resume loads the learner's tensors
        if self.early_stop is not None and state.step > 0:
            self.early_stop.replay(files.eval)
        sinks = [*self.extra_sinks, TrackerSink(self.trackers)]
        sink = MultiSink([JsonlSink(files.metrics), *sinks] if cfg.logger.jsonl else sinks)
        pretrain_sink = JsonlSink(files.pretrain) if self.algo.uses_critic and cfg.value_pretrain_steps else None
        self.records.open(files, save_trajectories=cfg.logger.save_trajectories)
        self.source.on_trajectory = self.records.record
        last: dict[str, Any] = {}
        finished = False
        try:
            # The engine must serve exactly the learner's policy before anything is sampled.
            first = await self.weight_sync.sync(self.learner.policy, state.version, probe=cfg.engine.probe)
            self.source.on_weights(state.version)
            log.info("engine serves version %d (sync %.2f s, probe gap %s)", state.version, first.get("perf/sync_s", 0),
                     first.get("sync/probe_gap"))
            if self.engine_metrics is not None:
                await self.engine_metrics.start()  # the first step's window starts here
            if self.heldout is not None and state.step == 0:
                # the baseline, before any policy step, at version 0, concurrent with the critic's
                # pretraining, which samples from the same version 0 and trains on the learner's
                # thread (the engine and the learner work at once instead of in turn)
                baseline = asyncio.create_task(evaluate(self.heldout, 0, self.trackers))
                try:
                    await self._pretrain_critic(pretrain_sink)
                    first_eval = await baseline
                    await should_stop(self.early_stop, self.thread, self.learner, 0, first_eval)
                    sink.log(0, first_eval)
                finally:  # the pretraining failed or was interrupted: stop the evaluation, and
                    baseline.cancel()  # collect its outcome either way (a no-op once it has finished)
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await baseline
            else:
                await self._pretrain_critic(pretrain_sink)
            for step in range(state.step + 1, cfg.max_steps + 1):
                last = await self._step(step)
                stop = await should_stop(self.early_stop, self.thread, self.learner, step, last)
                if step == cfg.max_steps or stop:
                    last |= log_improvement(self.heldout, files.eval)
                sink.log(step, last)
                if step % cfg.checkpoint_every == 0 or step == cfg.max_steps or stop:
                    await self.thread.run(self._save, step)
                if stop:
                    log.info("stopped at step %d by the stop rule on held-out accuracy (eval.patience %d, "
                             "eval.stop_above %s)", step, cfg.eval.patience, cfg.eval.stop_above)
                    break
            log_summaries(self.early_stop, files.metrics if self.algo.uses_critic and cfg.logger.jsonl else None)
            finished = True
        finally:
            if isinstance(self.source, ScheduledSource):
                await self.source.aclose()
            sink.close()
            if pretrain_sink is not None:
                pretrain_sink.close()
            self.records.close()
            self.thread.close(wait=finished)  # interrupted: do not wait for an update in hand (TorchThread.close)
        return last

    def _eval_due(self, step: int) -> bool:
        every = self.cfg.eval.every
        return self.heldout is not None and (step == self.cfg.max_steps or (every > 0 and step % every == 0))

    async def _pretrain_critic(self, sink: JsonlSink | None) -> None:
        cfg = self.cfg
        if not self.algo.uses_critic or self.state.pretrain_steps >= cfg.value_pretrain_steps:
            return
        self.records.train_step = 0
        while self.state.pretrain_steps < cfg.value_pretrain_steps:
            t0 = time.monotonic()
            if self.tasks is not None:
                self.tasks.set_step(0)
            # a scheduled source keeps critic-only batches out of its step count (no policy step follows)
            collect = self.source.warmup_batch if isinstance(self.source, ScheduledSource) else self.source.next_batch
            rollout = await collect(cfg.batch_size, self.state.version)
            batch = self._collate(rollout, self.state.pretrain_steps + 1)
            metrics = await self.thread.run(self.algo.pretrain_critic, self.learner, batch)  # a CriticAlgorithm
            n = self.state.pretrain_steps + 1
            self.state = TrainState(self.state.step, self.state.version, n, self.source.state_dict(),
                                    self.algo.state_dict())
            if sink is not None:
                sink.log(0, {"pretrain_step": n, **rollout.metrics, **metrics, **observe(self.tasks, 0, rollout.trajectories),
                             "perf/step_s": time.monotonic() - t0})
            log.info("critic pretraining %d/%d: value mse %.4f", n, cfg.value_pretrain_steps, metrics.get("value/mse", math.nan))
        await self.thread.run(self._save, self.state.step)

    async def _step(self, step: int) -> dict[str, Any]:
        cfg, learner = self.cfg, self.learner
        t0 = time.monotonic()
        self.records.train_step = step
        if self.tasks is not None:
            self.tasks.set_step(step)  # the schedule's distribution for this step (may advance a phase)
        algo, source = self.algo, self.source
        if (isinstance(algo, PartwiseAlgorithm) and algo.streams and isinstance(source, StreamingSource)
                and source.streams_parts):
            rollout, metrics, update_s = await self._update_in_parts(step, algo, source)
        else:
            rollout = await self.source.next_batch(cfg.batch_size, self.state.version)
            batch = self._collate(rollout, step)
            t_update = time.monotonic()
            metrics = await self.thread.run(self.algo.update, learner, batch)
            update_s = time.monotonic() - t_update
        engine = await self.engine_metrics.step() if self.engine_metrics is not None else {}
        self.records.lineage(step, rollout.trajectories)
        online = observe(self.tasks, step, rollout.trajectories)
        probe = cfg.engine.probe and (step % cfg.engine.probe_every == 0 or step == cfg.max_steps)
        synced = await self.weight_sync.sync(learner.policy, step, probe=probe,
                                             recent=rollout.trajectories[:cfg.engine.action_probes])
        self.source.on_weights(step)
        if isinstance(self.source, ScheduledSource):  # the driver: its ledger and replica versions now
            synced = {**synced, **self.source.stats()}
        if self.tasks is not None and self.tasks.probe_due(step):
            online |= await probe_families(self.tasks, self.source, step)
        if self._eval_due(step):
            online |= await evaluate(self.heldout, step, self.trackers)
        self.state = TrainState(step, step, self.state.pretrain_steps, self.source.state_dict(), self.algo.state_dict())
        release()  # the step's freed activations go back to the system, not into the next step's peak
        rss, peak = rss_gb()
        return {**rollout.metrics, **engine, **metrics, **synced, **online, "rollout/weight_version": step - 1,
                "perf/update_s": update_s, "perf/step_s": time.monotonic() - t0, "perf/rss_gb": peak,
                "perf/rss_now_gb": rss}

    async def _update_in_parts(self, step: int, algo: PartwiseAlgorithm,
                               source: StreamingSource) -> tuple[Any, dict[str, Any], float]:
        """RolloutPipe's CGP: backward each part of the batch (complete groups) as the source
        releases it, while the rest is still being generated; one optimizer step at the end."""
        learner, parts, update_s = self.learner, [], 0.0
        algo.begin(learner)
        async for part in source.next_parts(self.cfg.batch_size, self.state.version):
            parts.append(part)
            if part.trajectories:
                batch = collate(list(part.trajectories), self.pad_id)
                t0 = time.monotonic()
                await self.thread.run(algo.accumulate, learner, batch)
                update_s += time.monotonic() - t0
        rollout = RolloutBatch.join(parts)
        check_rollout(rollout, step, self.files.trajectories)  # before the optimizer step: an all-failed batch stops the run
        t0 = time.monotonic()
        metrics = await self.thread.run(algo.finish, learner)
        return rollout, metrics, update_s + time.monotonic() - t0

    def _collate(self, rollout: Any, step: int) -> Any:
        check_rollout(rollout, step, self.files.trajectories)
        return collate(list(rollout.trajectories), self.pad_id).sorted_by_length()  # less padding per micro-batch

    def _save(self, step: int) -> None:
        path = self.checkpointer.save(self.learner, self.state)
        log.info("checkpoint %s (step %d)", path, step)


async def should_stop(early_stop: EarlyStop | None, thread: TorchThread, learner: Learner, step: int,
                      metrics: dict[str, Any]) -> bool:
    """Whether the stop rule (``eval.patience``) ends the run after ``step``'s evaluation (none: False)."""
    if early_stop is None or "eval/accuracy" not in metrics:
        return False
    return await thread.run(early_stop.observe, step, metrics, learner.policy)


def check_rollout(rollout: Any, step: int, trajectories: Path) -> None:
    """:class:`TrainError` when every trajectory failed; a warning when some did (all are recorded in
    ``trajectories``)."""
    if not rollout.trajectories:
        causes = sorted({failure(t) or "unknown" for t in rollout.failed})
        raise TrainError(f"step {step}: all {len(rollout.failed)} trajectories failed; first causes: {causes[:3]}. "
                         "They are recorded in trajectories.jsonl; fix the cause and rerun with resume=true")
    if rollout.failed:
        log.warning("step %d: %d of %d trajectories failed and are not trained on (recorded in %s)", step,
                    len(rollout.failed), len(rollout.failed) + len(rollout.trajectories), trajectories)


def observe(tasks: Any, step: int, trajectories: Any) -> dict[str, float]:
    """Feed the schedule (``tasks``, a ScheduledTaskStream or None) this step's rewards; per-family
    rewards and the schedule's state as metrics."""
    if tasks is None:
        return {}
    from sao.rl.prompts.curriculum import family_metrics

    return {**family_metrics(tasks.observe(step, trajectories)), **tasks.metrics()}


async def probe_families(tasks: Any, source: Any, step: int) -> dict[str, float]:
    """Every family seen so far, on the new weights, not trained on (forgetting): ``probe/family/<f>``."""
    from sao.rl.prompts.curriculum import family_metrics, family_rewards

    if not isinstance(source, ProbingSource):
        raise TrainError(f"{type(source).__name__} cannot run forgetting probes (it has no evaluate)")
    trajectories = await source.evaluate(tasks.probes())
    lag = {"probe/version_lag": float(step - min(rollout_meta(t).policy_version for t in trajectories))
           } if trajectories else {}  # a scheduled mode's replicas may not serve the newest version yet
    return family_metrics(family_rewards(step, trajectories, probe=True)) | lag


async def evaluate(heldout: HeldOutEval, step: int, trackers: Sequence[Tracker] = ()) -> dict[str, float]:
    """:meth:`~sao.rl.training.heldout.HeldOutEval.run` at ``step``, logged, its episodes to the trackers;
    its metrics."""
    result = await heldout.run(step)
    for tracker in trackers:
        tracker.log_samples(step, result.samples)
    acc = result.accuracy
    log.info("held-out accuracy at step %d: %.3f [%.3f, %.3f] on %d problems (%.1f s)", step, acc.value, acc.low,
             acc.high, len(result.correct), result.wall_s)
    return result.metrics()


def log_improvement(heldout: HeldOutEval | None, path: Path) -> dict[str, float]:
    """The paired change of held-out accuracy from the first evaluation in ``path`` to the last
    (:func:`~sao.rl.training.heldout.improvement`), logged with the last step and printed; nothing without
    a held-out evaluation."""
    found = improvement(path) if heldout is not None else None
    if found is None:
        return {}
    first, last, before, after, delta = found
    log.info("held-out accuracy %.3f -> %.3f, %s (95%% interval; step %d -> %d, %d problems)", before.value,
             after.value, delta, first, last, len(heldout.task_ids))
    return {"eval/delta": delta.value, "eval/delta_low": delta.low, "eval/delta_high": delta.high,
            "eval/first_accuracy": before.value}


def log_summaries(early_stop: EarlyStop | None, critic_metrics: Path | None) -> None:
    """At the end of a run: the stop rule's report, and the critic's explained variance over the run
    (:mod:`sao.rl.training.critic_summary`) from ``critic_metrics`` (the run's metrics.jsonl; None
    without a critic or without that file)."""
    if early_stop is not None:
        log.info("%s", early_stop.report())
    for summary in critic_summary_of(critic_metrics) if critic_metrics is not None else ():
        log.info("critic: %s", summary.describe())
