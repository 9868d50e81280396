"""``sao-train cluster=ray`` for real: a local 2-node Ray cluster, two vLLM replicas, two gloo learner ranks,
and one node killed mid-run (issue 12).

The cluster is ``ray.cluster_utils.Cluster``: a head (node0, where sao-train and learner rank 1 run) and
a worker node (node1), each with a custom resource of its own. sao-train connects to it with
``cluster.address``; its replicas' placement group (SPREAD) puts one replica on each node, the engine
model and every version go through the object store into node-local folders (no shared folder). Once
the replica on node1 has served episodes, node1 is removed (its raylet and workers killed, as
``ray stop`` on that machine would): its replica dies with it, comes back on node0 and loads the newest
version; the run finishes its STEPS steps with nothing lost and staleness within k, and no Ray or vLLM
process is left afterwards.

``algo=reinforce_mean``, not grpo: ``rollout=async`` streams single rollouts (validate refuses GRPO's
groups there), and reinforce_mean is the critic-free single-rollout algorithm, so the two learner ranks
stay as small as GRPO's would.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import _require

pytestmark = [
    pytest.mark.vllm, pytest.mark.slow, pytest.mark.long, pytest.mark.part("ray", "sao-train"),
    # Alone on the machine it passed (2026-12-03: 300 s, peak 16.3 GiB used). Beside the suite's two
    # session engines (about 4.4 GB each) that peak would not fit the 24 GiB: scripts/test runs it in a
    # pytest call of its own after the suite (tests/workers.py: keep_alone_tests_alone).
    pytest.mark.alone,
]

K = 2  # rollout.staleness
# Steps take about 9 s here; with 3 the run ended 30 s after node1's removal, before the new actor's
# engine served (2026-12-03: exit 0, lost 0, but the restart never landed). 16 left it about 2 minutes,
# which the restart took (114 s on 2026-12-03); on a loaded machine it did not land in time
# (2026-12-04). 24 leave it about 3 minutes.
STEPS = 24


def _lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _group_alive(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _ray_and_vllm_pids(marker: str) -> set[int]:
    """Live (non-zombie) Ray daemons and workers, and vLLM servers started from ``marker``'s folders."""
    import psutil

    found = set()
    for p in psutil.process_iter(["pid", "name", "cmdline", "status"]):
        try:
            if p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            cmd = " ".join(p.info["cmdline"] or [])
            name = p.info["name"] or ""
        except psutil.Error:
            continue
        if name in ("raylet", "gcs_server") or name.startswith("ray::") or "ray/_private/workers" in cmd \
                or "ray/dashboard" in cmd or "log_monitor.py" in cmd or (marker in cmd and "vllm" in cmd):
            found.add(p.info["pid"])
    return found


class MemorySampler:
    """The machine's memory in use, sampled every 2 s: its peak of ``used`` (processes' memory) and of
    ``total - available`` (also shared memory, such as Ray's object stores in /dev/shm: what cannot be
    reclaimed), and ``total``."""

    def __init__(self) -> None:
        import psutil

        self.psutil, self.peak, self.peak_unavailable, self._stop = psutil, 0, 0, threading.Event()
        self.total = psutil.virtual_memory().total
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(2.0):
            mem = self.psutil.virtual_memory()
            self.peak = max(self.peak, mem.used)
            self.peak_unavailable = max(self.peak_unavailable, mem.total - mem.available)

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def test_sao_train_on_a_2_node_ray_cluster_survives_a_killed_node(tmp_path: Path, smollm2_dir: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    try:
        import vllm  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        _require("vLLM", f"it does not import ({exc})")
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    before = _ray_and_vllm_pids(str(tmp_path))
    run_dir, nodes = tmp_path / "run", tmp_path / "nodes"
    cluster = None
    proc = None
    log = tmp_path / "sao-train.log"
    seen_engines: list[dict[str, Any]] = []
    started = time.monotonic()
    # Ray's memory monitor (in each raylet) kills the newest workers once the node's memory in use passes
    # 95%, by its own count, which on this machine's cgroup v1 includes active page cache. After the suite
    # (gigabytes of models and images read) it killed the replicas of this test 3 times in a row in CI on
    # 2026-12-04 (engine.max_restarts used up) while the processes used about 16 GiB. The raylets started
    # below inherit this variable: no monitor; MemorySampler checks that the run fits instead.
    monkeypatch.setenv("RAY_memory_monitor_refresh_ms", "0")
    # The object stores spill (a version and the model do not fit 1.5 GiB together), and Ray refuses to
    # spill once the disk is 95% used, by statvfs: on this machine's shared disk that was with 14 GB
    # still free (2026-12-04: "OutOfDiskError: Local disk is full", the replicas' restarts used up).
    monkeypatch.setenv("RAY_local_fs_capacity_threshold", "0.99")
    try:
        # 1.5 GiB object stores: the fp32 engine model (0.54 GB) and a version or two at a time
        cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 4, "resources": {"node0": 10}, "object_store_memory": 1536 * 2**20})
        worker = cluster.add_node(num_cpus=2, resources={"node1": 10}, object_store_memory=1536 * 2**20)
        head_id, worker_id = cluster.head_node.node_id, worker.node_id
        cmd = [sys.executable, "-m", "sao.rl.cli.train", "cluster=ray", f"cluster.address={cluster.address}",
               "rollout=async", "rollout.replicas=2", "learner.world_size=2", "algo=reinforce_mean", f"max_steps={STEPS}",
               "batch_size=4", "env.max_tokens=32", "engine.kv_cache_gib=1", "engine.max_model_len=512",
               "eval.enabled=false", "logger=quiet", "checkpoint_every=100", f"rollout.staleness={K}",
               "rollout.concurrency=8", "engine.health_interval_s=1", "cluster.ping_s=0.5",
               # no torch.compile: an engine starts in seconds, not a minute, so the restart lands mid-run
               "engine.extra_args=[--optimization-level,'0']",
               "+cluster.learner.resources.node0=1",  # learner rank 1 stays on the head: node1 is killed
               f"cluster.node_dir={nodes}", f"output_dir={run_dir}"]
        with MemorySampler() as memory, open(log, "w") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
            killed_at = None
            while proc.poll() is None and time.monotonic() - started < 900:
                time.sleep(1.0)
                engines = _lines_json(run_dir / "engines.json")
                if not seen_engines and engines and all(e["node_id"] for e in engines):
                    seen_engines = engines
                if killed_at is None and seen_engines:
                    victim = next(e["replica"] for e in seen_engines if e["node_id"] == worker_id)
                    served = [t for t in _lines(run_dir / "trajectories.jsonl")
                              if (t.get("rollout") or {}).get("replica") == victim and t.get("status") == "ok"]
                    if served:  # it has served version 0 (every replica loads it before it serves)
                        cluster.remove_node(worker)
                        killed_at = time.monotonic() - started
            if proc.poll() is None:
                proc.kill()
            code = proc.wait(timeout=60)
        wall = time.monotonic() - started
        text = log.read_text()
        assert code == 0, text[-6000:]
        assert killed_at is not None, "the run ended before the replica on node1 served an episode"
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
        if cluster is not None:
            ray.shutdown()
            cluster.shutdown()
        # pytest keeps its last 3 temporary folders: without this, 8 to 10 GB of model copies and weight
        # versions stayed on the disk after each run (the logs and records stay)
        for heavy in [run_dir / "weights", run_dir / "engine_model", run_dir / "checkpoints",
                      *nodes.glob("*/*/engine_model"), *nodes.glob("*/*/weights")]:
            shutil.rmtree(heavy, ignore_errors=True)

    rows = _lines(run_dir / "metrics.jsonl")
    engines = json.loads((run_dir / "engines.json").read_text())
    victim = next(e["replica"] for e in seen_engines if e["node_id"] == worker_id)
    print(f"\nray test: wall {wall:.0f} s, node1 killed at {killed_at:.0f} s, peak used memory "
          f"{memory.peak / 2**30:.1f} GiB (not available {memory.peak_unavailable / 2**30:.1f} of "
          f"{memory.total / 2**30:.1f} GiB); placement at start {[(e['replica'], e['node_id'][:8]) for e in seen_engines]}, "
          f"at the end {[(e['replica'], e['node_id'][:8], e['restarts']) for e in engines]}; steps "
          f"{[(r['step'], r['rollout/lost'], r['rollout/staleness_max'], r['engine/weight_version'], r['rollout/replica_restarts']) for r in rows]}")
    # it fits the machine: what cannot be reclaimed stayed under the 95% at which Ray's monitor would kill
    assert memory.peak_unavailable < 0.95 * memory.total
    # each replica started on a different node
    assert {e["node_id"] for e in seen_engines} == {head_id, worker_id}
    # the learner's ranks: 2 gloo ranks (rank 1 an actor on the head)
    assert "learner: 2 data-parallel ranks (gloo" in text
    # every step, nothing lost, staleness within k, the engines' versions advanced
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert all(r["rollout/lost"] == 0 and r["rollout/staleness_max"] <= K for r in rows)
    versions = [r["engine/weight_version"] for r in rows]
    assert versions == sorted(versions) and versions[-1] >= 1
    # the killed node's replica came back on the surviving node
    assert rows[-1]["rollout/replica_deaths"] == 1 and rows[-1]["rollout/replica_restarts"] == 1
    assert engines[victim]["node_id"] == head_id and engines[victim]["restarts"] == 1
    assert engines[victim]["url"] != seen_engines[victim]["url"]
    # weights reached the replicas without a shared folder: node-local copies of the model and versions
    assert f"{nodes}" in engines[1 - victim]["log"]
    # nothing left: Ray's processes, the engines' process groups
    time.sleep(2)
    left = _ray_and_vllm_pids(str(tmp_path)) - before
    assert not left, left
    assert not any(_group_alive(e["pid"]) for e in [*seen_engines, *engines] if e["pid"])


def _lines_json(path: Path) -> list[dict[str, Any]]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return []
