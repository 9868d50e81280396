"""SIGTERM and Ctrl-C for the command-line programs: both unwind the run the same way.

``sao-eval`` and ``sao-train`` run inside :func:`sigterm_as_interrupt`: the first SIGTERM raises
:class:`Terminated` (a ``KeyboardInterrupt``) in the main thread, wherever it is -- in the event loop,
or blocked in a managed engine's start -- so that ``with`` blocks stop the managed engines and close the
files, as for Ctrl-C. Later SIGTERMs are ignored, so that they cannot cut that clean-up short. The
program then says how to continue and exits :func:`interrupt_exit_code` (143, or 130 for Ctrl-C).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

SIGTERM_EXIT = 128 + signal.SIGTERM  # 143, as the shell reports a process ended by SIGTERM
SIGINT_EXIT = 128 + signal.SIGINT  # 130


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: unwound like Ctrl-C (module doc)."""


def interrupt_exit_code(exc: KeyboardInterrupt) -> int:
    return SIGTERM_EXIT if isinstance(exc, Terminated) else SIGINT_EXIT


def interrupt_name(exc: KeyboardInterrupt) -> str:
    return "terminated (SIGTERM)" if isinstance(exc, Terminated) else "interrupted"


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """While active, the first SIGTERM raises :class:`Terminated` (later ones are ignored); the previous
    handler comes back afterwards. Only the main thread can do this; elsewhere SIGTERM is left as it is."""
    def handler(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Terminated()

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def quiet_interrupts() -> None:
    """Call from the coroutine that ``asyncio.run`` runs. The signal's exception is raised wherever the
    main thread is; when that is inside a task other than the main one, asyncio would report it again at
    shutdown ("unhandled exception during asyncio.run() shutdown", with a traceback) although the program
    reports the interruption itself. Such reports are dropped; every other one is made as before."""
    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if isinstance(context.get("exception"), KeyboardInterrupt):
            return
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)


def exit_now(code: int) -> None:
    """Exit with ``code``, without joining a worker thread that is still busy (a learner's update that
    Python would wait for at exit, a minute or more): call it once everything else is stopped and closed."""
    busy = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon and t.is_alive()]
    if not busy:
        raise SystemExit(code)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
