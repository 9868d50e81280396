"""sao.rl.learner.torch_thread: one thread does a run's torch work, and the thread that made it stays on one
intra-op thread (so it never starts a second OpenMP team)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading

from sao.rl.learner.torch_thread import TorchThread


def test_every_call_runs_on_the_one_thread_with_its_intra_op_threads():
    thread = TorchThread(threads=1)

    async def go() -> set[int]:
        return {await thread.run(threading.get_ident) for _ in range(5)}

    try:
        idents = asyncio.run(go())
        assert len(idents) == 1 and threading.get_ident() not in idents
        assert thread.call(threading.get_ident) in idents
        import torch

        assert thread.call(torch.get_num_threads) == 1
    finally:
        thread.close()


def test_pin_caller_keeps_the_caller_on_one_thread_while_the_torch_thread_has_them_all():
    # in a fresh interpreter: pinning changes the calling thread's OpenMP setting for good
    code = textwrap.dedent("""
        import torch
        torch.set_num_threads(2)
        from sao.rl.learner.torch_thread import TorchThread, pin_caller
        n = pin_caller()
        thread = TorchThread(n)
        inside = thread.call(torch.get_num_threads)
        x = torch.randn(512, 512)
        thread.call(lambda: (x @ x).sum().item())  # the torch thread runs a parallel region
        print(n, torch.get_num_threads(), inside)
        thread.close()
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.split() == ["2", "1", "2"]
