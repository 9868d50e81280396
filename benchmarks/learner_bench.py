"""Shared by the learner benchmarks: the default run's learner, built as ``sao-train`` builds it,
and synthetic batches shaped like the default arithmetic run. Not a benchmark by itself."""

from __future__ import annotations

from typing import Any


def compose(overrides: list[str]) -> Any:
    """The typed TrainConfig that ``sao-train OVERRIDES`` would run."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module

    import sao.rl.cli.train  # noqa: F401  (schema and resolvers)
    from sao.rl.cli.train import to_config

    with initialize_config_module("sao.conf", version_base="1.3"):
        return to_config(hydra_compose("config", overrides=overrides))


def build(cfg: Any) -> tuple[Any, Any]:
    """(algorithm, learner) for ``cfg``, with the bundled model, as rl/training/build.py makes them."""
    import torch

    from sao.agents.models.prepare import ensure_model
    from sao.rl.algos import make_algorithm
    from sao.rl.training.build import make_learner

    algo = make_algorithm(cfg.algo)
    torch.manual_seed(cfg.seed)
    return algo, make_learner(cfg, ensure_model(cfg.model.name), algo.uses_critic)


def synthetic_batch(step: int, n: int, group: int, prompt: int, response: int, seed: int = 0) -> Any:
    """``n`` trajectories of ``prompt`` prompt tokens and 0.5-1.5 x ``response`` sampled tokens (the
    engine's log-probs made up), rewards 1 with probability 0.3, ``group`` samples per task id."""
    import torch

    from sao.agents.records import Trajectory
    from sao.rl.learner.batch import collate

    gen = torch.Generator().manual_seed(seed * 100_003 + step)
    out = []
    for i in range(n):
        n_resp = int(response * (0.5 + torch.rand(1, generator=gen).item()))
        ids = torch.randint(100, 40000, (prompt + n_resp,), generator=gen).tolist()
        out.append(Trajectory(
            episode_id=f"s{step}-{i}", env="arithmetic", task_id=f"t{step}-{i // group}", sample=i % group, seed=None,
            token_ids=tuple(ids), action_mask=(0,) * prompt + (1,) * n_resp,
            logprobs=(0.0,) * prompt + tuple((-torch.rand(n_resp, generator=gen)).tolist()), turns=(), messages=(),
            reward=float(torch.rand(1, generator=gen).item() < 0.3), terminated=True, truncated=False, status="ok",
            info={"prompt_index": step * n + i // group}))
    return collate(out, pad_id=0).sorted_by_length()
