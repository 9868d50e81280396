"""The one thread that does a training process's torch work.

Why one (measured on 2 cores, issue 13): PyTorch's CPU kernels run their intra-op parallelism on
OpenMP, and the OpenMP runtime of the torch wheels (GNU libgomp) keeps a team of worker threads per
thread that starts a parallel region. Once two threads of a process have done so (the main thread
loading the model, say, and the learner's thread), the process has more OpenMP threads than cores,
libgomp stops letting idle workers spin and puts them to sleep after every region, and each of the
thousands of small elementwise kernels of an update pays a wake-up: a SiLU-times-input on a
[256, 1536] tensor took 0.14 ms with one OpenMP master and 0.33-0.41 ms after a second one had
run, on either thread; the SAO update of 8 x (40 + 90) tokens took 16-19 s on a worker thread after
the main thread had run torch, 11-13 s on the main thread alone. Matrix products (MKL) keep their
speed; everything around them does not.

So in ``sao-train`` every torch call (building the models, the updates, checkpoints, the weight
sync's save and probes) runs on :class:`TorchThread`, and the thread that made it is pinned to one
intra-op thread first (:func:`pin_caller`), so that whatever small tensor work it still does (collating
a batch) never starts a second team. One thread also means one glibc malloc arena for the training
tensors (:mod:`sao.rl.learner.memory`).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import torch

T = TypeVar("T")


def pin_caller() -> int:
    """Pin the calling thread to one intra-op thread, before it has started an OpenMP team of its own
    (module doc); returns the intra-op thread count it had, for the torch thread to use. Reading the
    count first matters: torch settles a thread's OpenMP setting at its first query, from the
    process-wide count, which the torch thread will set back to the full count."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    return threads


class TorchThread:
    """A dedicated thread for torch work, on ``threads`` intra-op threads (default: the caller's count
    at construction). ``await run(fn, ...)`` from asyncio; ``call(fn, ...)`` blocks. :meth:`close`
    waits for the work in hand."""

    def __init__(self, threads: int | None = None) -> None:
        self.threads = threads or torch.get_num_threads()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sao-torch",
                                        initializer=torch.set_num_threads, initargs=(self.threads,))

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return self._pool.submit(fn, *args, **kwargs).result()

    def close(self, wait: bool = True) -> None:
        """Accept no more work; ``wait`` for the work in hand. ``wait=False`` when the run is being
        interrupted (SIGTERM, Ctrl-C): the engines are stopped at once instead of after an update that
        may take a minute, and the process then exits without joining the thread."""
        self._pool.shutdown(wait=wait, cancel_futures=not wait)
