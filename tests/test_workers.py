"""tests/workers.py: how the suite's xdist workers share the cores and which tests run one at a time."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from tests.workers import (
    DOCKER_GROUP,
    ENGINE_GROUP,
    assign_groups,
    check_grouped,
    keep_alone_tests_alone,
    machine_lock,
    needs_the_machine,
    worker_cores,
)


def test_each_worker_gets_a_disjoint_share_of_the_cores():
    assert [worker_cores(f"gw{i}", 2, [0, 1]) for i in range(2)] == [[0], [1]]
    assert [worker_cores(f"gw{i}", 2, [0, 1, 2, 3, 4]) for i in range(2)] == [[0, 1], [2, 3, 4]]  # the rest: last
    assert [worker_cores(f"gw{i}", 3, [4, 5, 6]) for i in range(3)] == [[4], [5], [6]]
    assert worker_cores("gw1", 2, [0]) == [0]  # fewer cores than workers: all of them (nothing pinned)
    with pytest.raises(ValueError, match="gw2"):
        worker_cores("gw2", 2, [0, 1])


class Item:
    """What assign_groups reads of a pytest item."""

    def __init__(self, path: Path, *marks: str, fixtures: tuple[str, ...] = ()) -> None:
        self.path, self.marks = path, {m: getattr(pytest.mark, m).mark for m in marks}
        self.fixturenames = list(fixtures)

    def get_closest_marker(self, name: str):  # type: ignore[no-untyped-def]
        return self.marks.get(name)

    def add_marker(self, mark) -> None:  # type: ignore[no-untyped-def]
        self.marks[mark.name] = mark.mark

    def group(self) -> str | None:
        mark = self.marks.get("xdist_group")
        return mark.args[0] if mark else None


def test_docker_modules_run_on_one_worker_and_engine_tests_on_the_other(tmp_path: Path):
    docker, plain = tmp_path / "test_a.py", tmp_path / "test_b.py"
    docker.write_text("def test_x(docker_client): ...\n")
    plain.write_text("def test_y(): ...\n")
    items = [Item(docker), Item(docker, "vllm"), Item(plain, "vllm"), Item(plain, "slow"), Item(plain), Item(plain)]
    items[-1].add_marker(pytest.mark.xdist_group("mine"))
    assign_groups(items)  # type: ignore[arg-type]
    assert [i.group() for i in items] == [DOCKER_GROUP, DOCKER_GROUP, ENGINE_GROUP, ENGINE_GROUP, None, "mine"]


def test_the_suites_own_docker_tests_all_share_one_group():
    """Every module that starts containers, or restarts the daemon, lands in the Docker group."""
    tests = Path(__file__).parent
    items = [Item(path) for path in sorted(tests.glob("**/test_*.py"))]
    assign_groups(items)  # type: ignore[arg-type]
    grouped = {i.path.relative_to(tests).as_posix() for i in items if i.group() == DOCKER_GROUP}
    assert {"faults/test_docker_faults.py", "test_swe_real.py", "test_envs.py", "test_soak.py",
            "test_swe_train.py", "test_sandboxes_docker.py"} <= grouped
    assert "test_losses.py" not in grouped


def test_a_worker_whose_groups_did_not_reach_the_node_ids_stops(monkeypatch, tmp_path: Path):
    class Config:
        def getoption(self, name, default=None):  # type: ignore[no-untyped-def]
            return "loadgroup" if name == "dist" else default

    item = Item(tmp_path / "test_a.py")
    item.add_marker(pytest.mark.xdist_group(DOCKER_GROUP))
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    item.nodeid = "test_a.py::test_x"  # type: ignore[attr-defined]  # what xdist 3.8 leaves on pytest 9
    with pytest.raises(pytest.UsageError, match="did not group 1 tests"):
        check_grouped(Config(), [item])  # type: ignore[arg-type]
    item.nodeid = "test_a.py::test_x@docker"  # type: ignore[attr-defined]
    check_grouped(Config(), [item])  # type: ignore[arg-type]
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    item.nodeid = "test_a.py::test_x"  # type: ignore[attr-defined]  # not under xdist: nothing to check
    check_grouped(Config(), [item])  # type: ignore[arg-type]


def test_engine_tests_and_docker_tests_with_an_engine_take_the_machine(tmp_path: Path):
    docker, plain = tmp_path / "test_a.py", tmp_path / "test_b.py"
    docker.write_text("docker\n")
    plain.write_text("\n")
    items = [Item(plain, "vllm"), Item(docker, "vllm"), Item(docker, fixtures=("vllm_server",)),
             Item(docker, fixtures=("docker_client",)), Item(plain), Item(plain, fixtures=("smollm2_dir",))]
    assign_groups(items)  # type: ignore[arg-type]
    assert [needs_the_machine(i) for i in items] == [True, True, True, False, False, False]  # type: ignore[arg-type]


def test_a_test_that_needs_the_machine_alone_is_skipped_beside_session_engines(tmp_path: Path):
    plain = tmp_path / "test_b.py"
    alone, engine, quick = Item(plain, "alone"), Item(plain, fixtures=("vllm_server",)), Item(plain)
    for i, item in enumerate((alone, engine, quick)):
        item.nodeid = f"test_b.py::test_{i}"  # type: ignore[attr-defined]
    keep_alone_tests_alone([alone, quick])  # type: ignore[list-item]
    assert alone.get_closest_marker("skip") is None  # nothing else holds an engine: it runs
    keep_alone_tests_alone([alone, engine, quick])  # type: ignore[list-item]
    skip = alone.get_closest_marker("skip")
    assert skip is not None and "test_b.py::test_1" in skip.kwargs["reason"]
    assert engine.get_closest_marker("skip") is None and quick.get_closest_marker("skip") is None


def test_the_real_ray_run_is_marked_alone_and_long():
    """The 2-node Ray run (16.3 GiB at its peak) is in the long tier and runs after the rest of it, in
    scripts/test's second call (--alone only, tests/tiers.py); the default tier does not run it."""
    from tests import test_ray_cluster

    names = {mark.name for mark in test_ray_cluster.pytestmark}
    assert {"alone", "long"} <= names
    script = (Path(__file__).parents[1] / "scripts" / "test").read_text()
    assert "--alone exclude" in script and "--alone only" in script


def test_the_machine_lock_is_held_by_one_process_of_the_run_at_a_time(monkeypatch):
    run = uuid.uuid4().hex
    monkeypatch.setenv("PYTEST_XDIST_TESTRUNUID", run)
    path = Path(tempfile.gettempdir()) / f"sao-tests-{run}.lock"
    probe = ("import fcntl, sys\nwith open(sys.argv[1], 'a+') as fh:\n"
             "    try:\n        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)\n    except BlockingIOError:\n"
             "        sys.exit(3)\n")

    def other_gets_it() -> bool:
        code = subprocess.run([sys.executable, "-c", probe, str(path)], check=False).returncode
        assert code in (0, 3)
        return code == 0

    try:
        with machine_lock():
            assert path.exists() and not other_gets_it()
        assert other_gets_it()
    finally:
        path.unlink(missing_ok=True)
    monkeypatch.delenv("PYTEST_XDIST_TESTRUNUID")
    with machine_lock():  # outside xdist: nothing to hold
        pass


def test_the_time_a_worker_waits_for_the_machine_lock_is_recorded(monkeypatch):
    """The timeline's "waited for it": the time this worker's core sat idle behind another's machine tests."""
    import tests.workers as W

    run = uuid.uuid4().hex
    monkeypatch.setenv("PYTEST_XDIST_TESTRUNUID", run)
    monkeypatch.setattr(W, "_worker_log", {"started": 0.0, "machine_s": 0.0, "waited_s": 0.0, "tests": 0.0})
    path = Path(tempfile.gettempdir()) / f"sao-tests-{run}.lock"
    hold = ("import fcntl, sys, time\nwith open(sys.argv[1], 'a+') as fh:\n"
            "    fcntl.flock(fh, fcntl.LOCK_EX)\n    print('held', flush=True)\n    time.sleep(1.5)\n")
    holder = subprocess.Popen([sys.executable, "-c", hold, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"  # type: ignore[union-attr]
        with machine_lock():
            pass
        assert holder.wait(timeout=30) == 0
        assert 0.5 < W._worker_log["waited_s"] < 30 and W._worker_log["machine_s"] < 0.5, W._worker_log
    finally:
        holder.kill()
        path.unlink(missing_ok=True)



def test_the_last_worker_takes_every_core_once_the_others_have_finished(monkeypatch):
    """tests/workers.py: a pinned worker widens to the cores it was pinned from when every other worker of
    the run has recorded its finish, drops the vLLM binding it set, and the summary says when."""
    import tests.workers as W

    cores = sorted(os.sched_getaffinity(0))
    run = uuid.uuid4().hex
    monkeypatch.setenv("PYTEST_XDIST_TESTRUNUID", run)
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", str(cores[0]))
    monkeypatch.setattr(W, "_pinned", {"cores": cores, "bind": True})
    monkeypatch.setattr(W, "_worker_log", {"started": 0.0, "machine_s": 0.0, "waited_s": 0.0, "tests": 0.0})
    try:
        os.sched_setaffinity(0, cores[:1])
        monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
        assert W.widen_when_alone() is None  # gw1 still runs
        assert sorted(os.sched_getaffinity(0)) == cores[:1]
        monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
        W.record_finish()  # gw1's finish, as its session would record it
        monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
        assert W.widen_when_alone() == cores
        assert sorted(os.sched_getaffinity(0)) == cores and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ
        assert W.widen_when_alone() is None  # once
        W.record_finish()
        lines = W.timeline(run)
        assert len(lines) == 2 and lines[0].startswith("worker gw0:") and "all cores from" in lines[0]
        assert all("machine lock held 0 s, waited for it 0 s" in line for line in lines), lines
        assert "all cores from" not in lines[1]
        assert not (Path(tempfile.gettempdir()) / f"sao-tests-{run}").exists()
    finally:
        os.sched_setaffinity(0, cores)
