"""Which sampling settings the capture proxy forwards for an agent's request: the sampling rule.

An unchanged agent picks its own settings (``temperature=0.7``, a ``top_p``, penalties), and vLLM fills
those it omits from the model's ``generation_config``. The learner assumes the run's temperature and the
plain distribution (no top-p, top-k, min-p or penalties), and vLLM reports raw log-probs, so data sampled
otherwise is off-policy while ``rollout/logprob_gap`` stays near 0. Hence two rules (a
:class:`SamplingRule` each):

* :class:`PinnedSampling` (training): temperature the run's, ``top_p=1``, ``top_k=-1``, ``min_p=0``, no
  presence, frequency or repetition penalty, whatever the agent asked; it records which of the agent's
  settings it overrode (``pinned``). The agent's ``max_tokens`` (bounded by the run's), ``stop`` and
  ``seed`` pass: they end or fix a sample without changing the distribution it is drawn from.
* :class:`AgentSampling` (evaluation): the agent's settings pass through: ``temperature``, ``top_p``,
  ``max_tokens``/``max_completion_tokens``, ``stop``, ``seed``, and ``top_k``, ``min_p`` and the penalties
  when it sends them (vLLM's extra body fields). Omitted ones take OpenAI's defaults (temperature and top_p
  1) or stay unsent.

A setting of the wrong type is a :class:`~.requests.BadChatRequest` (HTTP 400).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from ..clients.completions import SamplingParams
from .requests import BadChatRequest

__all__ = ["AgentSampling", "PinnedSampling", "SamplingChoice", "SamplingRule", "requested_sampling"]

SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                   "repetition_penalty", "max_tokens", "max_completion_tokens", "stop", "seed")
# the settings that shape the distribution, and their neutral values (what the learner assumes)
NEUTRAL = {"top_p": 1.0, "top_k": -1, "min_p": 0.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
           "repetition_penalty": 1.0}


@dataclass(frozen=True)
class SamplingChoice:
    """What one request is forwarded with (``params``), and which of the agent's settings were overridden
    (``pinned``: their names, in :data:`SAMPLING_FIELDS` order; empty when none was)."""

    params: SamplingParams
    pinned: tuple[str, ...] = ()


class SamplingRule(Protocol):
    """Turns the sampling settings an agent asked for into those forwarded."""

    trains: ClassVar[bool]  # whether its calls are training data (the proxy then refuses an upstream without token ids)

    def choose(self, requested: dict[str, Any]) -> SamplingChoice: ...


def requested_sampling(body: dict[str, Any]) -> dict[str, Any]:
    """The sampling fields an agent's request body carries (null ones left out), checked for type."""
    out = {k: body[k] for k in SAMPLING_FIELDS if body.get(k) is not None}
    for key, value in out.items():
        if key == "stop":
            if not isinstance(value, str) and not (isinstance(value, list) and all(isinstance(s, str) for s in value)):
                raise BadChatRequest("'stop' must be a string or a list of strings")
        elif key in ("top_k", "max_tokens", "max_completion_tokens", "seed"):
            if isinstance(value, bool) or not isinstance(value, int):
                raise BadChatRequest(f"'{key}' must be an integer, not {value!r}")
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            raise BadChatRequest(f"'{key}' must be a number, not {value!r}")
    if out.get("temperature", 0) < 0:
        raise BadChatRequest(f"'temperature' must be >= 0, not {out['temperature']}")
    return out


def _max_tokens(requested: dict[str, Any]) -> int | None:
    value = requested.get("max_completion_tokens", requested.get("max_tokens"))
    if value is not None and value < 1:
        raise BadChatRequest(f"'max_tokens' must be >= 1, not {value}")
    return value


def _stop(requested: dict[str, Any]) -> tuple[str, ...]:
    stop = requested.get("stop", ())
    return (stop,) if isinstance(stop, str) else tuple(stop)


@dataclass(frozen=True)
class PinnedSampling:
    """Training's rule (module doc): the run's ``temperature`` and the neutral settings, whatever the agent
    asked. ``max_tokens``: the run's bound on one call's answer (None: the agent's, or the context's)."""

    temperature: float = 1.0
    max_tokens: int | None = None
    trains: ClassVar[bool] = True

    def choose(self, requested: dict[str, Any]) -> SamplingChoice:
        forced = {"temperature": self.temperature, **NEUTRAL}
        pinned = tuple(k for k in SAMPLING_FIELDS if k in forced and k in requested and requested[k] != forced[k])
        asked = _max_tokens(requested)
        bound = asked if self.max_tokens is None else min(asked or self.max_tokens, self.max_tokens)
        params = SamplingParams(max_tokens=bound, temperature=self.temperature, top_p=1.0,
                                seed=requested.get("seed"), stop=_stop(requested), top_k=-1, min_p=0.0,
                                presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0)
        return SamplingChoice(params, pinned)


@dataclass(frozen=True)
class AgentSampling:
    """Evaluation's rule (module doc): the agent's own settings. ``max_tokens``: used when the agent sends
    none (None: the context bounds the answer)."""

    max_tokens: int | None = None
    trains: ClassVar[bool] = False

    def choose(self, requested: dict[str, Any]) -> SamplingChoice:
        asked = _max_tokens(requested)
        params = SamplingParams(max_tokens=asked if asked is not None else self.max_tokens,
                                temperature=float(requested.get("temperature", 1.0)),
                                top_p=float(requested.get("top_p", 1.0)), seed=requested.get("seed"),
                                stop=_stop(requested), top_k=requested.get("top_k"), min_p=requested.get("min_p"),
                                presence_penalty=requested.get("presence_penalty"),
                                frequency_penalty=requested.get("frequency_penalty"),
                                repetition_penalty=requested.get("repetition_penalty"))
        return SamplingChoice(params)
