"""benchmarks/war.py's traces: real agent episodes, kept as the requests their engine was sent.

Every model call of every recorded episode is one :class:`Request`: its prompt token ids (system
prompt, task, earlier turns, tool output) and its per-turn token limit. ``seed`` is
``1000 * episode + turn``, which is how :func:`war_routing.episodes_of` groups them back into episodes.

Two kinds (``--trace-env``):
- ``arithmetic``: arithmetic with the ``python`` tool and one feedback turn after a wrong answer (2
  turns at most, prompts of about 200-400 tokens).
- ``swe-local``: the six local repositories with real bugs, each episode in its own Docker sandbox
  with the ``bash`` tool (:func:`sao.envs.swebench.swe_local`; needs the Docker daemon). Coding
  episodes run longer and carry tool output, so a later turn's own prefix is long: where
  cache-aware routing should pay. Episodes go round the six tasks, so tasks repeat, as samples do.

Only episodes that ran (status ``ok``; a truncated one counts) are kept: an infrastructure failure
sent nothing worth replaying.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sao.agents import LoopConfig, OpenAICompletionClient
from sao.agents.loop.episodes import EpisodeRunner, Renderers
from sao.envs.arithmetic import ArithmeticTasks

PER_TURN = 128  # tokens a model call may generate
TRACE_ENVS = ("arithmetic", "swe-local")
SWE_TURNS = 6  # tool steps of a recorded coding episode (the model's calls; format errors count)


@dataclass(frozen=True)
class Request:
    """One model call of a recorded episode: what the engine was sent."""

    prompt: list[int]
    max_tokens: int
    seed: int


def episode_setup(env: str) -> tuple[dict[str, Any], LoopConfig, int]:
    """What one recorded episode of ``env`` runs with: the environment's arguments, the loop's limits, and
    how many episodes may be in flight at once while recording."""
    if env == "arithmetic":
        return ({"tools": "python", "feedback_turns": 1, "difficulty": 0.6},
                LoopConfig(max_turns=4, max_tokens=3 * PER_TURN, max_tokens_per_turn=PER_TURN, temperature=1.0), 32)
    if env == "swe-local":  # each episode holds a container (1 CPU, 1 GiB at most): 8 in flight on 2 cores
        return ({"max_steps": SWE_TURNS},
                LoopConfig(max_turns=SWE_TURNS, max_tokens=SWE_TURNS * PER_TURN, max_tokens_per_turn=PER_TURN,
                           temperature=1.0), 8)
    raise SystemExit(f"--trace-env takes one of {', '.join(TRACE_ENVS)}, got {env!r}")


def task_ids(env: str, env_kwargs: dict[str, Any], episodes: int) -> list[str]:
    """``episodes`` task ids: distinct arithmetic problems, or the local SWE tasks round and round."""
    if env == "arithmetic":
        return ArithmeticTasks(seed=7, difficulty=env_kwargs["difficulty"]).ids(episodes)
    import sao.envs as E

    made = E.make(env, **env_kwargs)
    try:
        ids = list(made.unwrapped.task_ids())
    finally:
        made.close()
    return [ids[i % len(ids)] for i in range(episodes)]


async def record(base_url: str, model: str, tokenizer: Any, env: str, episodes: int) -> list[Request]:
    """``episodes`` real agent episodes of ``env`` against the engine at ``base_url``; every turn of every
    episode that ran becomes a :class:`Request`."""
    env_kwargs, loop, concurrency = episode_setup(env)
    ids = await asyncio.to_thread(task_ids, env, env_kwargs, episodes)
    runner = EpisodeRunner(env, Renderers(tokenizer), loop, env_kwargs)
    client = OpenAICompletionClient(base_url, model, max_connections=concurrency)
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int, task_id: str) -> list[Request]:
        async with gate:
            t = await runner(client, task_id=task_id, sample=i, seed=i)
        if t.status != "ok":
            return []
        return [Request(list(t.token_ids[:turn.prompt_len]), PER_TURN, 1000 * i + k) for k, turn in enumerate(t.turns)]

    try:
        per_episode = await asyncio.gather(*(one(i, t) for i, t in enumerate(ids)))
    finally:
        await client.aclose()
    return [r for rs in per_episode for r in rs]


def load(path: Path) -> list[Request]:
    return [Request(**json.loads(line)) for line in path.read_text().splitlines()]


def save(path: Path, requests: list[Request]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(asdict(r)) + "\n" for r in requests))
