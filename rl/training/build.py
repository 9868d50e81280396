"""Build the real parts of a training run from a :class:`TrainConfig` and run it.

The policy is a Hugging Face causal LM in full precision on the learner's device; the engine is a
managed local vLLM (``engine.base_url`` unset; started with the run, stopped at its end, its log in
``RUN_DIR/vllm.log``) or an existing dev-mode vLLM on this filesystem; with ``cluster=ray``, engine
replicas and learner ranks are Ray actors on a cluster (:mod:`sao.rl.cluster.connection`). Everything else
is :class:`~sao.rl.training.trainer.Trainer`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from sao.agents import EpisodeRunner, LoopConfig, OpenAICompletionClient, Renderers, RetryPolicy
from sao.agents.clients import GenerateClient, generate_base_url
from sao.agents.engine import EngineClient, EngineMeter, VLLMServer, VLLMServerConfig, cpu_share
from sao.agents.interrupts import quiet_interrupts
from sao.agents.models import ensure_model
from sao.envs import resolve
from sao.rl.algos import LearnsFromDemonstrations, make_algorithm
from sao.rl.config import (
    TrainConfig,
    activation_checkpointing,
    engine_urls,
    resolve_defaults,
    scheduler_config,
    validate,
)
from sao.rl.errors import ConfigError
from sao.rl.learner import (
    Learner, LearnerConfig, TorchThread, ValueModel, configure_allocator, pin_caller, resolve_bf16,
)
from sao.rl.prompts import ScheduledTaskStream
from sao.rl.rollout import HealthConfig, OrchestratedRollout, Replica
from sao.rl.training.agent_players import AgentPlayers, agent_players
from sao.rl.training.early_stop import EarlyStop
from sao.rl.training.engine_step import StepEngineMetrics
from sao.rl.training.heldout import HeldOutEval
from sao.rl.training.metrics_log import ConsoleSink, MetricsSink
from sao.rl.training.run_folder import RunFiles, refuse_to_overwrite
from sao.rl.training.trackers import Tracker, open_trackers
from sao.rl.training.trainer import Trainer
from sao.rl.weights import ReplicaWeightSync, WeightPublisher, WeightSync, check_engine_untied, export_engine_model

log = logging.getLogger(__name__)


def learner_config(cfg: TrainConfig, device: torch.device | None = None) -> LearnerConfig:
    """The learner's configuration; ``critic_bf16=auto`` is resolved for ``device``, the one the
    learner runs on (default: the run's ``device``; a data-parallel rank may run elsewhere)."""
    o = cfg.optim
    return LearnerConfig(lr=o.lr, value_lr=o.value_lr, value_warmup_steps=o.value_warmup_steps,
                         value_head_lr=o.value_head_lr,
                         lr_decay=o.lr_decay, decay_steps=cfg.max_steps, min_lr_ratio=o.min_lr_ratio,
                         weight_decay=o.weight_decay, grad_clip=o.grad_clip, token_budget=o.token_budget, bf16=o.bf16,
                         critic_bf16=resolve_bf16(o.critic_bf16, device or _device(cfg.device)), pack=o.pack,
                         **cfg.algo.learner_options())  # agg; a critic's value_clip, freeze_value_attention


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


@dataclass
class Engine:
    """One engine the run uses: its root URL, and the managed server behind it (None: external)."""

    root: str
    server: VLLMServer | None = None

    def row(self) -> dict[str, Any]:
        """Its line of ``engines.json``."""
        s = self.server
        return {"url": self.root, "managed": s is not None, "pid": s.pid if s else None,
                "log": str(s.log_path) if s and s.log_path else None}


def _server_config(cfg: TrainConfig, model_path: str, served: str, log_path: Path | None,
                   env: dict[str, str] | None = None) -> VLLMServerConfig:
    """How each managed engine starts (on this machine, or in a replica's actor on its node)."""
    return VLLMServerConfig(
        model=model_path, served_model_name=served, max_model_len=cfg.engine.max_model_len,
        kv_cache_gib=cfg.engine.kv_cache_gib, dtype=cfg.model.engine_dtype,
        extra_args=tuple(cfg.engine.extra_args), speculative=cfg.engine.speculative_config(),
        token_route=cfg.engine.token_route, startup_timeout_s=cfg.engine.startup_timeout_s, log_path=log_path,
        env=env or {}, nice=cfg.engine.nice)


def engine_count(cfg: TrainConfig) -> int:
    """How many engines a run uses: one with ``rollout=sync``, else ``rollout.replicas``."""
    return 1 if cfg.rollout.mode == "sync" else cfg.rollout.replicas


def managed_server(cfg: TrainConfig, model_path: str, served: str, log_path: Path, i: int, n: int) -> VLLMServer:
    """Replica ``i`` of ``n`` managed engines on this machine, not yet started. On a CPU-only machine: several
    engines each their own cores (vLLM alone pins all to the same); a lone one on a small machine all of them,
    unless the learner trains while it generates (:func:`sao.agents.engine.fleet.cpu_share`)."""
    cores = cpu_share(i, n, beside_learner=cfg.rollout.mode != "sync")
    return VLLMServer(_server_config(cfg, model_path, served, log_path, cores))


@contextlib.contextmanager
def _engines(cfg: TrainConfig, model_path: str, run_dir: Path, n: int) -> Iterator[tuple[list[Any], str]]:
    """(engines, served model name): the external ones of ``engine.base_url``, else ``n`` managed
    ones living as long as the context (started from the main thread, which the SIGTERM guard
    needs; each blocks until healthy), or with ``cluster=ray`` ``n`` Ray replicas (:func:`_ray_engines`).
    ``RUN_DIR/engines.json`` says where each one is."""
    served = cfg.engine.served_name or cfg.model.name
    if cfg.cluster.kind == "ray":
        with _ray_engines(cfg, model_path, run_dir, n, served) as engines:
            yield engines, served
        return
    urls = engine_urls(cfg.engine.base_url)
    if urls:
        engines = [Engine(u) for u in urls]
        write_engines(run_dir, engines)
        yield engines, served
        return
    with contextlib.ExitStack() as stack:
        engines = []
        for i in range(n):
            log_path = run_dir / ("vllm.log" if n == 1 else f"vllm-{i}.log")
            server = managed_server(cfg, model_path, served, log_path, i, n)
            stack.enter_context(server)
            engines.append(Engine(server.root_url, server))
        write_engines(run_dir, engines)
        yield engines, served


@contextlib.contextmanager
def _ray_engines(cfg: TrainConfig, model_path: str, run_dir: Path, n: int, served: str) -> Iterator[list[Any]]:
    """``cluster=ray``: ``n`` replicas as Ray actors (sao.rl.cluster.replicas), each starting the managed
    vLLM on its node from ``model_path`` (shipped there, or read from the shared filesystem)."""
    import uuid

    from sao.rl.cluster.engine_host import VLLMLaunch
    from sao.rl.cluster.replicas import RayFleet

    c = cfg.cluster
    if c.weights == "shared_dir" and not run_dir.resolve().is_relative_to(Path(c.shared_dir or "/").resolve()):
        raise ConfigError(f"cluster.weights=shared_dir: the run folder {run_dir.resolve()} must lie under "
                          f"cluster.shared_dir={c.shared_dir}, which every node mounts at the same path")
    launch = VLLMLaunch(_server_config(cfg, model_path, served, None))
    with RayFleet(c, n, launch, Path(model_path), run_id=f"{run_dir.name}-{uuid.uuid4().hex[:8]}",
                  start_timeout_s=cfg.engine.startup_timeout_s) as fleet:
        write_engines(run_dir, fleet.engines)
        yield fleet.engines


def write_engines(run_dir: Path, engines: list[Any]) -> None:
    """``RUN_DIR/engines.json``: each replica's URL, and for a managed one its pid (process group) and
    log; a Ray replica's node too (its id and IP), and its restarts."""
    rows = [{"replica": i, **e.row()} for i, e in enumerate(engines)]
    tmp = run_dir / "engines.json.tmp"
    tmp.write_text(json.dumps(rows, indent=2) + "\n")
    tmp.replace(run_dir / "engines.json")


def episode_bound(cfg: TrainConfig, concurrency: int) -> int:
    """``concurrency`` episodes in flight, at most ``env.max_concurrent`` when the env sets one."""
    return min(concurrency, cfg.env.max_concurrent) if cfg.env.max_concurrent else concurrency


def env_kwargs(cfg: TrainConfig) -> dict[str, Any]:
    return dict(cfg.env.kwargs)


def heldout_eval(cfg: TrainConfig, env_name: str, client: Any, renderer_for: Any, run_dir: Path,
                 agents: AgentPlayers | None = None) -> HeldOutEval | None:
    """The held-out evaluation of ``cfg.eval`` on the env's held-out split; None when it is off or the
    env has none (``env.heldout_kwargs`` unset: say so, since the run then shows no held-out figure).
    With an agent plug-in (``agents``), the agent plays the held-out episodes too."""
    if not cfg.eval.enabled:
        return None
    if cfg.env.heldout_kwargs is None:
        log.warning("env %s has no held-out split (env.heldout_kwargs); no held-out evaluation", env_name)
        return None
    if cfg.rollout.mode != "sync":
        log.warning("rollout=%s: the held-out evaluation runs with rollout=sync only (the replicas may hold "
                    "different versions); skipped", cfg.rollout.mode)
        return None
    e = cfg.eval
    loop = LoopConfig(max_turns=cfg.env.max_turns, max_tokens=e.max_tokens or cfg.env.max_tokens,
                      max_tokens_per_turn=cfg.env.max_tokens_per_turn, max_model_len=cfg.engine.max_model_len,
                      temperature=e.temperature, top_p=1.0)
    kwargs = {**env_kwargs(cfg), **cfg.env.heldout_kwargs}
    runner = None if agents is None else agents.episodes(env_name, temperature=e.temperature, env_kwargs=kwargs)
    return HeldOutEval(client=client, renderer_for=renderer_for, env_name=env_name, env_kwargs=kwargs, loop=loop,
                       problems=e.problems, concurrency=episode_bound(cfg, e.concurrency), path=RunFiles(run_dir).eval,
                       runner=runner, seed=cfg.seed)


def make_learner(cfg: TrainConfig, model_path: str, uses_critic: bool, *, data_parallel: Any = None,
                 device: str | None = None) -> Learner:
    """The policy (the HF model in ``model.dtype`` on the run's device, in eval mode: no dropout, so the
    learner's log-probs match the engine's), its value model when the algorithm has a critic, and the
    :class:`Learner` holding both with their optimizers. ``data_parallel``: this process's rank of a
    data-parallel learner (sao.rl.learner.parallel.launch), on ``device`` (its GPU)."""
    from transformers import AutoModelForCausalLM

    device = torch.device(device) if device is not None else _device(cfg.device)
    config = learner_config(cfg, device)

    def attention(bf16: bool) -> str:
        if cfg.model.attn_implementation != "auto":
            return cfg.model.attn_implementation
        return "eager" if bf16 and device.type == "cpu" else "sdpa"

    policy = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, cfg.model.dtype),
                                                  attn_implementation=attention(config.bf16)).to(device)
    policy.eval()
    value = None
    if uses_critic:
        value = ValueModel.from_policy(policy).to(device)
        value.backbone.set_attn_implementation(attention(config.critic_autocast))
    policy, value = _wrap_lora(cfg, policy, value)
    if activation_checkpointing(cfg):
        from sao.rl.learner.activation_recompute import enable_activation_checkpointing

        n = [enable_activation_checkpointing(m) for m in (policy, value) if m is not None]
        log.info("activation checkpointing: %s decoder layers recomputed in the backward pass", " + ".join(map(str, n)))
    return Learner(policy, config, value_model=value, data_parallel=data_parallel)


async def _run(cfg: TrainConfig, run_dir: Path, sinks: list[MetricsSink], trackers: list[Tracker],
               thread: TorchThread) -> dict[str, Any]:
    quiet_interrupts()  # SIGTERM and Ctrl-C are reported by sao-train itself (sao.agents.interrupts)
    validate(cfg)
    algo = make_algorithm(cfg.algo)  # fails on a bad algo before anything slow starts
    env_name = resolve(cfg.env.name).name
    tasks = ScheduledTaskStream(env_name, env_kwargs(cfg), cfg.seed, cfg.schedule)
    model_path = await thread.run(ensure_model, cfg.model.name)
    await thread.run(torch.manual_seed, cfg.seed)
    with contextlib.ExitStack() as ranks_stack:
        host = None
        if cfg.cluster.kind == "ray":  # imports ray; cluster=local never does
            from sao.rl.cluster.connection import connect

            host = ranks_stack.enter_context(connect(cfg.cluster))
        if cfg.learner.world_size == 1:
            learner = await thread.run(make_learner, cfg, model_path, algo.uses_critic)
        else:  # data-parallel: this process is rank 0 (sao.rl.learner.parallel.launch)
            from sao.rl.learner.parallel.launch import learner_ranks

            ranks = ranks_stack.enter_context(learner_ranks(cfg, model_path, host=host))
            learner = await thread.run(make_learner, cfg, model_path, algo.uses_critic,
                                       data_parallel=ranks.data_parallel(), device=ranks.device)
            algo = await thread.run(ranks.lead, algo, learner)
        return await _train(cfg, run_dir, sinks, trackers, algo, learner, model_path, tasks, env_name, thread)


async def _train(cfg: TrainConfig, run_dir: Path, sinks: list[MetricsSink], trackers: list[Tracker], algo: Any,
                 learner: Learner, model_path: str, tasks: Any, env_name: str, thread: TorchThread) -> dict[str, Any]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    renderer_for = Renderers(tokenizer)
    loop = LoopConfig(max_turns=cfg.env.max_turns, max_tokens=cfg.env.max_tokens,
                      max_tokens_per_turn=cfg.env.max_tokens_per_turn, max_model_len=cfg.engine.max_model_len,
                      temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p)
    n = engine_count(cfg)
    # managed engines start from an untied copy of the policy, so that every sync moves their LM head
    # too (sao.rl.weights.sync module doc); external ones must have been started from such a copy
    engine_model = str(await thread.run(export_engine_model, learner.policy, Path(model_path),
                                        RunFiles(run_dir).engine_model, dtype=getattr(torch, cfg.model.engine_dtype)))
    with _engines(cfg, engine_model, run_dir, n) as (engines, served):
        roots = [e.root for e in engines]
        async with contextlib.AsyncExitStack() as stack:
            def completions(root: str) -> OpenAICompletionClient | GenerateClient:
                kind, url = (GenerateClient, generate_base_url(root)) if cfg.engine.token_route else (
                    OpenAICompletionClient, root + "/v1")
                return kind(url, served, timeout_s=cfg.engine.request_timeout_s, retry=RetryPolicy(),
                            max_connections=max(cfg.rollout.concurrency, cfg.eval.concurrency))

            if cfg.cluster.kind == "ray":  # each replica's URL changes when it comes back on another node
                # (its engine started from the untied copy this run exported and shipped: nothing to check)
                controls, clients = _following(engines, completions)
                for x in (*controls, *clients):
                    stack.push_async_callback(x.aclose)
            else:
                controls = [await stack.enter_async_context(EngineClient(root)) for root in roots]
                for control in controls:  # a tied engine head would never take an update (sao.rl.weights.sync)
                    await check_engine_untied(control)
                clients = []
                for root in roots:
                    client = completions(root)
                    stack.push_async_callback(client.aclose)
                    clients.append(client)
            agents = await stack.enter_async_context(agent_players(cfg, tokenizer, renderer_for, served, run_dir))
            runner = (EpisodeRunner(env_name, renderer_for, loop, env_kwargs(cfg)) if agents is None else
                      agents.episodes(env_name, temperature=loop.temperature, env_kwargs=env_kwargs(cfg)))
            source, sync = _source_and_sync(cfg, run_dir, algo, runner, tasks, (engines, clients, controls), served,
                                            thread, tokenizer, plugin=agents is not None)
            early = EarlyStop(cfg.eval.patience, run_dir, Path(model_path),
                              ceiling=cfg.eval.stop_above) if cfg.eval.patience else None
            trainer = Trainer(cfg, run_dir, learner=learner, algo=algo, source=source, weight_sync=sync,
                              pad_id=pad_id, sinks=sinks, trackers=trackers, tasks=tasks, early_stop=early,
                              heldout=heldout_eval(cfg, env_name, clients[0], renderer_for, run_dir, agents),
                              thread=thread, engine_metrics=StepEngineMetrics(
                                  EngineMeter(controls), speculative=cfg.engine.speculative_config().enabled))
            return await trainer.run()


def _source_and_sync(cfg: TrainConfig, run_dir: Path, algo: Any, runner: Any, tasks: Any, parts: tuple[Any, Any, Any],
                     served: str, thread: TorchThread, tokenizer: Any, *, plugin: bool) -> tuple[Any, Any]:
    """The trainer's source and weight sync: demonstrations (``algo=sft``: the engine serves the held-out
    evaluation only) or the rollout driver; the sync pushes into the one engine (``rollout=sync``) or
    publishes each version for the scheduler. ``plugin``: an agent plug-in plays the episodes (``agent=NAME``)."""
    engines, clients, controls = parts
    dtype = getattr(torch, cfg.model.engine_dtype)
    sync: Any
    if isinstance(algo, LearnsFromDemonstrations):  # algo=sft: the engine serves the evaluation only
        if plugin:
            raise ConfigError(f"algo={cfg.algo.name} plays its demonstrator through the project's loop; "
                              f"agent={cfg.agent} is not supported with it (use agent=llm)")
        source = demonstrations(algo, tokenizer, runner, tasks, cfg)
        sync = WeightSync(controls[0], RunFiles(run_dir).weights, model_name=served,
                          keep=max(2, cfg.engine.keep_weight_versions), warn_gap=cfg.engine.probe_warn_gap,
                          dtype=dtype, offload=thread.run)
    elif cfg.rollout.mode == "sync":  # the learner pushes each version into the one engine, and probes it
        # (2 versions at least: an engine restarted mid-push first reloads the one before, sao.rl.weights.replica_sync)
        source = _orchestrated(cfg, run_dir, engines, clients, controls, tasks, runner)
        sync = ReplicaWeightSync(WeightSync(
            controls[0], RunFiles(run_dir).weights, model_name=served,
            keep=max(2, cfg.engine.keep_weight_versions),
            warn_gap=cfg.engine.probe_warn_gap, dtype=dtype, offload=thread.run), source)
    else:  # the learner writes each version; the scheduler decides when each replica loads it
        source = _orchestrated(cfg, run_dir, engines, clients, controls, tasks, runner)
        sync = WeightPublisher(RunFiles(run_dir).weights, keep=cfg.rollout.staleness + 2, dtype=dtype,
                               offload=thread.run)
    return source, sync


def demonstrations(algo: Any, tokenizer: Any, runner: Any, tasks: Any, cfg: TrainConfig) -> Any:
    """``algo=sft``'s source: ``algo.demonstrator`` played by a scripted client through ``runner`` (the
    project's loop on the training env) on ``tasks`` (the run's training stream; sao.rl.warm_start)."""
    from sao.agents.clients.scripted import ScriptedClient
    from sao.rl.warm_start import DemonstrationSource, demonstrator

    try:
        policy = demonstrator(algo.demonstrator)
    except ValueError as exc:
        raise ConfigError(f"algo.demonstrator: {exc}") from exc
    return DemonstrationSource(runner, ScriptedClient(tokenizer, policy), tasks, min_reward=algo.min_reward,
                               seed=cfg.seed, concurrency=min(cfg.rollout.concurrency, 8))  # 8: sandboxes at once


def _following(engines: list[Any], completions: Any) -> tuple[list[Any], list[Any]]:
    """The controls and clients of Ray replicas, following each one's current URL (sao.rl.rollout.following);
    a weight reload first ships the version to the replica's node (RayEngine.localize)."""
    from sao.rl.rollout.following import FollowingClient, FollowingControl

    controls = [FollowingControl(e.url, EngineClient, localize=e.localize) for e in engines]
    clients = [FollowingClient(e.url, completions) for e in engines]
    return controls, clients


def _wrap_lora(cfg: TrainConfig, policy: Any, value: ValueModel | None) -> tuple[Any, ValueModel | None]:
    """``model.lora``: adapters on the policy, and on the critic's MLP when ``model.lora.critic``."""
    lora = cfg.model.lora
    if not lora.rank:
        return policy, value
    from sao.rl.learner import lora as lora_lib

    try:
        policy = lora_lib.wrap_policy(policy, lora)
        if value is not None and lora.critic:
            lora_lib.wrap_value(value, lora)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    for name, model in (("policy", policy), ("value model", value)):
        if model is not None:
            trainable, total = lora_lib.trainable_summary(model)
            log.info("LoRA rank %d: %s trains %d of %d parameters", lora.rank, name, trainable, total)
    return policy, value


def _orchestrated(cfg: TrainConfig, run_dir: Path, engines: list[Any], clients: list[Any], controls: list[Any],
                  tasks: Any, runner: Any) -> OrchestratedRollout:
    """Every rollout mode: the mode's scheduler over the replicas (``sync``: one); ``runner`` plays an
    episode on a replica's client (the project's loop, or an agent plug-in's :mod:`.agent_players`)."""
    # env.max_concurrent bounds the episodes of every replica together (a coding episode holds a container)
    slots = asyncio.Semaphore(cfg.env.max_concurrent) if cfg.env.max_concurrent else contextlib.nullcontext()

    async def play(client: Any, ref: Any, sample: int, seed: int) -> Any:
        async with slots:
            return await runner(client, task_id=ref.task_id, sample=sample, seed=seed)

    r, config = cfg.rollout, scheduler_config(cfg)
    def replica(engine: Any, client: Any, control: Any) -> Replica:
        if not isinstance(engine, Engine):  # a Ray replica (sao.rl.cluster.replicas): a new actor, maybe elsewhere
            async def restart_actor() -> None:
                await asyncio.to_thread(engine.restart)

            return Replica(client, control, alive=engine.alive, restart=restart_actor)
        server = engine.server
        if server is None:  # external: watched through /health, restarted by whoever runs it
            return Replica(client, control)

        async def restart() -> None:
            await asyncio.to_thread(server.restart)  # same port: the clients keep their address

        return Replica(client, control, alive=lambda: server.running, restart=restart)

    e = cfg.engine
    health = HealthConfig(interval_s=e.health_interval_s, failures=e.health_failures, max_restarts=e.max_restarts)
    return OrchestratedRollout(r.mode, config, [replica(*x) for x in zip(engines, clients, controls)], tasks=tasks,
                               run_episode=play, weights_root=RunFiles(run_dir).weights, seed=cfg.seed,
                               reload_timeout_s=e.request_timeout_s, health=health,
                               on_restart=lambda rid: write_engines(run_dir, engines), keep_kv=r.keep_kv)


def _resume_step(cfg: TrainConfig, run_dir: Path) -> int | None:
    """The step of the checkpoint a resumed run continues from (None: a fresh run, or no checkpoint yet)."""
    if not cfg.resume:
        return None
    from sao.rl.training.checkpoint import Checkpointer

    latest = Checkpointer(RunFiles(run_dir).checkpoints).latest()
    return int(json.loads((latest / "state.json").read_text())["step"]) if latest else None


def run_training(cfg: TrainConfig, run_dir: Path, *, console: bool | None = None) -> dict[str, Any]:
    """Run (or resume) one training run in ``run_dir``; returns the last step's metrics."""
    configure_allocator()  # before the learner allocates anything (sao.rl.learner.memory)
    run_dir = Path(run_dir)
    if not cfg.resume:
        refuse_to_overwrite(run_dir)  # before anything slow starts
    run_dir.mkdir(parents=True, exist_ok=True)
    resolve_defaults(cfg)  # the env's domain and the loss band it implies, written into config.json
    config = json.loads(json.dumps(asdict(cfg), default=str))
    (run_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    sinks: list[MetricsSink] = []
    if cfg.logger.console if console is None else console:
        sinks.append(ConsoleSink(cfg.max_steps))
    # each tracker's library is imported here: a missing extra stops the run before anything slow starts
    trackers = open_trackers(cfg.logger, run_dir, config, resume_step=_resume_step(cfg, run_dir))
    # every torch call of the run on one thread, and this one on a single intra-op thread from here on
    # (sao.rl.learner.torch_thread: a second OpenMP team would slow every kernel); put back at the end
    from sao.rl.learner.parallel.launch import rank_threads

    threads = pin_caller()
    thread = TorchThread(rank_threads(cfg, threads))
    finished = False
    try:
        result = asyncio.run(_run(cfg, run_dir, sinks, trackers, thread))
        finished = True
        return result
    finally:
        for tracker in trackers:  # the trainer closes them; not when the run failed before it started
            tracker.close()
        thread.close(wait=finished)  # interrupted: the engines are stopped; no wait for an update in hand
        torch.set_num_threads(threads)
