"""SAO training on SWE tasks: `sao-train env=swe-local` with the real Docker sandboxes and the real vLLM.

The real run is the issue's contract, shortened: 2 policy steps of 2 single rollouts with SmolLM2-135M,
its episodes held to a few short turns (the path is what is tested; SmolLM2 does not fix the bugs, so
the reward is 0 or close to it). It uses the session's vLLM (``engine.base_url``, as
tests/test_train_vllm.py does) and puts its weights back afterwards. Where an episode's time goes
(model calls, container start, tools, grading) is logged with every step and printed.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from sao.agents.records import Trajectory, TurnRecord
from sao.rl.rollout.sources import episode_time_metrics

SAO_TRAIN = str(Path(sys.executable).with_name("sao-train"))


def _trajectory(wall_s: float, turns: list[tuple[float, float]], timing: dict | None) -> Trajectory:
    return Trajectory(
        episode_id="e", env="swe-local", task_id="t", sample=0, seed=0, token_ids=(), action_mask=(), logprobs=(),
        turns=tuple(TurnRecord(0, 0, "stop", None, a, b) for a, b in turns), messages=(), reward=0.0,
        terminated=True, truncated=False, status="ok", info={} if timing is None else {"timing": timing},
        wall_s=wall_s)


def test_episode_time_is_split_into_model_calls_and_the_environments_parts():
    a = _trajectory(10.0, [(1.0, 3.0), (4.0, 5.0)], {"reset_s": 1.0, "tools_s": 2.0, "grading_s": 4.0})
    b = _trajectory(6.0, [(2.0, 6.0)], {"reset_s": 2.0, "tools_s": 0.0})  # cut before grading: none reported
    c = _trajectory(1.0, [], {"reset_s": "?", "flag": True})  # failed at once; non-numbers are not averaged
    m = episode_time_metrics([a, b, c])
    # model calls: a 2 + 1 = 3 s, b 4 s, c 0 s -> mean 7/3; the rest: a 7, b 2, c 1 -> mean 10/3
    assert m["perf/agent_s"] == pytest.approx(7 / 3) and m["perf/env_s"] == pytest.approx(10 / 3)
    # each key over the episodes that report it as a number: reset (1 + 2) / 2, tools (2 + 0) / 2, grading 4 / 1
    assert (m["perf/env_reset_s"], m["perf/env_tools_s"], m["perf/env_grading_s"]) == (1.5, 1.0, 4.0)
    assert "perf/env_flag" not in m and episode_time_metrics([]) == {}


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _untrainable(t: dict) -> bool:
    """sao.rl.learner.trainable.failure on a recorded trajectory: failed, or graded without a verdict."""
    return t["status"] != "ok" or bool(t["info"].get("error")) or bool(t["info"].get("eval_error"))


@pytest.mark.docker
@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.long
@pytest.mark.timeout(1500)  # its sao-train took 189-195 s on a quiet machine, 587 s beside other vLLM tests (load 5-9)
def test_sao_trains_two_steps_on_swe_local(restore_engine, docker_client, tmp_path: Path) -> None:
    from sao.sandboxes import LABEL_KEY, list_labelled

    server = restore_engine
    label = f"pytest-swe-train-{uuid.uuid4().hex[:10]}"
    run_dir = tmp_path / "swe"
    # The command with the episodes held short: 2 turns of at most 64 tokens (the prompt, problem
    # and tools, is about 1,000 tokens of the 2,048 context and dominates the update), no critic-only
    # batch, one trajectory probed on the engine after each sync (a 1,000-token probe costs ~15 s).
    cmd = [SAO_TRAIN, "env=swe-local", "max_steps=2", "batch_size=2", f"output_dir={run_dir}",
           "value_pretrain_steps=0", "env.max_turns=2", "env.max_tokens=128", "env.max_tokens_per_turn=64",
           f"+env.kwargs.label={label}", "keep_checkpoints=1", "logger=[]", "engine.action_probes=1", "engine.probe_every=1",
           f"engine.base_url={server.root_url}", f"engine.served_name={server.model_name}"]
    started = time.time()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1400)
        wall = time.time() - started
        assert proc.returncode == 0, proc.stderr[-4000:]
        config = json.loads((run_dir / "config.json").read_text())
        assert config["env"]["domain"] == "coding"
        assert (config["algo"]["eps_low"], config["algo"]["eps_high"]) == (0.8, 3.0)  # DIS's coding band
        assert config["env"]["max_concurrent"] >= 1  # the container bound, from what the machine holds
        rows = _lines(run_dir / "metrics.jsonl")
        assert [r["step"] for r in rows] == [1, 2]
        for r in rows:  # the contract keys (README), SAO's critic and DIS included
            assert math.isfinite(r["loss/policy"]) and math.isfinite(r["loss/value"])
            assert r["dis/mask_frac"] is not None and 0.0 <= r["dis/mask_frac"] <= 1.0
            assert 0.0 <= r["reward/mean"] <= 1.0 and r["engine/weight_version"] == r["step"]
            assert r["perf/sync_s"] > 0 and r["sync/probe_gap"] < 0.05
            for key in ("perf/agent_s", "perf/env_s", "perf/env_reset_s", "perf/env_container_start_s",
                        "perf/env_tools_s"):
                assert r[key] >= 0, key

        # every episode recorded; the ones without a verdict (failed, grading broke or could not judge) not trained on
        recorded = _lines(run_dir / "trajectories.jsonl")
        assert len(recorded) == 2 * 2
        trained = {(b["step"], e["task_id"], e["sample"], e["prompt_index"])
                   for b in _lines(run_dir / "batches.jsonl") for e in b["episodes"]}
        for t in recorded:
            key = (t["rollout"]["train_step"], t["task_id"], t["sample"], t["rollout"]["prompt_index"])
            assert (key in trained) == (not _untrainable(t)), (key, t["status"], t["error"], t["info"].get("error"))
        graded = [t for t in recorded if t["status"] == "ok"]
        for t in graded:  # the environment graded its diff, whatever ended it (submit, a limit: CutGrading)
            assert isinstance(t["info"]["report"], dict) and t["info"]["correct"] in (True, False)

        # no container left behind, and every one the run created (agents' and graders') was removed
        assert list_labelled(docker_client, f"{LABEL_KEY}={label}") == []
        events = list(docker_client.events(since=int(started) - 1, until=int(time.time()) + 1, decode=True,
                                           filters={"type": "container", "label": f"{LABEL_KEY}={label}"}))
        created = {e["id"] for e in events if e.get("Action") == "create"}
        destroyed = {e["id"] for e in events if e.get("Action") == "destroy"}
        assert len(created) >= len(recorded) and created <= destroyed, (len(created), len(destroyed))

        print(f"\nsao-train env=swe-local: exit 0 in {wall:.0f} s; {len(graded)} of {len(recorded)} episodes graded"
              f", {sum(not _untrainable(t) for t in recorded)} trainable, {len(created)} containers")
        for r in rows:
            print(f"step {r['step']}: {r['perf/step_s']:.1f} s = rollout {r['perf/rollout_s']:.1f} s + update "
                  f"{r['perf/update_s']:.1f} s + sync {r['perf/sync_s']:.2f} s + probes "
                  f"{r.get('perf/probe_s', 0):.1f} s; per episode: model {r['perf/agent_s']:.1f} s, env "
                  f"{r['perf/env_s']:.1f} s (reset "
                  f"{r['perf/env_reset_s']:.2f} s, container start {r['perf/env_container_start_s']:.2f} s, tools "
                  f"{r['perf/env_tools_s']:.2f} s, grading {r.get('perf/env_grading_s', float('nan')):.2f} s); reward "
                  f"{r['reward/mean']:.2f}, mask {r['dis/mask_frac']:.3f}, failed {r['rollout/failed']:.0f}")
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)  # checkpoints are ~1.6 GB
