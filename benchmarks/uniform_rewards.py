"""How far one SAO policy step moves the policy when a batch's rewards are all equal (issue 35's collapse).

    nice -n 10 python benchmarks/uniform_rewards.py RUN/trajectories.jsonl [--model RUN/warm_start/best_model] \
        [--batch-size 8] [--steps 3] [--pretrain 2] [OVERRIDES ...]

A batch whose rewards are all equal says nothing about which actions are better. GRPO's group advantages are
then exactly 0, and so is its gradient. SAO's advantages are the critic's errors alone: small, but not 0. Adam
divides each parameter's step by the root of its mean squared gradient, so a step's size does not shrink with
the advantages' scale while that mean holds no larger gradients (on the first step, bias correction makes it
exactly ``lr * sign(g)``). This measures it. From one start (the learner ``sao-train`` builds, its critic
pretrained on the same ``--pretrain`` batches), ``--steps`` SAO updates on one batch of saved episodes:

    as sampled   the batch's own rewards
    all 0        every reward set to 0   (e.g. a failing policy's batch)
    all 1        every reward set to 1

After each update it prints the mean |advantage| of the action tokens, the policy's gradient norm, and how far
the policy moved on a probe batch (the next ``--batch-size`` episodes, sampled by the starting policy):
``kl``, the mean of log pi_before - log pi_after over its action tokens (an estimate of KL(before || after)),
and ``|dlogp|``, the mean absolute change of those log-probs. Every other setting is ``sao-train``'s, with the
given Hydra overrides (e.g. ``experiment=tool-task``).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from critic_fit import load  # noqa: E402  (benchmarks/ is not a package)
from learner_bench import build, compose  # noqa: E402

ARMS = {"as sampled": None, "all 0": 0.0, "all 1": 1.0}


def probe_logprobs(learner: Any, probe: Any) -> Any:
    """log pi(action token) of ``probe`` under the learner's current policy (0 at other tokens)."""
    import torch

    from sao.rl.learner.learner import token_logprobs

    with torch.no_grad():
        return token_logprobs(learner.policy, probe.input_ids, probe.attention_mask, only=probe.action_mask.bool())


def run_arm(cfg: Any, reward: float | None, pretrain: list[Any], batch: list[Any], probe: Any, steps: int,
            pad_id: int) -> list[dict[str, float]]:
    """The arm's rows: one per update (module doc)."""
    from sao.rl.learner import collate

    algo, learner = build(cfg)
    for i in range(0, len(pretrain), len(batch)):
        algo.pretrain_critic(learner, collate(pretrain[i:i + len(batch)], pad_id).sorted_by_length())
    episodes = batch if reward is None else [replace(t, reward=reward) for t in batch]
    train = collate(episodes, pad_id).sorted_by_length()
    act = probe.action_mask.bool()
    before = probe_logprobs(learner, probe)
    rows = []
    for step in range(1, steps + 1):
        adv = algo.advantages(learner, train)
        metrics = algo.update(learner, train)
        after = probe_logprobs(learner, probe)
        diff = (before - after)[act]
        rows.append({"step": step, "rewards": float(train.rewards.mean()), "|adv|": float(adv[train.action_mask.bool()].abs().mean()),
                     "grad_norm": float(metrics.get("grad_norm/policy", float("nan"))),
                     "kl": float(diff.mean()), "|dlogp|": float(diff.abs().mean())})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("trajectories", type=Path)
    p.add_argument("--model", default=None, help="the policy that sampled them (model.name); default: the config's")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--pretrain", type=int, default=2, help="critic-only batches first (the same for every arm)")
    p.add_argument("--pad-id", type=int, default=0)
    p.add_argument("overrides", nargs="*")
    args = p.parse_intermixed_args(argv)
    overrides = list(args.overrides) + ([f"model.name={args.model}"] if args.model else [])
    cfg = compose(overrides)
    episodes = load([args.trajectories])
    n = args.batch_size
    if len(episodes) < n * (2 + args.pretrain):
        raise SystemExit(f"{args.trajectories}: {len(episodes)} usable episodes, {n * (2 + args.pretrain)} needed")
    from sao.rl.learner import collate

    batch, probe = episodes[:n], collate(episodes[n:2 * n], args.pad_id)
    pretrain = episodes[2 * n:(2 + args.pretrain) * n]
    print(f"{len(episodes)} episodes; batch rewards {[t.reward for t in batch]}; overrides {overrides}")
    print(f"{'arm':<11} {'step':>4} {'reward':>6} {'|adv|':>8} {'grad':>8} {'kl':>9} {'|dlogp|':>8}")
    for name, reward in ARMS.items():
        for row in run_arm(cfg, reward, pretrain, batch, probe, args.steps, args.pad_id):
            print(f"{name:<11} {row['step']:>4} {row['rewards']:>6.2f} {row['|adv|']:>8.4f} {row['grad_norm']:>8.4f} "
                  f"{row['kl']:>+9.5f} {row['|dlogp|']:>8.5f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
