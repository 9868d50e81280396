"""How much of the return a value head could read off the policy's own features, by number of episodes.

    .venv/bin/python benchmarks/critic_probe.py MODEL TRAJECTORIES.jsonl [--sizes 70,150,300,0] [--ridge 100,1000,10000]

A cheaper question than :mod:`critic_fit` asks. ``MODEL``'s trunk (a Hugging Face causal LM folder: the
run's starting model, e.g. ``RUN/warm_start/best_model``) is run once, frozen, over every saved episode
(``trajectories.jsonl`` of ``sao-train`` or ``sao-eval``: token ids, action mask, reward). At each action
token the hidden state of the state in which the token was chosen (position t - 1, as the value model
reads it) is a feature vector; a ridge regression on the fit episodes' features predicts the episode's
reward. The held-out explained variance, pooled over action tokens and at each episode's first action
token, says how much a value head on these features generalises from N episodes, for each N of
``--sizes`` (0: all fit episodes) and each ridge penalty. The split is by task (about 20% held out), as
:func:`critic_fit.split` does. A probe that explains nothing from N episodes says a critic trained on N
episodes has little to find in the frozen trunk; the value model's trainable MLPs can find more, or
overfit sooner.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np

Episode = tuple[bool, np.ndarray, float]  # (held out, features [action tokens, hidden], reward)


def held_out(task_id: str, share: float = 0.2) -> bool:
    return int(hashlib.sha256(task_id.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF < share


def explained_variance(pred: np.ndarray, y: np.ndarray) -> float:
    return float(1 - np.var(y - pred) / np.var(y)) if np.var(y) > 0 else float("nan")


def ridge_scores(fit: list[Episode], held: list[Episode], ridge: float) -> tuple[float, float]:
    """(pooled, first-token) held-out explained variance of a ridge regression of the reward on the fit
    episodes' standardised features (every action token an example, the fit reward mean as intercept)."""
    x = np.concatenate([f for _, f, _ in fit])
    y = np.concatenate([np.full(len(f), r) for _, f, r in fit])
    mu, sd = x.mean(0), x.std(0) + 1e-6
    a = (x - mu) / sd
    w = np.linalg.solve(a.T @ a + ridge * np.eye(a.shape[1]), a.T @ (y - y.mean()))
    xh = np.concatenate([f for _, f, _ in held])
    yh = np.concatenate([np.full(len(f), r) for _, f, r in held])
    first = np.stack([f[0] for _, f, _ in held])
    yf = np.array([r for _, _, r in held])
    return (explained_variance((xh - mu) / sd @ w + y.mean(), yh),
            explained_variance((first - mu) / sd @ w + y.mean(), yf))


def features(model_dir: str, rows: list[dict[str, Any]], threads: int) -> list[Episode]:
    import torch
    from transformers import AutoModelForCausalLM

    from sao.rl.learner.value_model import backbone_of

    torch.set_num_threads(threads)
    trunk = backbone_of(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)).eval()
    out = []
    with torch.no_grad():
        for r in rows:
            hidden = trunk(torch.tensor([r["token_ids"]])).last_hidden_state[0]
            actions = np.nonzero(np.array(r["action_mask"]))[0]
            out.append((held_out(r["task_id"]), hidden[actions - 1].numpy(), float(r["reward"])))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="the run's starting model folder (the value model's initial trunk)")
    p.add_argument("trajectories", type=Path, help="a trajectories.jsonl of sao-train or sao-eval")
    p.add_argument("--sizes", default="70,150,300,0", help="numbers of fit episodes (0: all)")
    p.add_argument("--ridge", default="100,1000,10000", help="ridge penalties")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    rows = [json.loads(line) for line in args.trajectories.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r.get("status") == "ok" and r.get("token_ids") and any(r.get("action_mask") or ())]
    print(f"{len(rows)} episodes of {args.trajectories}, mean reward {np.mean([r['reward'] for r in rows]):.3f}")
    episodes = features(args.model, rows, args.threads)
    held = [e for e in episodes if e[0]]
    fit = [e for e in episodes if not e[0]]
    random.Random(0).shuffle(fit)
    print(f"held out: {len(held)} episodes, mean reward {np.mean([r for _, _, r in held]):.3f}; fit: {len(fit)}")
    print("| fit episodes | ridge | held-out EV pooled | at the first action token |\n|---|---|---|---|")
    for n in [int(s) or len(fit) for s in args.sizes.split(",")]:
        for ridge in (float(s) for s in args.ridge.split(",")):
            pooled, first = ridge_scores(fit[:n], held, ridge)
            print(f"| {min(n, len(fit))} | {ridge:g} | {pooled:+.3f} | {first:+.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
