"""Sync seconds per weight version: the single-machine path against Ray's object store (issue 12).

One engine replica runs as a Ray actor (:class:`sao.rl.cluster.replicas.RayFleet`) on a local Ray instance.
For each of ``--versions`` versions the policy (SmolLM2-135M, perturbed a little each time) is written
as ``weights/v{k}`` (what :class:`~sao.rl.weights.sync.WeightPublisher` does), then loaded into the same engine
twice with :func:`sao.rl.weights.load.load_weights` (pause, reload, version label, prefix-cache reset,
resume):

- ``local``: the engine is told the learner's folder (one machine, or ``cluster.weights=shared_dir``);
- ``object_store``: the folder's files are put into the object store (once per version), shipped to
  the replica's actor, written into its node-local folder, and the engine reloads from there
  (``cluster.weights=object_store``; what a replica on another node does).

    .venv/bin/python benchmarks/ray_weight_sync.py               # the real vLLM (about 2-3 min)
    .venv/bin/python benchmarks/ray_weight_sync.py --fake        # a scripted engine: the transport alone

On one machine the object store is shared memory; between machines add the network copy
(0.54 GB a version for the fp32 135M model).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any


class _FakeControl:
    """Records reloads (``--fake``)."""

    def __init__(self, url: str) -> None:
        self.root_url = url

    async def pause(self, *, mode: str = "abort", clear_cache: bool = True) -> None: ...

    async def resume(self) -> None: ...

    async def reload_weights(self, path: Any, *, timeout_s: float | None = None) -> None:
        assert (Path(path) / "model.safetensors").is_file()

    async def set_weight_version(self, version: Any) -> None: ...

    async def reset_prefix_cache(self) -> bool:
        return True

    async def health(self) -> bool:
        return True

    async def aclose(self) -> None: ...


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--versions", type=int, default=4)
    ap.add_argument("--fake", action="store_true", help="a scripted engine instead of vLLM (the transport alone)")
    ap.add_argument("--dtype", default="float32", help="the served dtype the versions are written in")
    args = ap.parse_args()

    import ray
    import torch
    from sao.agents.engine.control import EngineClient
    from sao.agents.engine.server import VLLMServerConfig
    from sao.agents.models.prepare import ensure_model
    from sao.rl.cluster.engine_host import FakeLaunch, VLLMLaunch
    from sao.rl.cluster.replicas import RayFleet
    from sao.rl.config import ClusterConfig
    from sao.rl.rollout.following import FollowingControl
    from sao.rl.weights.load import load_weights
    from sao.rl.weights.sync import export_engine_model, save_checkpoint
    from transformers import AutoModelForCausalLM

    work = Path(tempfile.mkdtemp(prefix="sao-ray-sync-"))
    model_dir = ensure_model("smollm2-135m")
    dtype = getattr(torch, args.dtype)
    policy = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    engine_model = export_engine_model(policy, Path(model_dir), work / "engine_model", dtype=dtype)
    launch = FakeLaunch() if args.fake else VLLMLaunch(VLLMServerConfig(
        model=str(engine_model), served_model_name="policy", dtype=args.dtype, max_model_len=512, kv_cache_gib=1))
    ray.init(num_cpus=2, object_store_memory=2 * 2**30, log_to_driver=False)
    rows: list[dict[str, float]] = []
    try:
        cluster = ClusterConfig(kind="ray", node_dir=str(work / "nodes"))
        started = time.perf_counter()
        with RayFleet(cluster, 1, launch, engine_model, start_timeout_s=900) as fleet:
            engine = fleet.engines[0]
            print(f"replica up in {time.perf_counter() - started:.0f} s at {engine.url()}")
            make = _FakeControl if args.fake else EngineClient
            stage_s: list[float] = []

            async def localize(folder: Path) -> str:
                t = time.perf_counter()
                path = await engine.localize(folder)
                stage_s.append(time.perf_counter() - t)
                return path

            async def run() -> None:
                local = make(engine.url())
                shipped = FollowingControl(engine.url, make, localize=localize)
                for v in range(1, args.versions + 1):
                    with torch.no_grad():
                        for p in policy.parameters():
                            p.add_(torch.randn_like(p) * 1e-4)
                    t = time.perf_counter()
                    folder = save_checkpoint(policy, work / "weights", v, keep=2, dtype=dtype)
                    save_s = time.perf_counter() - t
                    t = time.perf_counter()
                    loaded = await load_weights(local, folder, v)
                    local_s = time.perf_counter() - t
                    t = time.perf_counter()
                    shipped_loaded = await load_weights(shipped, folder, v)
                    store_s = time.perf_counter() - t
                    rows.append({"version": v, "save_s": save_s, "local_s": local_s, "local_reload_s": loaded.reload_s,
                                 "store_s": store_s, "store_stage_s": stage_s[-1],
                                 "store_reload_s": shipped_loaded.reload_s - stage_s[-1]})
                await shipped.aclose()
                await local.aclose()

            asyncio.run(run())
            puts = fleet.stager.puts if fleet.stager else 0
    finally:
        ray.shutdown()
    size = sum(f.stat().st_size for f in (work / "weights").glob("v*/*")) / max(1, len(list((work / "weights").glob("v*"))))
    shutil.rmtree(work, ignore_errors=True)
    print(f"\n{'fake engine' if args.fake else 'vLLM'}, SmolLM2-135M in {args.dtype}: {size / 1e9:.2f} GB a version, "
          f"{puts} object(s) put (the model + one per version)")
    print(f"{'version':>7} {'save s':>7} | {'local: load s':>13} {'(reload)':>8} | {'object store: load s':>20} "
          f"{'(ship+write)':>12} {'(reload)':>8}")
    for r in rows:
        print(f"{r['version']:>7.0f} {r['save_s']:>7.2f} | {r['local_s']:>13.2f} {r['local_reload_s']:>8.2f} | "
              f"{r['store_s']:>20.2f} {r['store_stage_s']:>12.2f} {r['store_reload_s']:>8.2f}")
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    print(f"{'median':>7} {med['save_s']:>7.2f} | {med['local_s']:>13.2f} {med['local_reload_s']:>8.2f} | "
          f"{med['store_s']:>20.2f} {med['store_stage_s']:>12.2f} {med['store_reload_s']:>8.2f}")
    print(f"sync per version (save + load): single machine {med['save_s'] + med['local_s']:.2f} s, "
          f"object store {med['save_s'] + med['store_s']:.2f} s")


if __name__ == "__main__":
    main()
