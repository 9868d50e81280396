"""``cluster=ray`` on a real 1-node Ray cluster (``ray.cluster_utils.Cluster``, a head only): the default
tier's test of Ray. The 2-node runs, a node removed mid-run included, are in the long tier
(tests/test_ray_fleet.py, tests/test_ray_cluster.py).

Checked here: learner rank 1 runs in a Ray actor and takes part in every collective of rank 0's update
(``torch.distributed`` over gloo between this process and the actor), which equals the single-process
update; and an engine replica starts as an actor from the starting model shipped through the object
store, receives a weight version the same way, and leaves no actor, placement group or folder behind.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from sao.rl.config import ClusterConfig, RayResources

pytestmark = [pytest.mark.slow, pytest.mark.part("ray")]


@pytest.fixture(scope="module")
def one_node():  # type: ignore[no-untyped-def]
    """A head node (3 logical CPUs, the custom resource node0) and this process connected to it."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 3, "resources": {"node0": 10}, "object_store_memory": 256 * 2**20})
    try:
        ray.init(address=cluster.address, namespace="sao-test-one-node", log_to_driver=False)
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.mark.part("torch.distributed")
def test_learner_rank_1_is_a_ray_actor_that_mirrors_rank_0(one_node, tmp_path: Path) -> None:
    import torch

    from sao.rl.algos import make_algorithm
    from sao.rl.cluster.learner_ranks import RayLearnerRanks
    from sao.rl.config import LearnerRanksConfig
    from sao.rl.training.build import make_learner
    from test_train import config
    from tests.test_data_parallel import batch_for
    from tests.tiny_models import tiny_llama

    model_dir = tmp_path / "tiny"
    tiny_llama(seed=0).save_pretrained(model_dir)
    cfg = config("grpo", learner=LearnerRanksConfig(world_size=2), device="cpu",
                 cluster=ClusterConfig(kind="ray", learner=RayResources(num_cpus=1, resources={"node0": 1})))
    batch = batch_for(tiny_llama(seed=0))
    torch.manual_seed(cfg.seed)
    reference = make_algorithm(cfg.algo).update(make_learner(cfg, str(model_dir), False, device="cpu"), batch)
    with RayLearnerRanks(cfg, str(model_dir), host="127.0.0.1") as ranks:
        assert [node for node, _ in ranks.nodes] == [one_node.head_node.node_id]
        torch.manual_seed(cfg.seed)
        learner = make_learner(cfg, str(model_dir), False, data_parallel=ranks.data_parallel(), device=ranks.device)
        metrics = ranks.lead(make_algorithm(cfg.algo), learner).update(learner, batch)
    assert ranks.calls == [1]  # rank 1 ran the update's call, then stopped
    for key in ("loss/policy", "grad_norm/policy", "rollout/logprob_gap", "policy/action_tokens"):
        assert abs(metrics[key] - reference[key]) < 1e-6, (key, metrics[key], reference[key])


def test_a_replica_actor_gets_the_model_and_a_version_through_the_object_store(one_node, tmp_path: Path) -> None:
    import ray

    from sao.rl.cluster.engine_host import FakeLaunch
    from sao.rl.cluster.replicas import RayFleet

    model = tmp_path / "engine_model"
    model.mkdir()
    (model / "config.json").write_text('{"tie_word_embeddings": false}')
    (model / "model.safetensors").write_bytes(b"w" * 100_000)
    weights = tmp_path / "weights" / "v000001"
    weights.mkdir(parents=True)
    (weights / "model.safetensors").write_bytes(b"v1" * 50_000)
    cfg = ClusterConfig(kind="ray", node_dir=str(tmp_path / "nodes"), ping_s=0.2, placement_timeout_s=60)
    with RayFleet(cfg, 1, FakeLaunch(), model, start_timeout_s=60) as fleet:
        [engine] = fleet.engines
        row = engine.row()
        assert row["node_id"] == one_node.head_node.node_id and engine.alive()
        started_from = Path(Path(row["log"]).read_text().split()[1])  # FakeLaunch logs the folder it was given
        assert started_from.is_relative_to(tmp_path / "nodes")
        assert (started_from / "model.safetensors").read_bytes() == b"w" * 100_000
        local = Path(asyncio.run(engine.localize(weights)))
        assert local != weights and (local / "model.safetensors").read_bytes() == b"v1" * 50_000
        assert fleet.stager is not None and fleet.stager.puts == 2  # the model, then version 1
        actor, folder = engine._actor, Path(row["log"]).parent
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(actor.ping.remote(), timeout=30)
    assert not folder.exists()
    deadline = time.monotonic() + 30  # the placement group's CPUs come back
    while ray.available_resources().get("CPU", 0) != 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ray.available_resources().get("CPU", 0) == 3, ray.available_resources()
