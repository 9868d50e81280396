"""Several managed vLLM replicas of one model, and the routing client that spreads episodes over them.

:func:`open_replicas` starts ``n`` managed engines (:class:`~sao.agents.engine.server.VLLMServer`: each on
a free port, in its own process group), one after the other from the calling thread (the SIGTERM
guard wants the main thread); every one is stopped when the block exits, whatever happened, and
those already started are stopped when a later one fails to start. On a CPU-only machine each gets
its own share of the cores, and a lone replica on a small machine all of them (:func:`cpu_share`).

:func:`routed` is the :class:`~sao.agents.routing.client.RoutingClient` over such endpoints for an
evaluation: one completion client and one ``/metrics`` reader per replica, and for each managed
replica an :class:`~sao.agents.engine.watch.EngineWatch` (a dead one is restarted up to
``max_restarts`` times; the requests it cut go to the others meanwhile).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

from ..clients import Endpoint, OpenAICompletionClient
from ..clients.endpoint import served_context
from ..routing import RoutedReplica, RoutingClient, make_router
from .control import EngineClient
from .speculative import SpeculativeConfig
from .watch import watching


@contextlib.contextmanager
def open_replicas(model: str, n: int, *, max_model_len: int | None = None, log_dir: Path | None = None,
                  startup_timeout_s: float = 600.0, speculative: SpeculativeConfig | None = None,
                  tokenizer: str | None = None) -> Iterator[list[Endpoint]]:
    """``n`` managed endpoints of ``model`` (module doc); logs in ``log_dir/vllm-{i}.log``. ``max_model_len``
    None: each takes the model's own context (as :func:`~sao.agents.clients.endpoint.open_endpoint`)."""
    if n < 1:
        raise ValueError(f"replicas must be >= 1, got {n}")
    from ..models.prepare import ensure_model
    from .server import VLLMServer, VLLMServerConfig

    path = ensure_model(model)
    with contextlib.ExitStack() as stack:
        endpoints = []
        for i in range(n):
            config = VLLMServerConfig(model=path, served_model_name=model, max_model_len=max_model_len,
                                      log_path=log_dir / f"vllm-{i}.log" if log_dir else None,
                                      startup_timeout_s=startup_timeout_s,
                                      speculative=speculative or SpeculativeConfig(), env=cpu_share(i, n))
            server = stack.enter_context(VLLMServer(config))
            context = max_model_len or served_context(server.base_url, model, path)
            endpoints.append(Endpoint(server.base_url, model, tokenizer or path, context, None, managed=True,
                                      server=server))
        yield endpoints


SMALL_MACHINE_CORES = 4  # at most this many cores: one replica computes on all of them (cpu_share)


def cpu_share(i: int, n: int, *, beside_learner: bool = False) -> dict[str, str]:
    """On a CPU-only machine, the cores of this process that replica ``i`` of ``n`` computes on
    (``VLLM_CPU_OMP_THREADS_BIND``); left to vLLM when there is a GPU, when the variable is already
    set, or when there are fewer cores than replicas.

    - Several replicas: disjoint equal shares. vLLM's own choice binds every replica to the same
      cores (one core and one reserved on 2 cores), so they would share one.
    - One replica on a small machine (at most :data:`SMALL_MACHINE_CORES` cores): all of them. vLLM
      alone reserves a core for its front-end, half of a 2-core machine; on a 2-core Xeon
      (2026-12-03, bundled model, fp32, ``benchmarks/engine_cores.py``) decoding on both ran at 95
      tokens/s against 61-83 at 8 concurrent requests, and 233 against 142-172 at 64. Not when
      ``beside_learner``: a learner that trains while the engine generates (sao-train's scheduled
      rollout modes) keeps the core vLLM leaves. On a larger machine one reserved core is little,
      and vLLM's choice stands."""
    from .server import _cuda_present

    cores = sorted(os.sched_getaffinity(0))
    if _cuda_present() or "VLLM_CPU_OMP_THREADS_BIND" in os.environ or len(cores) < n:
        return {}
    if n == 1 and (beside_learner or len(cores) > SMALL_MACHINE_CORES):
        return {}
    share = len(cores) // n  # one replica: all of them
    return {"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, cores[i * share:(i + 1) * share]))}


@contextlib.asynccontextmanager
async def routed(endpoints: Sequence[Endpoint], router: str, *, max_restarts: int,
                 **client_args: Any) -> AsyncIterator[RoutingClient]:
    """A :class:`RoutingClient` over ``endpoints`` with router ``router`` (module doc); ``client_args``
    go to each replica's :class:`~sao.agents.clients.completions.OpenAICompletionClient`."""
    async with contextlib.AsyncExitStack() as stack:
        replicas = []
        for e in endpoints:
            client = OpenAICompletionClient(e.base_url, e.model, **client_args)
            stack.push_async_callback(client.aclose)
            control = await stack.enter_async_context(EngineClient(e.base_url.removesuffix("/v1"), api_key=e.api_key))
            watch = await stack.enter_async_context(watching(e.server, max_restarts))
            replicas.append(RoutedReplica(client, control, watch))
        routing = RoutingClient(replicas, make_router(router))
        stack.push_async_callback(routing.aclose)
        yield routing
