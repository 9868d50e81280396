"""The learner's input record: a right-padded batch of trajectories, and its split into micro-batches.

Alignment convention (one rule for the whole learner): every ``[B, T]`` tensor is indexed by TOKEN.
Column ``t`` holds facts about token ``t``: ``action_mask[:, t]`` says whether token ``t`` was sampled by
the policy, ``rollout_logprobs[:, t]`` is the engine's log-prob of token ``t``, advantages/returns at
``t`` belong to the action of emitting token ``t``. This is the layout of ``Trajectory`` unchanged. The
shift to next-token logits happens in exactly one place, :func:`sao.rl.learner.learner.token_logprobs`: the
log-prob of token ``t`` comes from the logits at position ``t - 1`` (and likewise the value of the state
before token ``t`` comes from the hidden state at ``t - 1``, :meth:`sao.rl.learner.value_model.ValueModel.token_values`).
Token 0 has no prefix, so it can never be an action token; :func:`collate` rejects trajectories that
say otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

import torch
from torch import Tensor

from sao.agents import Trajectory

_PER_TOKEN = ("input_ids", "attention_mask", "action_mask", "rollout_logprobs", "advantages", "returns", "old_values")
_PER_ROW = ("rewards", "truncated", "group_ids")


@dataclass(frozen=True)
class Batch:
    """B trajectories, right-padded to T tokens. All ``[B, T]`` tensors are token-aligned (module doc).

    input_ids:        [B, T] long, padded with ``pad_id``.
    attention_mask:   [B, T] long, 1 at real tokens, 0 at padding (a prefix of ones per row).
    action_mask:      [B, T] long, 1 at tokens to train on (sampled by the policy), 0 at prompt,
                      observation and padding tokens. Column 0 is always 0.
    rollout_logprobs: [B, T] float, the engine's log-prob of token t at action tokens, 0.0 elsewhere.
    rewards:          [B] float, the trajectory's reward (placed at its last action token by the learner).
    truncated:        [B] bool, the episode was cut by a limit before the environment ended it: its
                      return is incomplete, and the learner bootstraps these rows. A trajectory cut by
                      a limit AFTER the environment ended and graded it (``terminated`` and
                      ``truncated``, e.g. an answer cut by the token budget) is not one of them.
    advantages, returns, old_values: optional [B, T] float, filled by the learner (``dataclasses.replace``).
    group_ids:        optional [B] long, rows with the same id are samples of one draw of a prompt
                      (GRPO groups).
    """

    input_ids: Tensor
    attention_mask: Tensor
    action_mask: Tensor
    rollout_logprobs: Tensor
    rewards: Tensor
    truncated: Tensor
    advantages: Tensor | None = None
    returns: Tensor | None = None
    old_values: Tensor | None = None
    group_ids: Tensor | None = None

    @property
    def size(self) -> int:
        return self.input_ids.shape[0]

    @property
    def num_action_tokens(self) -> int:
        return int(self.action_mask.sum())

    def to(self, device: torch.device | str) -> Batch:
        """The same batch with every tensor on ``device``."""
        return replace(self, **{f.name: getattr(self, f.name).to(device) for f in fields(self)
                                if getattr(self, f.name) is not None})

    def sorted_by_length(self) -> Batch:
        """The same rows, shortest first, so that :func:`micro_batches` of consecutive rows carry little
        padding. Every learner quantity is per row or a sum over rows, so the order changes nothing
        but the padding (and float summation order)."""
        order = torch.argsort(self.attention_mask.sum(-1), stable=True)
        if bool((order == torch.arange(self.size)).all()):
            return self
        return self.select(order)

    def select(self, index: Tensor) -> Batch:
        """The rows at ``index`` (a 1-D long tensor), in that order, at the batch's full width."""
        return replace(self, **{f.name: getattr(self, f.name)[index.to(self.input_ids.device)] for f in fields(self)
                                if getattr(self, f.name) is not None})

    def rows(self, start: int, stop: int) -> Batch:
        """Rows ``start:stop``, with padding columns that no kept row uses trimmed away."""
        width = max(int(self.attention_mask[start:stop].sum(-1).max()), 1) if stop > start else 1
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None:
                out[f.name] = None
            elif f.name in _PER_TOKEN:
                out[f.name] = value[start:stop, :width]
            else:
                out[f.name] = value[start:stop]
        return Batch(**out)


def collate(trajectories: Sequence[Trajectory], pad_id: int) -> Batch:
    """Stack trajectories into a right-padded :class:`Batch` (CPU tensors, order kept).

    ``group_ids`` numbers the distinct draws of a prompt in order of first appearance, so the samples
    of one draw share an id: a draw is ``(env, task_id, rollout.prompt_index)``, the prompt's position
    in the run's task stream, which every rollout source stamps (a finite dataset re-permuted per
    epoch can draw the same task twice in one batch: two groups, not one). Trajectories without a
    ``prompt_index`` (built by hand) group by ``(env, task_id)``. A trajectory with segments (an external
    agent's episode whose calls did not extend each other, :class:`~sao.agents.records.Segment`) becomes one
    row per segment, each with the trajectory's reward, truncation and group. Raises ValueError on an empty list
    or on a trajectory whose first token is marked as an action (a token without a prefix has no
    log-prob to train), and refuses text-mode trajectories (``Trajectory.trainable`` false).
    """
    if not trajectories:
        raise ValueError("collate needs at least one trajectory")
    text = [tr.episode_id for tr in trajectories if not tr.trainable]
    if text:
        raise ValueError(f"{len(text)} trajectory(ies) ({', '.join(map(repr, text[:3]))}) were recorded in text mode "
                         "(a chat-only endpoint: sao-eval --endpoint-mode chat, or an external agent's capture proxy in "
                         "front of a hosted endpoint): they hold text turns, no sampled "
                         "token ids or log-probs, and cannot be trained on; record them with a token endpoint (vLLM)")
    rows = [(tr, start, end) for tr in trajectories for start, end in _spans(tr)]
    b, t = len(rows), max(max(end - start for _, start, end in rows), 1)
    input_ids = torch.full((b, t), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((b, t), dtype=torch.long)
    action_mask = torch.zeros((b, t), dtype=torch.long)
    logprobs = torch.zeros((b, t), dtype=torch.float32)
    groups: dict[tuple[str, str, int | None], int] = {}
    for i, (tr, start, end) in enumerate(rows):
        n = end - start
        if n and tr.action_mask[start]:
            raise ValueError(f"trajectory {tr.episode_id!r}: token {start} (the start of a row) is marked as an action, "
                             "but it has no prefix to condition on; a trajectory (and each of its segments) must start "
                             "with at least one prompt token")
        input_ids[i, :n] = torch.tensor(tr.token_ids[start:end], dtype=torch.long)
        attention_mask[i, :n] = 1
        action_mask[i, :n] = torch.tensor(tr.action_mask[start:end], dtype=torch.long)
        logprobs[i, :n] = torch.tensor(tr.logprobs[start:end], dtype=torch.float32)
        groups.setdefault(_draw(tr), len(groups))
    return Batch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        action_mask=action_mask,
        rollout_logprobs=logprobs * action_mask,
        rewards=torch.tensor([tr.reward for tr, _, _ in rows], dtype=torch.float32),
        truncated=torch.tensor([tr.truncated and not tr.terminated for tr, _, _ in rows], dtype=torch.bool),
        group_ids=torch.tensor([groups[_draw(tr)] for tr, _, _ in rows], dtype=torch.long),
    )


def _spans(tr: Trajectory) -> list[tuple[int, int]]:
    """The rows a trajectory trains as: the whole of it, or one per :class:`~sao.agents.records.Segment` of
    an episode whose calls did not extend each other (the capture proxy's): each row is one sequence the
    engine saw, ending in its own sampled tokens, and carries the episode's reward (step-wise, as SkyRL and
    slime train such episodes)."""
    return [(s.start, s.end) for s in tr.segments] or [(0, len(tr.token_ids))]


def _draw(tr: Trajectory) -> tuple[str, str, int | None]:
    """What identifies one draw of a prompt: its task and its index in the run's task stream."""
    return tr.env, tr.task_id, tr.rollout.prompt_index if tr.rollout is not None else None


def micro_batches(batch: Batch, token_budget: int | None, *, packed: bool = False) -> list[Batch]:
    """Split ``batch`` into consecutive row ranges of at most ``token_budget`` tokens each, and at
    least one row each, so a row longer than the budget travels alone. Tokens are counted as the
    forward pass will run them: padded (rows x the range's longest row), or with ``packed`` (the
    learner lays the rows end to end, :mod:`sao.rl.learner.packing`) the rows' real tokens. Order is kept;
    each micro-batch is trimmed to its own longest row. ``None``: one micro-batch. A batch without
    rows (a data-parallel rank's empty share) has none.
    """
    if token_budget is not None and token_budget < 1:
        raise ValueError(f"token_budget must be >= 1, got {token_budget}")
    if batch.size == 0:
        return []
    if token_budget is None:
        return [batch.rows(0, batch.size)]
    lengths = batch.attention_mask.sum(-1).clamp(min=1).tolist()
    out, start, longest, total = [], 0, 0, 0
    for i, n in enumerate(lengths):
        widest, cost = max(longest, n), total + n
        if i > start and (cost if packed else widest * (i - start + 1)) > token_budget:
            out.append(batch.rows(start, i))
            start, widest, cost = i, n, n
        longest, total = widest, cost
    out.append(batch.rows(start, len(lengths)))
    return out
