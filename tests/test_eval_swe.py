"""`sao-eval` on SWE tasks with scripted agents (real Docker, real swebench grading), and on math without a model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import shared_file

SAO_EVAL = str(Path(sys.executable).with_name("sao-eval"))


def _ours(client) -> list:
    from sao.sandboxes import LABEL_KEY, list_labelled

    return list_labelled(client, LABEL_KEY)


@pytest.mark.docker
@pytest.mark.part("sao-eval", "docker")
@pytest.mark.parametrize("agent, resolved", [("gold", "all"), ("empty", 0)])
def test_sao_eval_swe_local_scripted_agents(docker_client, tmp_path, agent, resolved):
    out = tmp_path / agent
    proc = subprocess.run([SAO_EVAL, "swe-local", "--agent", agent, "--concurrency", "2", "--output", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n_instances"] >= 5 and summary["infra_errors"] == 0 and summary["eval_errors"] == 0
    assert summary["resolved"] == (summary["n_instances"] if resolved == "all" else 0)
    assert summary["model"] is None and summary["agent"] == agent  # no model acted
    assert not (out / "vllm.log").exists()  # no engine for a scripted agent
    trajectories = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert all(t["info"]["report"] for t in trajectories if agent == "gold")
    # the files SWE-bench's tools read (sao.evals.swe_outputs) agree with the summary and with each other
    ids = sorted(t["task_id"] for t in trajectories)
    preds = json.loads((out / "preds.json").read_text())
    assert sorted(preds) == ids and all(p["model_name_or_path"] == f"sao-{agent}" for p in preds.values())
    assert all(bool(p["model_patch"]) == (agent == "gold") for p in preds.values())
    report = json.loads((out / "report.json").read_text())
    assert (report["total_instances"], report["submitted_ids"], report["error_ids"]) == (len(ids), ids, [])
    assert report["resolved_instances"] == summary["resolved"]
    assert report["resolved_ids" if agent == "gold" else "empty_patch_ids"] == ids
    assert sorted(p.name for p in (out / "trajs").iterdir()) == [f"{i}.traj.json" for i in ids]
    assert _ours(docker_client) == []


def test_partial_swebench_copy_names_the_missing_fields(tmp_path):
    data = shared_file("swebench_partial/swebench_verified.jsonl")
    proc = subprocess.run([SAO_EVAL, "swe-bench-verified", "--data", str(data), "--limit", "1", "--output",
                           str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    for field in ("test_patch", "FAIL_TO_PASS", "PASS_TO_PASS", "version", "environment_setup_commit"):
        assert field in proc.stderr


def test_math_gold_agent_needs_no_engine(tmp_path):
    out = tmp_path / "gold"
    proc = subprocess.run([SAO_EVAL, "beyond-aime", "--data", str(shared_file("beyond_aime.jsonl")), "--agent", "gold",
                           "--limit", "10", "--output", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["pass@1"] == 1.0 and summary["resolved"] == 10 and summary["tokens_generated"] == 0
    proc = subprocess.run([SAO_EVAL, "beyond-aime", "--data", str(shared_file("beyond_aime.jsonl")), "--agent",
                           "empty", "--limit", "3", "--output", str(tmp_path / "empty")], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and json.loads((tmp_path / "empty" / "summary.json").read_text())["pass@1"] == 0.0


@pytest.mark.docker
def test_grade_only_predictions_reports_and_a_missing_image(docker_client, tmp_path):
    from sao.envs.swebench import build_local_tasks, load_instances

    instances = load_instances(build_local_tasks())[:3]
    predictions = tmp_path / "predictions.jsonl"
    rows = [{"instance_id": instances[0].instance_id, "model_patch": instances[0].patch, "model_name_or_path": "m"},
            {"instance_id": instances[1].instance_id, "model_patch": "", "model_name_or_path": "m"},
            {"instance_id": instances[2].instance_id, "model_patch": instances[2].patch, "model_name_or_path": "m"}]
    predictions.write_text("".join(json.dumps(r) + "\n" for r in rows))
    image_map = tmp_path / "images.json"
    image_map.write_text(json.dumps({instances[2].instance_id: "sao-no-such-image:missing"}))
    out = tmp_path / "graded"
    proc = subprocess.run([SAO_EVAL, "swe-local", "--grade-only", str(predictions), "--image-map", str(image_map),
                           "--output", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stderr[-3000:]  # an infrastructure error is reported, not hidden
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["n_instances"], summary["resolved"], summary["infra_errors"]) == (3, 1, 1)
    assert summary["model"] is None and summary["eval_errors"] == 0
    reports = {p.stem: json.loads(p.read_text()) for p in (out / "reports").glob("*.json")}
    assert reports[instances[0].instance_id]["resolved"] is True
    assert reports[instances[1].instance_id]["report"]["status"] == "empty_patch"
    missing = reports[instances[2].instance_id]
    assert missing["resolved"] is False and "sao-no-such-image" in missing["error"]
    # the instance that could not be graded has no prediction (an empty one would read as unresolved)
    predicted = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert [p["instance_id"] for p in predicted] == sorted(i.instance_id for i in instances[:2])
    assert sorted(json.loads((out / "preds.json").read_text())) == sorted(i.instance_id for i in instances[:2])
    report = json.loads((out / "report.json").read_text())
    assert (report["resolved_ids"], report["empty_patch_ids"], report["error_ids"]) == \
        ([instances[0].instance_id], [instances[1].instance_id], [instances[2].instance_id])
    assert report["error_kinds"] == {instances[2].instance_id: "infra_error"}
    assert _ours(docker_client) == []


@pytest.mark.docker
def test_max_steps_cuts_and_grades(docker_client, tmp_path):
    out = tmp_path / "steps"
    # the gold agent needs 3 steps (create, apply, submit); with 2 it is cut before submitting, then graded
    proc = subprocess.run([SAO_EVAL, "swe-local", "--agent", "gold", "--limit", "1", "--max-steps", "2",
                           "--output", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (t,) = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert t["truncated"] and t["terminated"] and t["info"]["exit_status"] == "max_steps" and t["info"]["correct"] is True


def test_swe_concurrency_defaults_to_the_containers_the_machine_holds():
    from sao.evals.cli import default_concurrency
    from sao.sandboxes import container_slots

    assert default_concurrency("swe-local") == container_slots() <= 2 * (os.cpu_count() or 1)
    assert default_concurrency("swe-bench-verified") == container_slots()
    assert default_concurrency("arithmetic") == 32
