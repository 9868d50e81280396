"""The engines' share of a training step's metrics: prefix-cache hits and speculative acceptance.

Each step is one :class:`~sao.agents.engine.meter.EngineMeter` window over every replica's
``/metrics`` counters (from the end of the previous step's rollout to the end of this one's, so the
windows tile the run), summed over the replicas. Keys, on every step at which at least one replica
was read:

* ``rollout/prefix_cache_hit_rate``: prompt tokens found in the prefix cache / prompt tokens looked
  up (0.0 when none was looked up; ``rollout/prefix_cache_queries`` then says 0);
* ``engine/metrics_replicas``: how many replicas were read (fewer than the run has: some read failed);
* with speculative decoding on (``engine.speculative=suffix``): ``engine/spec_acceptance`` (accepted /
  proposed draft tokens), ``engine/spec_accepted_per_draft`` and ``engine/spec_draft_tokens``; 0.0
  when nothing was drafted (the draft count says so). With it off these keys are not logged: no
  acceptance exists, and a logged 0 would read as a failed speculator.

A step at which no replica could be read logs none of them; the meter has logged why, and the step
goes on.
"""

from __future__ import annotations

from sao.agents.engine import EngineMeter, EngineMetrics


def engine_step_metrics(used: EngineMetrics | None, *, speculative: bool, replicas: int) -> dict[str, float]:
    """The keys of the module doc from one window's growth ``used`` (None: nothing read)."""
    if used is None:
        return {}
    out = {"rollout/prefix_cache_hit_rate": used.prefix_cache_hit_rate or 0.0,
           "rollout/prefix_cache_queries": float(used.prefix_cache_queries),
           "engine/metrics_replicas": float(replicas)}
    if speculative:
        out |= {"engine/spec_acceptance": used.spec_acceptance or 0.0,
                "engine/spec_accepted_per_draft": used.spec_accepted_per_draft or 0.0,
                "engine/spec_draft_tokens": float(used.spec_draft_tokens)}
    return out


class StepEngineMetrics:
    """One meter window per training step (module doc). ``start`` once before the first step."""

    def __init__(self, meter: EngineMeter, *, speculative: bool):
        self.meter, self.speculative = meter, speculative

    async def start(self) -> None:
        await self.meter.start()

    async def step(self) -> dict[str, float]:
        used = await self.meter.window()
        return engine_step_metrics(used, speculative=self.speculative, replicas=self.meter.read)
