"""The agent loop: one episode of a text environment against a token-in/token-out engine.

    prompt = render(first observation)
    repeat up to max_turns:
        completion = engine(prompt tokens)                     # action tokens, log-probs
        obs, reward, terminated, truncated, info = env.step(assistant message)
        if the episode ended: stop
        prompt += completion tokens + bridge(obs)             # observation tokens

Limits end an episode as *truncated* (``info["truncated_by"]`` says which): ``max_turns``, the
trajectory's ``max_tokens`` budget (or ``max_tokens_per_turn``), and the engine's context
(``max_model_len``), including an engine that reports a context overflow. Without a budget
(``max_tokens=None``) a turn may take whatever the context has left. A last answer cut by a
token limit (``finish_reason == "length"``) still goes to the environment, which grades it, and
the episode is recorded ``terminated=True`` (the environment ended it; its reward is final) and
``truncated=True`` (a limit cut the answer), which Gymnasium allows together. An episode a limit cut
before the environment ended it is finished by the environment when it offers
:class:`~sao.envs.capabilities.CutGrading` (SWE: its diff graded, "autosubmit") and recorded the
same way, ``terminated`` and ``truncated``, its reward final; otherwise it stays ``truncated`` alone.
The learner bootstraps only rows cut before the environment ended them (``truncated`` and not
``terminated``). ``info["exit_status"]`` names why each episode ended (:mod:`.exits`). An engine failure after
retries, or an exception from the environment, ends the episode as ``status="failed"`` with the
cause (``failure``: an ``env_error`` when the environment's own code raised or broke its return
contract, else an ``infra_error``; see :mod:`.env_calls`); it never crashes the run and never
loses the tokens sampled so far.

The sequence above, with its limits and records, is :mod:`.skeleton`'s, shared with the text loop; this
module is its :class:`TokenSampler`: how a turn is sampled and an observation shown, in tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import gymnasium as gym

from sao.envs import Message

from ..chat import ChatRenderer
from ..clients import CompletionClient, SamplingParams
from ..records import Completion, Trajectory, TurnRecord
from .skeleton import Clock, EpisodeArgs, LoopConfig, Reply, Sampled, run_turns

if TYPE_CHECKING:
    from typing_extensions import Unpack


class TokenSampler:
    """A :class:`~.skeleton.TurnSampler` on a token engine: the episode's one growing token sequence.

    Observations are rendered by the chat template (the first as the prompt, the later ones bridged
    onto the previous turn's exact tokens) and masked out; sampled tokens are kept with their log-probs.
    """

    def __init__(self, client: CompletionClient, renderer: ChatRenderer, max_model_len: int) -> None:
        self.client, self.renderer, self.max_model_len = client, renderer, max_model_len
        self.token_ids: list[int] = []
        self.action_mask: list[int] = []
        self.logprobs: list[float] = []
        self.history: list[Message] = []  # what the template renders (assistant turns as sampled text)
        self.last: Completion | None = None

    def observe(self, obs: list[Message]) -> None:
        if self.last is None:
            ids = self.renderer.prompt(obs)
        else:
            ids = self.renderer.bridge(list(self.history), self.last, obs)
            self.history.append({"role": "assistant", "content": self.last.text})
        self.history += obs
        self.token_ids += ids
        self.action_mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)

    def context_left(self) -> int:
        return self.max_model_len - len(self.token_ids)

    async def sample(self, messages: Sequence[Message], params: SamplingParams, clock: Clock) -> Reply:
        t_start = clock()
        completion = await self.client.complete(self.token_ids, params)
        record = TurnRecord(len(self.token_ids), len(completion.token_ids), completion.finish_reason,
                            completion.weight_version, t_start, clock(), completion.attempts,
                            policy_versions=completion.policy_versions, token_versions=completion.token_versions,
                            old_kv=completion.old_kv)
        self.last = completion
        self.token_ids += completion.token_ids
        self.action_mask += [1] * len(completion.token_ids)
        self.logprobs += completion.logprobs
        return Reply(completion.text, completion.finish_reason, len(completion.token_ids), record)

    def sampled(self) -> Sampled:
        return Sampled(tuple(self.token_ids), tuple(self.action_mask), tuple(self.logprobs), mode="tokens")


async def run_episode(env: gym.Env, client: CompletionClient, renderer: ChatRenderer, cfg: LoopConfig,
                      **episode: Unpack[EpisodeArgs]) -> Trajectory:
    """Run one episode to its end; always returns a :class:`Trajectory` (failures included). ``episode``:
    ``env_name``, ``task_id`` and optionally ``sample``, ``seed``, ``episode_id`` (:class:`~.skeleton.EpisodeArgs`)."""
    return await run_turns(env, TokenSampler(client, renderer, cfg.max_model_len), cfg, **episode)
