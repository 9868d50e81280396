"""``cluster=ray`` with fakes (no vLLM): the cluster group, the URL-following client and control, weight
folders through the object store, and replicas as Ray actors on a local 2-node cluster
(``ray.cluster_utils.Cluster``, each node with a custom resource of its own).

Checked on the cluster: the replicas start on different nodes, the starting model and each version
reach the replica's node-local folder (one ``ray.put`` per version for all replicas), a removed node
makes its replica's ``alive()`` False within seconds, and the restart brings it back on the other node
with a new URL that the client follows. The trainer then runs ``rollout=async`` over two such replicas
(scripted servers, a tiny policy) while one node is removed mid-run: lost 0, staleness <= k, the run
ends. ``cluster=local`` never imports ray. The real run (vLLM, sao-train) is tests/test_ray_cluster.py.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from sao.agents.errors import EngineError, EngineUnavailableError
from sao.rl.config import ClusterConfig, ConfigError, RayResources, validate
from sao.rl.rollout.following import FollowingClient, FollowingControl
from sao.rl.weights.staging import prune, read_folder, write_folder

# --------------------------------------------------------------------------- without Ray


def test_cluster_local_imports_no_ray() -> None:
    """The default run's modules, config and learner-rank choice never import ray."""
    code = """
import sys
from hydra import compose, initialize_config_module
import sao.rl.cli.train
from sao.rl.cli.train import to_config
from sao.rl.config import validate
import sao.rl.training.build, sao.rl.learner.parallel.launch, sao.rl.rollout.orchestrated, sao.rl.rollout.following, sao.rl.weights.staging
import sao.rl.cluster.engine_host, sao.rl.cluster.replicas  # importable without ray: it is imported on use only
with initialize_config_module("sao.conf", version_base="1.3"):
    cfg = to_config(compose("config", overrides=["rollout=async", "rollout.replicas=2", "learner.world_size=2"]))
validate(cfg)
assert cfg.cluster.kind == "local", cfg.cluster
ranks = sao.rl.learner.parallel.launch.learner_ranks(cfg, "unused")
assert type(ranks).__name__ == "LearnerRanks", type(ranks)
bad = [m for m in sys.modules if m == "ray" or m.startswith("ray.")]
assert not bad, bad
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


def _compose(*overrides: str) -> Any:
    from hydra import compose, initialize_config_module

    import sao.rl.cli.train  # noqa: F401  (registers the schema)
    from sao.rl.cli.train import to_config

    with initialize_config_module("sao.conf", version_base="1.3"):
        return to_config(compose("config", overrides=list(overrides)))


def test_the_cluster_group_is_typed_and_checked() -> None:
    cfg = _compose("cluster=ray", "rollout=async", "+cluster.engine.resources.node0=1", "cluster.engine.num_gpus=1")
    assert cfg.cluster == ClusterConfig(kind="ray", engine=RayResources(num_cpus=1.0, num_gpus=1.0,
                                                                         resources={"node0": 1.0}))
    assert cfg.cluster.engine.bundle() == {"CPU": 1.0, "GPU": 1.0, "node0": 1.0}
    validate(cfg)
    assert _compose().cluster.kind == "local"
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException):
        _compose("cluster=ray", "cluster.adress=auto")  # unknown keys fail
    with pytest.raises(ConfigError, match="shared_dir"):
        _compose("cluster=ray", "cluster.weights=shared_dir")
    with pytest.raises(ConfigError, match="placement"):
        _compose("cluster=ray", "cluster.placement=SPRAED")
    with pytest.raises(ConfigError, match="scheduled rollout"):
        validate(_compose("cluster=ray"))  # rollout=sync
    with pytest.raises(ConfigError, match="base_url"):
        validate(_compose("cluster=ray", "rollout=async", "engine.base_url=http://x:1"))


class Inner:
    """A recording client/control for one URL."""

    def __init__(self, url: str, log: list[str]):
        self.root_url, self.log, self.closed = url, log, False

    async def complete(self, prompt_ids: Any, params: Any) -> str:
        self.log.append(f"complete@{self.root_url}")
        return self.root_url

    async def health(self) -> bool:
        return True

    async def pause(self, *, mode: str = "abort", clear_cache: bool = True) -> None:
        self.log.append(f"pause:{mode}@{self.root_url}")

    async def resume(self) -> None:
        self.log.append(f"resume@{self.root_url}")

    async def reload_weights(self, path: Any, *, timeout_s: float | None = None) -> None:
        self.log.append(f"reload:{path}@{self.root_url}")

    async def set_weight_version(self, version: Any) -> None:
        self.log.append(f"version:{version}@{self.root_url}")

    async def reset_prefix_cache(self) -> bool:
        return True

    async def aclose(self) -> None:
        self.closed = True


def test_client_and_control_follow_the_replicas_current_url() -> None:
    from sao.rl.weights.load import load_weights

    where: dict[str, str | None] = {"url": "http://a:1"}
    log: list[str] = []
    made: list[Inner] = []

    def make(url: str) -> Inner:
        made.append(Inner(url, log))
        return made[-1]

    async def localize(folder: Path) -> str:
        return f"/node/{folder.name}"

    async def go() -> None:
        client = FollowingClient(lambda: where["url"], make)  # type: ignore[arg-type]
        control = FollowingControl(lambda: where["url"], make, localize=localize)  # type: ignore[arg-type]
        assert await client.complete([1], None) == "http://a:1"  # type: ignore[arg-type]
        await load_weights(control, Path("/run/weights/v000001"), 1)  # the engine is told its node's copy
        assert log[1:] == ["pause:keep@http://a:1", "reload:/node/v000001@http://a:1", "version:1@http://a:1",
                           "resume@http://a:1"]
        where["url"] = None  # down: being restarted
        with pytest.raises(EngineUnavailableError):
            await client.complete([1], None)  # type: ignore[arg-type]
        assert not await control.health()
        with pytest.raises(EngineError):
            await control.pause()
        where["url"] = "http://b:2"  # back, elsewhere
        assert await client.complete([1], None) == "http://b:2"  # type: ignore[arg-type]
        assert await control.health() and control.root_url == "http://b:2"
        await control.reload_weights("/run/weights/v000002")
        assert log[-1] == "reload:/node/v000002@http://b:2"
        await client.aclose()
        await control.aclose()

    asyncio.run(go())
    assert len(made) == 4 and all(m.closed for m in made)  # a client and a control per URL, all closed


def test_weight_folders_round_trip_and_old_versions_are_pruned(tmp_path: Path) -> None:
    src = tmp_path / "weights" / "v000003"
    src.mkdir(parents=True)
    (src / "model.safetensors").write_bytes(bytes(range(256)) * 1000)
    (src / "config.json").write_text('{"a": 1}')
    staged = read_folder(src)
    assert staged.name == "v000003" and staged.nbytes == 256_000 + 8
    node = tmp_path / "node"
    for v in (1, 2):
        (node / f"v00000{v}").mkdir(parents=True)
    out = write_folder(staged, node)
    assert out == node / "v000003" and (out / "model.safetensors").read_bytes() == bytes(range(256)) * 1000
    assert not [p for p in node.iterdir() if p.name.startswith(".tmp")]
    assert [p.name for p in prune(node, 2)] == ["v000001"]
    assert sorted(p.name for p in node.iterdir()) == ["v000002", "v000003"]


def test_a_restarted_replica_removes_what_its_dead_predecessors_left_on_the_node(tmp_path: Path) -> None:
    import os

    from sao.rl.cluster.engine_host import FOLDER_TAG, EngineHost, remove_earlier_incarnations

    run = tmp_path / "nodes" / "run-1"
    for name in ("replica-0-aaaa1111", "replica-0-bbbb2222", "replica-1-cccc3333", "replica-10-dddd4444"):
        (run / name / "engine_model").mkdir(parents=True)
    # an engine process an earlier actor left running (tagged with its folder), and replica 1's (kept)
    left = subprocess.Popen(["sleep", "300"], env={**os.environ, FOLDER_TAG: str(run / "replica-0-aaaa1111")})
    other = subprocess.Popen(["sleep", "300"], env={**os.environ, FOLDER_TAG: str(run / "replica-1-cccc3333")})
    try:
        for proc in (left, other):  # exec'd with the tag: until then /proc shows the parent's environment
            deadline = time.monotonic() + 30
            while FOLDER_TAG.encode() not in Path(f"/proc/{proc.pid}/environ").read_bytes():
                assert time.monotonic() < deadline, "the tagged process never started"
                time.sleep(0.01)
        host = EngineHost(0, "run-1", str(tmp_path / "nodes"))
        host.folder.mkdir(parents=True)
        removed = remove_earlier_incarnations(host.folder)
        assert left.wait(timeout=10) == -9 and other.poll() is None
    finally:
        for proc in (left, other):
            proc.kill()
            proc.wait()
    assert sorted(p.name for p in removed) == ["replica-0-aaaa1111", "replica-0-bbbb2222"]
    # its own folder and the other replicas' (replica 10 is not replica 1's earlier self) stay
    assert sorted(p.name for p in run.iterdir()) == sorted([host.folder.name, "replica-1-cccc3333", "replica-10-dddd4444"])
    assert remove_earlier_incarnations(run / "replica-1-cccc3333") == []


# --------------------------------------------------------------------------- on a local 2-node Ray cluster


@pytest.fixture(scope="module")
def two_nodes():  # type: ignore[no-untyped-def]
    """A head (node0: 3 CPUs) and a worker node (node1: 2 CPUs), and this process connected to them."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 3, "resources": {"node0": 10}, "object_store_memory": 256 * 2**20})
    try:
        worker = cluster.add_node(num_cpus=2, resources={"node1": 10}, object_store_memory=256 * 2**20)
        ray.init(address=cluster.address, namespace="sao-test", log_to_driver=False)
        yield cluster, worker
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.part("ray")
def test_learner_rank_1_is_a_ray_actor_on_another_node_that_mirrors_rank_0(two_nodes, tmp_path: Path) -> None:
    """learner.world_size=2 on cluster=ray: rank 1 runs in an actor on node1 and takes part in every
    collective of rank 0's update; the update's loss is the single-process one."""
    import torch

    from sao.rl.algos import make_algorithm
    from sao.rl.cluster.learner_ranks import RayLearnerRanks
    from sao.rl.config import LearnerRanksConfig
    from sao.rl.training.build import make_learner
    from test_train import config
    from tests.test_data_parallel import batch_for
    from tests.tiny_models import tiny_llama

    cluster, _ = two_nodes
    worker = next(iter(cluster.worker_nodes))
    model_dir = tmp_path / "tiny"
    tiny_llama(seed=0).save_pretrained(model_dir)
    cfg = config("grpo", learner=LearnerRanksConfig(world_size=2), device="cpu",
                 cluster=ClusterConfig(kind="ray", learner=RayResources(num_cpus=1, resources={"node1": 1})))
    batch = batch_for(tiny_llama(seed=0))
    torch.manual_seed(cfg.seed)
    reference = make_algorithm(cfg.algo).update(make_learner(cfg, str(model_dir), False, device="cpu"), batch)
    with RayLearnerRanks(cfg, str(model_dir), host="127.0.0.1") as ranks:
        assert [node for node, _ in ranks.nodes] == [worker.node_id]
        torch.manual_seed(cfg.seed)
        learner = make_learner(cfg, str(model_dir), False, data_parallel=ranks.data_parallel(), device=ranks.device)
        metrics = ranks.lead(make_algorithm(cfg.algo), learner).update(learner, batch)
    assert ranks.calls == [1]  # rank 1 ran the update's call, then stopped
    # the whole batch's loss and gradient norm (summed over both ranks), as in one process
    for key in ("loss/policy", "grad_norm/policy", "rollout/logprob_gap", "policy/action_tokens"):
        assert abs(metrics[key] - reference[key]) < 1e-6, (key, metrics[key], reference[key])


def _model_dir(tmp_path: Path) -> Path:
    model = tmp_path / "engine_model"
    model.mkdir()
    (model / "config.json").write_text('{"tie_word_embeddings": false}')
    (model / "model.safetensors").write_bytes(b"w" * 100_000)
    return model


def _wait(predicate: Any, timeout_s: float, what: str) -> float:
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout_s:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        time.sleep(0.05)
    return time.monotonic() - started


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.part("ray")
def test_replicas_spread_get_weights_through_the_object_store_and_come_back_on_the_other_node(two_nodes,
                                                                                               tmp_path: Path) -> None:
    import ray

    from sao.rl.cluster.engine_host import FakeLaunch
    from sao.rl.cluster.replicas import RayFleet

    cluster, worker = two_nodes
    cfg = ClusterConfig(kind="ray", node_dir=str(tmp_path / "nodes"), ping_s=0.2, placement_timeout_s=60)
    weights = tmp_path / "weights" / "v000001"
    weights.mkdir(parents=True)
    (weights / "model.safetensors").write_bytes(b"v1" * 50_000)
    with RayFleet(cfg, 2, FakeLaunch(), _model_dir(tmp_path), start_timeout_s=60) as fleet:
        rows = [e.row() for e in fleet.engines]
        assert {r["node_id"] for r in rows} == {cluster.head_node.node_id, worker.node_id}  # SPREAD
        for r in rows:  # each server started from the model shipped into its node folder
            logged = Path(r["log"]).read_text().split()[1]
            assert logged.startswith(str(tmp_path / "nodes")) and Path(logged, "model.safetensors").stat().st_size == 100_000
        paths = [asyncio.run(e.localize(weights)) for e in fleet.engines]
        assert len(set(paths)) == 2 and all(Path(p, "model.safetensors").read_bytes() == b"v1" * 50_000 for p in paths)
        assert fleet.stager is not None and fleet.stager.puts == 2  # the model once, version 1 once for both

        victim = next(e for e in fleet.engines if e.row()["node_id"] == worker.node_id)
        old_url = victim.url()
        client = FollowingClient(victim.url, lambda url: _Probe(url))  # type: ignore[arg-type]
        cluster.remove_node(worker)
        took = _wait(lambda: not victim.alive(), 30, "the replica on the removed node is seen dead")
        assert took < 10
        victim.restart()  # a new actor; Ray moved its bundle to the node that is left
        assert victim.alive() and victim.row()["node_id"] == cluster.head_node.node_id
        assert victim.url() != old_url and victim.row()["restarts"] == 1
        assert asyncio.run(client.complete([1], None)) == victim.url()  # type: ignore[arg-type]
        assert Path(asyncio.run(victim.localize(weights)), "model.safetensors").is_file()
        actors = [e._actor for e in fleet.engines]
        folders = [Path(e.row()["log"]).parent for e in fleet.engines]
    for actor in actors:  # stopped and killed at the end, their folders deleted
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(actor.ping.remote(), timeout=30)
    assert not any(f.exists() for f in folders)
    cluster.add_node(num_cpus=2, resources={"node1": 10}, object_store_memory=256 * 2**20)  # for the next test


class _Probe:
    def __init__(self, url: str):
        self.url = url

    async def complete(self, prompt_ids: Any, params: Any) -> str:
        return self.url

    async def aclose(self) -> None:
        pass


class NodeControl:
    """FakeEngine's control endpoints (tests/test_train.py), on a node-local folder."""

    def __init__(self, url: str, calls: list[str]):
        self.root_url, self.calls = url, calls

    async def pause(self, *, mode: str = "abort", clear_cache: bool = True) -> None:
        pass

    async def resume(self) -> None:
        pass

    async def reload_weights(self, path: Any, *, timeout_s: float | None = None) -> None:
        assert (Path(path) / "model.safetensors").is_file()
        self.calls.append(f"reload:{Path(path).name}@{self.root_url}")

    async def set_weight_version(self, version: Any) -> None:
        pass

    async def reset_prefix_cache(self) -> bool:
        return True

    async def health(self) -> bool:
        return True

    async def aclose(self) -> None:
        pass


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.part("ray")
def test_async_training_survives_a_node_removed_mid_run(two_nodes, tmp_path: Path) -> None:
    """The real driver, scheduler and trainer over two Ray replicas serving scripted answers; the
    node under one replica is removed after step 1: it comes back on the head, lost 0, staleness <= k."""
    import ray

    from sao.agents import ByteTokenizer, EpisodeRunner, LoopConfig, OpenAICompletionClient, Renderers, RetryPolicy
    from sao.rl.algos import make_algorithm
    from sao.rl.cluster.engine_host import FakeLaunch
    from sao.rl.cluster.replicas import RayFleet
    from sao.rl.learner.learner import Learner
    from sao.rl.prompts.tasks import TaskStream
    from sao.rl.rollout.orchestrated import HealthConfig, OrchestratedRollout, Replica
    from sao.rl.rollout.schedulers import SchedulerConfig
    from sao.rl.training.build import learner_config, write_engines
    from sao.rl.training.trainer import Trainer
    from sao.rl.weights.sync import WeightPublisher
    import test_train
    from test_train import config, lines, responder, tiny_policy

    ray.cloudpickle.register_pickle_by_value(test_train)  # the responder runs in the actors, where tests/ is not
    cluster, _ = two_nodes
    worker = next(iter(cluster.worker_nodes))  # the one the previous test added back
    cfg = config("reinforce_mean", max_steps=4, keep_checkpoints=1)
    k = 2
    learner = Learner(tiny_policy(), learner_config(cfg))
    retry = RetryPolicy(max_retries=0, backoff_s=0.01, max_backoff_s=0.01)
    runner = EpisodeRunner("arithmetic", Renderers(ByteTokenizer()),
                           LoopConfig(max_turns=1, max_tokens=48, max_model_len=400), cfg.env.kwargs)

    killing, restarted = threading.Event(), threading.Event()

    played = itertools.count()

    async def play(client, ref, sample, seed):  # type: ignore[no-untyped-def]
        # the run must not end before the restart: a scripted step takes milliseconds, a restart seconds,
        # and the async scheduler starts episodes steps ahead. So every episode past the first two
        # steps' worth waits (up to 300 s) for the replica to be back, and so does any episode started
        # once the node is being removed: steps 3 and 4 can only finish after the restart
        started, index = time.monotonic(), next(played)
        while ((killing.is_set() or index >= 2 * cfg.batch_size) and not restarted.is_set()
               and time.monotonic() - started < 300):
            await asyncio.sleep(0.05)
        return await runner(client, task_id=ref.task_id, sample=sample, seed=seed)

    def on_restart(rid: int) -> None:
        write_engines(tmp_path, engines)
        restarted.set()

    calls: list[str] = []
    ccfg = ClusterConfig(kind="ray", node_dir=str(tmp_path / "nodes"), ping_s=0.2, placement_timeout_s=60)
    with RayFleet(ccfg, 2, FakeLaunch(responder=responder), _model_dir(tmp_path), start_timeout_s=60) as fleet:
        engines = fleet.engines
        assert {e.row()["node_id"] for e in engines} == {cluster.head_node.node_id, worker.node_id}
        victim = next(i for i, e in enumerate(engines) if e.row()["node_id"] == worker.node_id)

        def replica(e: Any) -> Replica:
            async def restart() -> None:
                await asyncio.to_thread(e.restart)

            return Replica(FollowingClient(e.url, lambda u: OpenAICompletionClient(u + "/v1", "fake", timeout_s=10,
                                                                                     retry=retry)),
                           FollowingControl(e.url, lambda u: NodeControl(u, calls), localize=e.localize),
                           alive=e.alive, restart=restart)

        sched = SchedulerConfig(batch_size=cfg.batch_size, group_size=1, max_concurrency=4, staleness=k)
        source = OrchestratedRollout("async", sched, [replica(e) for e in engines],
                                     tasks=TaskStream("arithmetic", cfg.env.kwargs, cfg.seed), run_episode=play,
                                     weights_root=tmp_path / "weights", seed=cfg.seed,
                                     health=HealthConfig(interval_s=0.2, failures=2, timeout_s=2.0),
                                     on_restart=on_restart)
        trainer = Trainer(cfg, tmp_path, learner=learner, algo=make_algorithm(cfg.algo), source=source,
                          weight_sync=WeightPublisher(tmp_path / "weights", keep=k + 2), pad_id=257)

        def kill_after_step_1() -> None:
            _wait(lambda: (tmp_path / "metrics.jsonl").exists() and (tmp_path / "metrics.jsonl").read_text(), 120,
                  "step 1")
            killing.set()
            cluster.remove_node(worker)

        write_engines(tmp_path, engines)
        killer = threading.Thread(target=kill_after_step_1)
        killer.start()
        asyncio.run(trainer.run())
        killer.join()
        rows = lines(tmp_path / "metrics.jsonl")
        back = engines[victim].row()
    assert restarted.is_set(), "the run ended before the removed node's replica was restarted"
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all(r["rollout/lost"] == 0 and r["rollout/staleness_max"] <= k for r in rows)
    final = trainer.source.stats()
    assert final["rollout/replica_deaths"] == 1 and final["rollout/replica_restarts"] == 1
    assert back["node_id"] == cluster.head_node.node_id and back["restarts"] == 1
    assert json.loads((tmp_path / "engines.json").read_text())[victim]["node_id"] == cluster.head_node.node_id
    # the restarted replica loaded the newest version from its new node-local folder
    assert any(c.startswith("reload:v") and c.endswith(back["url"]) for c in calls)
    _wait(lambda: ray.available_resources().get("node0", 0) == 10, 30,
          "every actor gone, the placement group removed")
