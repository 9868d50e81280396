"""How the suite shares the machine between pytest-xdist workers (``scripts/test``: ``-n 2 --dist
loadgroup``). Alone the suite kept less than one of the 2 cores busy on average (83% of a core over
72 minutes): engine start-ups, container builds and single-threaded Python leave the other idle.

- Groups. Every test of a module that touches Docker runs on one worker, one test at a time: one of them
  restarts the daemon, and several count every container under a label. Every other real-engine or
  slow test runs on the other worker, one at a time: two trainers beside their engines at once would
  crowd the 24 GiB. The quick tests fill in on whichever worker is free.
- Memory. One vLLM engine holds about 4.4 GB here (front-end, engine core, worker), and each worker
  keeps the session's shared one: a test that starts its own engines and trainer on each worker at once
  left 3.5 GB of the 24 GiB free (2026-12-03). So the tests that start an engine or train the real
  model take one machine-wide lock (:func:`machine_lock`) around their whole run: every engine test,
  and the Docker tests that use an engine. The Docker tests that only grade or run containers, and the
  quick tests, go on beside them.
- Cores. Each worker computes on its own share of the cores (``sched_setaffinity``, which the engines,
  trainers and tools it starts inherit), and vLLM's OpenMP threads are bound inside that share
  (``VLLM_CPU_OMP_THREADS_BIND``). Unpinned, two workers' OpenMP threads on 2 cores wait on each
  other, and every vLLM picks the same core by itself (sao.agents.engine.fleet.cpu_share). Once every other
  worker has finished, the one left takes all the cores for its next tests that take the machine
  (:func:`widen_when_alone`): the engine worker's last tests otherwise ran on one core of two, the other
  idle.
- Timeline. Each worker records when it finished, how long it held the machine lock and waited for
  it (its core idle meanwhile), and when it took all the cores; ``scripts/test``'s summary prints it
  (:func:`timeline`), to say where CI's time goes.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

DOCKER_GROUP, ENGINE_GROUP = "docker", "engines"
ENGINE_FIXTURES = frozenset({"vllm_server", "restore_engine", "smollm2_dir", "engine_model_dir"})


def worker_cores(worker: str, workers: int, cores: list[int]) -> list[int]:
    """Worker ``gwN``'s share of ``cores``: disjoint equal slices, the remainder to the last worker;
    all of them when there are fewer cores than workers (then nothing is pinned)."""
    index = int(worker.removeprefix("gw"))
    if workers < 1 or index >= workers:
        raise ValueError(f"worker {worker!r} of {workers}")
    if len(cores) < workers:
        return list(cores)
    share = len(cores) // workers
    return list(cores[index * share:]) if index == workers - 1 else list(cores[index * share:(index + 1) * share])


def pin_this_worker() -> list[int] | None:
    """Pin this xdist worker to its share of the cores (module doc); None outside xdist or with
    ``SAO_TEST_PIN=0``."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker or os.environ.get("SAO_TEST_PIN", "1") == "0" or not hasattr(os, "sched_setaffinity"):
        return None
    cores = sorted(os.sched_getaffinity(0))
    mine = worker_cores(worker, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")), cores)
    if mine == cores:
        return None
    os.sched_setaffinity(0, mine)
    if "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, mine))
        _pinned["bind"] = True
    _pinned["cores"] = cores
    return mine


_pinned: dict[str, object] = {}  # this worker's cores before pinning, and whether it set vLLM's binding
_worker_log: dict[str, float] = {"started": time.monotonic(), "machine_s": 0.0, "waited_s": 0.0, "tests": 0.0}


def _timeline_dir(run: str | None = None) -> Path | None:
    """Where the workers of run ``run`` (default: this worker's) record their figures."""
    run = run or os.environ.get("PYTEST_XDIST_TESTRUNUID")
    return Path(tempfile.gettempdir()) / f"sao-tests-{run}" if run else None


def count_test() -> None:
    _worker_log["tests"] += 1


def record_finish() -> None:
    """This worker is done: say so (for :func:`widen_when_alone`) with its figures (for :func:`timeline`)."""
    folder, worker = _timeline_dir(), os.environ.get("PYTEST_XDIST_WORKER")
    if folder is None or not worker:
        return
    folder.mkdir(exist_ok=True)
    figures = {"worker": worker, "finished_s": time.monotonic() - _worker_log["started"], "tests": int(_worker_log["tests"]),
               "machine_s": _worker_log["machine_s"], "waited_s": _worker_log["waited_s"],
               "all_cores_from_s": _worker_log.get("widened")}
    (folder / f"{worker}.json").write_text(json.dumps(figures))


def widen_when_alone() -> list[int] | None:
    """When this pinned worker is the run's last, give it all the cores it was pinned from: the engines,
    trainers and tools it starts from now on inherit them (and vLLM binds its threads as
    sao.agents.engine.fleet.cpu_share says, once the worker's own binding is gone); torch's threads in this
    process follow. Returns the cores when it widened now, else None."""
    cores, folder = _pinned.get("cores"), _timeline_dir()
    if not cores or folder is None or "widened" in _worker_log or os.environ.get("SAO_TEST_WIDEN", "1") == "0":
        return None
    others = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) - 1
    done = [p for p in folder.glob("gw*.json") if p.stem != os.environ.get("PYTEST_XDIST_WORKER")] \
        if folder.is_dir() else []
    if len(done) < others:
        return None
    os.sched_setaffinity(0, cores)  # type: ignore[arg-type]
    if _pinned.get("bind"):
        os.environ.pop("VLLM_CPU_OMP_THREADS_BIND", None)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(len(cores))  # type: ignore[arg-type]
    _worker_log["widened"] = time.monotonic() - _worker_log["started"]
    return list(cores)  # type: ignore[call-overload]


def timeline(run: str | None) -> list[str]:
    """The workers' figures (:func:`record_finish`), one line each, and the folder removed."""
    folder = _timeline_dir(run) if run else None
    if folder is None:
        return []
    rows = [json.loads(p.read_text()) for p in sorted(folder.glob("gw*.json"))] if folder.is_dir() else []
    shutil.rmtree(folder, ignore_errors=True)
    return [f"worker {r['worker']}: {r['tests']} tests, finished at {r['finished_s']:.0f} s, machine lock held "
            f"{r['machine_s']:.0f} s, waited for it {r['waited_s']:.0f} s"
            + (f", all cores from {r['all_cores_from_s']:.0f} s" if r.get("all_cores_from_s") is not None else "")
            for r in rows]


def _touches_docker(path: Path, seen: dict[Path, bool]) -> bool:
    if path not in seen:
        seen[path] = "docker" in path.read_text(encoding="utf-8", errors="replace").lower()
    return seen[path]


def assign_groups(items: list[pytest.Item]) -> None:
    """Mark each item's xdist group (module doc); items that already name one keep it."""
    seen: dict[Path, bool] = {}
    for item in items:
        if item.get_closest_marker("xdist_group"):
            continue
        if _touches_docker(Path(item.path), seen):
            item.add_marker(pytest.mark.xdist_group(DOCKER_GROUP))
        elif item.get_closest_marker("vllm") or item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.xdist_group(ENGINE_GROUP))


SESSION_ENGINE = "vllm_server"  # session-scoped: each worker that uses it keeps an engine to the end of the run


def keep_alone_tests_alone(items: list[pytest.Item]) -> None:
    """Skip the tests marked ``alone`` (they need the machine to themselves, e.g. the real 2-node Ray
    run: 16.3 GiB at its peak) when this run also selects a test that uses the session engine, which
    each worker keeps to the end (about 4.4 GB each). ``scripts/test`` runs them in a pytest call of
    their own after the suite; ``pytest -k ray`` alone runs them too."""
    alone = [i for i in items if i.get_closest_marker("alone")]
    shared = [i.nodeid for i in items if i.get_closest_marker("alone") is None
              and SESSION_ENGINE in getattr(i, "fixturenames", ())]
    if alone and shared:
        skip = pytest.mark.skip(reason=f"needs the machine to itself, and this run also keeps session engines "
                                       f"(e.g. {shared[0]}); run it in a pytest call of its own "
                                       "(scripts/test does, after the suite)")
        for item in alone:
            item.add_marker(skip)


def check_grouped(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``--dist loadgroup``, fail the worker's collection if xdist did not put a group into the
    node ids (it renames ``item._nodeid``, which pytest 9 no longer reads): the groups are what keep the
    Docker daemon's restart away from the other Docker tests."""
    if not (os.environ.get("PYTEST_XDIST_WORKER") and config.getoption("dist", None) == "loadgroup"):
        return
    lost = [i.nodeid for i in items if i.get_closest_marker("xdist_group") and "@" not in i.nodeid]
    if lost:
        raise pytest.UsageError(f"pytest-xdist did not group {len(lost)} tests (e.g. {lost[0]}) on pytest "
                                f"{pytest.__version__}: its --dist loadgroup needs pytest < 9 here")


def group_of(item: pytest.Item) -> str | None:
    mark = item.get_closest_marker("xdist_group")
    if mark is None:
        return None
    return str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))


def needs_the_machine(item: pytest.Item) -> bool:
    """Whether ``item`` runs under :func:`machine_lock` (module doc): every engine-group test, and a
    Docker-group test marked ``vllm`` or using the real model's fixtures."""
    group = group_of(item)
    if group == ENGINE_GROUP:
        return True
    return group == DOCKER_GROUP and bool(item.get_closest_marker("vllm")
                                          or ENGINE_FIXTURES & set(getattr(item, "fixturenames", ())))


@contextlib.contextmanager
def machine_lock() -> Iterator[None]:
    """Held by one test of this run at a time across its xdist workers; a no-op outside xdist."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not run:
        yield
        return
    with open(Path(tempfile.gettempdir()) / f"sao-tests-{run}.lock", "a+") as fh:
        asked = time.monotonic()
        fcntl.flock(fh, fcntl.LOCK_EX)
        held = time.monotonic()
        _worker_log["waited_s"] += held - asked
        try:
            widen_when_alone()
            yield
        finally:
            _worker_log["machine_s"] += time.monotonic() - held
            fcntl.flock(fh, fcntl.LOCK_UN)

