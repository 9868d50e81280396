"""How much of the return a value head could read off the policy's own features, by number of episodes.

    .venv/bin/python benchmarks/critic_probe.py MODEL TRAJECTORIES.jsonl [--sizes 70,150,300,0] [--ridge 100,1000,10000]

A cheaper question than :mod:`critic_fit` asks. ``MODEL``'s trunk (a Hugging Face causal LM folder: the
run's starting model, e.g. ``RUN/warm_start/best_model``) is run once, frozen, over every saved episode
(``trajectories.jsonl`` of ``sao-train`` or ``sao-eval``: token ids, action mask, reward). At each action
token the hidden state of the state in which the token was chosen (position t - 1, as the value model
reads it) is a feature vector; a ridge regression on the fit episodes' features predicts the episode's
reward. The held-out explained variance, pooled over action tokens and at each episode's first action
token, says how much a value head on these features generalises from N episodes, for each N of
``--sizes`` (0: all fit episodes) and each ridge penalty. The episodes are :func:`critic_fit.load`'s and
the split is :func:`critic_fit.split`'s (by task, 20% held out: ``critic_fit.py --held-out 0.2`` holds out
the same episodes). A probe that explains nothing from N episodes says a critic trained on N
episodes has little to find in the frozen trunk; the value model's trainable MLPs can find more, or
overfit sooner.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from critic_fit import load, split  # noqa: E402  (benchmarks/ is not a package)

Episode = tuple[np.ndarray, float]  # (features [action tokens, hidden], reward)


def explained_variance(pred: np.ndarray, y: np.ndarray) -> float:
    """The project's definition (:func:`sao.rl.learner.explained_variance`), on numpy arrays."""
    import torch

    from sao.rl.learner import explained_variance as ev

    return ev(torch.from_numpy(pred), torch.from_numpy(y))


def ridge_scores(fit: list[Episode], held: list[Episode], ridge: float) -> tuple[float, float]:
    """(pooled, first-token) held-out explained variance of a ridge regression of the reward on the fit
    episodes' standardised features (every action token an example), solved by the critic's own
    :class:`~sao.rl.learner.ridge_head.RidgeHead` (``algo.value_head_ridge``)."""
    import torch

    from sao.rl.learner.ridge_head import RidgeHead

    x = np.concatenate([f for f, _ in fit])
    head = RidgeHead(x.shape[1], ridge)
    head.add(torch.from_numpy(x), torch.from_numpy(np.concatenate([np.full(len(f), r) for f, r in fit])))
    w, b = (t.numpy() for t in head.solve())
    xh = np.concatenate([f for f, _ in held])
    yh = np.concatenate([np.full(len(f), r) for f, r in held])
    first = np.stack([f[0] for f, _ in held])
    yf = np.array([r for _, r in held])
    return explained_variance(xh @ w + b, yh), explained_variance(first @ w + b, yf)


HELD_OUT = 0.2  # the share of the tasks held out (critic_fit.split, its --held-out)


def features(model_dir: str, trajectories: list[Any], threads: int) -> list[Episode]:
    import torch
    from transformers import AutoModelForCausalLM

    from sao.rl.learner.value_model import backbone_of

    torch.set_num_threads(threads)
    trunk = backbone_of(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)).eval()
    out = []
    with torch.no_grad():
        for t in trajectories:
            hidden = trunk(torch.tensor([list(t.token_ids)])).last_hidden_state[0]
            actions = np.nonzero(np.array(t.action_mask))[0]
            out.append((hidden[actions - 1].numpy(), float(t.reward)))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="the run's starting model folder (the value model's initial trunk)")
    p.add_argument("trajectories", type=Path, help="a trajectories.jsonl of sao-train or sao-eval")
    p.add_argument("--sizes", default="70,150,300,0", help="numbers of fit episodes (0: all)")
    p.add_argument("--ridge", default="100,1000,10000", help="ridge penalties")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    episodes = load([args.trajectories])
    print(f"{len(episodes)} episodes of {args.trajectories}, mean reward {np.mean([t.reward for t in episodes]):.3f}")
    fit_eps, held_eps = split(episodes, HELD_OUT)
    fit, held = features(args.model, fit_eps, args.threads), features(args.model, held_eps, args.threads)
    random.Random(0).shuffle(fit)
    print(f"held out: {len(held)} episodes, mean reward {np.mean([r for _, r in held]):.3f}; fit: {len(fit)}")
    print("| fit episodes | ridge | held-out EV pooled | at the first action token |\n|---|---|---|---|")
    for n in [int(s) or len(fit) for s in args.sizes.split(",")]:
        for ridge in (float(s) for s in args.ridge.split(",")):
            pooled, first = ridge_scores(fit[:n], held, ridge)
            print(f"| {min(n, len(fit))} | {ridge:g} | {pooled:+.3f} | {first:+.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
