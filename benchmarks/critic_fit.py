"""What SAO's value model needs at this scale, measured offline on saved trajectories.

    nice -n 10 python benchmarks/critic_fit.py RUN/trajectories.jsonl [MORE.jsonl ...] \
        --checkpoints 2,8,16,32 --settings default,warmup0,lr5e-5,lr5e-4,k1,k4,unfrozen

Reads the episodes a ``sao-train`` run saved (``trajectories.jsonl``: token ids, action mask, reward),
splits them BY TASK into a fit set and a held-out set (no prompt in both), and pretrains the project's
own value model on the fit set exactly as ``sao-train``'s critic-only pretraining does: the learner
``sao-train`` builds (:func:`benchmarks.learner_bench.build`, the bundled SmolLM2-135M, the run's
``optim`` and ``algo`` settings as overrides) and :meth:`sao.rl.algos.SAO.pretrain_critic` (its
targets, its clipped loss, its TTUR steps, its frozen attention), one batch of ``--batch-size``
trajectories a step, cycling through the fit set. After the numbers of batches in ``--checkpoints``
it scores the value model on the held-out set: explained variance pooled over action tokens and at
each trajectory's first action token (:mod:`sao.rl.learner.explained_variance`), and the value MSE.
One run of a setting gives all its checkpoints: the first 2 batches of a 32-batch run are a 2-batch
run's.

``--override`` gives the run's own config under every setting (``--override experiment=tool-task
--override model.name=RUN/warm_start/best_model`` for a tool-task run, whose critic starts from the
warm-started model).

Settings (``--settings``, comma-separated names of :data:`SETTINGS`, or names joined by ``+``) vary the value lr, its warm-up,
the TTUR ratio K and frozen attention; every other value is the main job's (conf/config.yaml).

Also printed: the ceiling of first-token explained variance. The value at the first action token
has seen only the prompt, so at best it predicts each prompt's success rate. Where the saved run
sampled a prompt several times (GRPO groups), the share of the reward variance that lies between
prompts (:func:`first_token_ceiling`) estimates what a critic can reach there on these data.

Without saved trajectories, ``--synthetic N`` makes N labelled synthetic episodes (reward 1 when the
prompt's first token is even): a check of the machinery, not a measurement of the task.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from learner_bench import build, compose  # noqa: E402  (benchmarks/ is not a package)

# name -> sao-train overrides on top of the main job's config (value lr 5 x 3e-5, warm-up 10, K = 2)
SETTINGS: dict[str, list[str]] = {
    "default": [],
    "warmup0": ["optim.value_warmup_steps=0"],
    "lr1e-5": ["optim.value_lr=1e-5"],
    "lr3e-5": ["optim.value_lr=3e-5"],
    "lr5e-5": ["optim.value_lr=5e-5"],
    "lr5e-4": ["optim.value_lr=5e-4"],
    "lr1e-3": ["optim.value_lr=1e-3"],
    "k1": ["algo.ttur_k=1"],
    "k4": ["algo.ttur_k=4"],
    "unfrozen": ["algo.freeze_value_attention=false"],
    "noclip": ["algo.value_clip=null"],
    "head1e-3": ["optim.value_head_lr=1e-3"],
    "head3e-3": ["optim.value_head_lr=3e-3"],
    "head1e-2": ["optim.value_head_lr=1e-2"],
    "ridge100": ["algo.value_head_ridge=100"],
    "ridge1000": ["algo.value_head_ridge=1000"],
    "ridge10000": ["algo.value_head_ridge=10000"],
}


def overrides(setting: str) -> list[str]:
    """The overrides of ``setting``: a name of :data:`SETTINGS`, or names joined by ``+`` (``lr5e-5+k4``)."""
    return [o for part in setting.split("+") for o in SETTINGS[part]]


@dataclass(frozen=True)
class Score:
    """A value model's fit on the held-out set after ``batches`` pretraining batches."""

    setting: str
    batches: int
    ev: float
    ev_first: float
    mse: float
    value_mean: float
    train_s: float


def load(paths: list[Path], pretraining_only: bool = False) -> list[Any]:
    """The trainable, finished episodes of the given trajectories.jsonl files; with ``pretraining_only``
    those sampled for the critic's pretraining (``rollout.train_step`` 0: the initial policy's)."""
    from sao.agents.store import read_trajectories

    out = []
    for path in paths:
        out += [t for t in read_trajectories(path) if t.status == "ok" and t.trainable and any(t.action_mask)
                and not (pretraining_only and (t.rollout is None or t.rollout.train_step != 0))]
    return out


def synthetic(n: int, seed: int = 0) -> list[Any]:
    """SYNTHETIC episodes (module doc): 20 prompt tokens, 8-40 sampled tokens, reward = first token even."""
    from sao.agents.records import Trajectory

    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt = [1] + [rng.randrange(100, 40000) for _ in range(19)]
        resp = [rng.randrange(100, 40000) for _ in range(rng.randrange(8, 41))]
        out.append(Trajectory(
            episode_id=f"synthetic-{i}", env="synthetic", task_id=f"synthetic-{i}", sample=0, seed=None,
            token_ids=tuple(prompt + resp), action_mask=(0,) * len(prompt) + (1,) * len(resp),
            logprobs=(0.0,) * (len(prompt) + len(resp)), turns=(), messages=(),
            reward=float(prompt[1] % 2 == 0), terminated=True, truncated=False, status="ok", info={}))
    return out


def split(trajectories: list[Any], held_out: float) -> tuple[list[Any], list[Any]]:
    """(fit, held-out) by a hash of the task id: every sample of a prompt lands on the same side."""
    def side(task_id: str) -> float:
        return int(hashlib.sha256(task_id.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF

    fit = [t for t in trajectories if side(t.task_id) >= held_out]
    return fit, [t for t in trajectories if side(t.task_id) < held_out]


def first_token_ceiling(trajectories: list[Any]) -> tuple[float, int]:
    """The share of the reward variance that lies between prompts, over the prompts sampled at least
    twice, and how many episodes that covers: what a critic that knew each prompt's success rate would
    explain at the first action token. One-way ANOVA: the spread of the prompts' mean rewards, less the
    sampling noise in those means (each prompt's variance over its samples / their number)."""
    import statistics

    by_task: dict[str, list[float]] = defaultdict(list)
    for t in trajectories:
        by_task[t.task_id].append(t.reward)
    groups = [rewards for rewards in by_task.values() if len(rewards) >= 2]
    rewards = [r for g in groups for r in g]
    if len(rewards) < 2 or statistics.pvariance(rewards) < 1e-8:
        return float("nan"), len(rewards)
    mean = statistics.fmean(rewards)
    between = sum(len(g) * (statistics.fmean(g) - mean) ** 2 for g in groups) / len(rewards)
    noise = sum(statistics.variance(g) for g in groups) / len(rewards)
    return (between - noise) / statistics.pvariance(rewards), len(rewards)


def score(algo: Any, learner: Any, batch: Any) -> tuple[float, float, float, float]:
    """(pooled EV, first-token EV, value MSE, mean value) of the value model on ``batch``."""
    from sao.rl.learner import explained_variance, first_action_explained_variance

    values = learner.predict_values(batch)
    b = algo.with_critic_targets(learner, batch, values)
    act = b.action_mask.bool()
    ev = explained_variance(b.old_values[act], b.returns[act])
    ev_first = first_action_explained_variance(b.old_values, b.returns, b.action_mask)
    mse = float(((b.old_values - b.returns)[act] ** 2).mean())
    return ev, ev_first, mse, float(b.old_values[act].mean())


def fit_setting(name: str, fit: list[Any], held: Any, args: argparse.Namespace) -> list[Score]:
    """Pretrain a fresh value model with setting ``name``; score it after each checkpoint."""
    from sao.rl.learner import collate

    cfg = compose([f"seed={args.seed}", f"batch_size={args.batch_size}", *args.override, *overrides(name)])
    algo, learner = build(cfg)
    rng = random.Random(args.seed)
    order: list[Any] = []
    scores, t_train = [], 0.0
    ev, ev_first, mse, mean = score(algo, learner, held)
    scores.append(Score(name, 0, ev, ev_first, mse, mean, 0.0))
    for n in range(1, max(args.checkpoints) + 1):
        if len(order) < args.batch_size:  # the next epoch, freshly shuffled
            epoch = list(fit)
            rng.shuffle(epoch)
            order += epoch
        part, order = order[:args.batch_size], order[args.batch_size:]
        t0 = time.monotonic()
        algo.pretrain_critic(learner, collate(part, args.pad_id).sorted_by_length())
        t_train += time.monotonic() - t0
        if n in args.checkpoints:
            ev, ev_first, mse, mean = score(algo, learner, held)
            scores.append(Score(name, n, ev, ev_first, mse, mean, t_train))
            print(f"  {name}: {n} batches ({t_train:.0f} s): EV {ev:+.3f}, first {ev_first:+.3f}, mse {mse:.4f}, "
                  f"mean value {mean:+.3f}",
                  flush=True)
    return scores


def table(scores: list[Score]) -> str:
    checkpoints = sorted({s.batches for s in scores})
    names = list(dict.fromkeys(s.setting for s in scores))
    at = {(s.setting, s.batches): s for s in scores}
    head = "| setting | " + " | ".join(f"{c} batches" for c in checkpoints) + " |"
    lines = [head, "|---|" + "---|" * len(checkpoints)]
    for name in names:
        cells = [f"{at[name, c].ev:+.3f} / {at[name, c].ev_first:+.3f} / {at[name, c].mse:.3f}"
                 if (name, c) in at else "" for c in checkpoints]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trajectories", nargs="*", type=Path, help="trajectories.jsonl files of sao-train runs")
    p.add_argument("--pretraining-only", action="store_true",
                   help="only the episodes sampled for the critic's pretraining (rollout.train_step 0)")
    p.add_argument("--synthetic", type=int, default=0, help="N labelled synthetic episodes instead (no saved run)")
    p.add_argument("--settings", default="default,lr5e-5,lr1e-5,k4,warmup0",
                   help=f"comma-separated, each a name or names joined by '+', of: {', '.join(SETTINGS)}")
    p.add_argument("--checkpoints", default="2,8,16,32", help="numbers of pretraining batches to score at")
    p.add_argument("--batch-size", type=int, default=8, help="trajectories per pretraining batch (the main job's)")
    p.add_argument("--held-out", type=float, default=0.25, help="share of the tasks held out")
    p.add_argument("--max-fit", type=int, default=0, help="use at most this many fit episodes (0: all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads: 1 on a shared machine (2 threads on 2 busy cores ran 5x slower)")
    p.add_argument("--json", type=Path, default=None, help="also write the scores here")
    p.add_argument("--override", action="append", default=[],
                   help="a sao-train override under every setting, e.g. experiment=tool-task or "
                        "model.name=RUN/warm_start/best_model (the run's starting model); repeatable")
    args = p.parse_args(argv)
    args.checkpoints = sorted({int(c) for c in args.checkpoints.split(",")})
    args.settings = args.settings.split(",")
    unknown = [s for s in args.settings if any(part not in SETTINGS for part in s.split("+"))]
    if unknown or not (args.trajectories or args.synthetic):
        p.error(f"unknown settings {unknown}" if unknown else "give trajectories.jsonl files or --synthetic N")
    return args


def main(argv: list[str] | None = None) -> int:
    import torch
    from transformers import AutoTokenizer

    from sao.agents.models.prepare import ensure_model
    from sao.rl.learner import collate

    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    tok = AutoTokenizer.from_pretrained(ensure_model("smollm2-135m"))
    args.pad_id = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
    source = "SYNTHETIC (labelled; not a measurement of the task)" if args.synthetic else \
        ", ".join(map(str, args.trajectories))
    episodes = synthetic(args.synthetic, args.seed) if args.synthetic else load(args.trajectories, args.pretraining_only)
    fit, held = split(episodes, args.held_out)
    if args.max_fit:
        fit = fit[:args.max_fit]
    ceiling, covered = first_token_ceiling(held)
    tokens = sum(sum(t.action_mask) for t in fit) / max(len(fit), 1)
    print(f"data: {source}\n{len(fit)} fit episodes ({len({t.task_id for t in fit})} tasks, mean reward "
          f"{sum(t.reward for t in fit) / len(fit):.3f}, {tokens:.0f} action tokens each), {len(held)} held-out "
          f"({len({t.task_id for t in held})} tasks, mean reward {sum(t.reward for t in held) / len(held):.3f})")
    print(f"first-token EV ceiling on the held-out set (variance between prompts, {covered} episodes): {ceiling:+.3f}")
    held_batch = collate(held, args.pad_id).sorted_by_length()
    scores: list[Score] = []
    for name in args.settings:
        print(f"setting {name}: {' '.join(overrides(name)) or '(the main job)'}", flush=True)
        scores += fit_setting(name, fit, held_batch, args)
        if args.json:  # after each setting: a long grid stopped part-way keeps what it measured
            args.json.write_text(json.dumps([s.__dict__ for s in scores], indent=1) + "\n")
    print("\nheld-out EV pooled / EV at the first action token / value MSE, after N pretraining batches of "
          f"{args.batch_size}:\n" + table(scores))
    return 0


if __name__ == "__main__":
    sys.exit(main())
