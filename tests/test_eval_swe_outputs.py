"""evals/swe_outputs.py: the files the SWE-bench tools read (preds.json, predictions.jsonl, report.json,
trajs/), written from synthetic episode records, checked against swebench's own loader and run
report; and the predictions files --grade-only reads (jsonl, a JSON list, preds.json), refusals included.
No container runs here (the end-to-end run is test_eval_swe.py's)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from sao.agents import Trajectory
from sao.agents.records import TurnRecord
from sao.evals.runner import EvalConfig, EvalError, write_swebench_outputs
from sao.evals.swe_outputs import Outcome, SweFiles, episode_in, load_predictions, run_report

PATCH = "diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a = 1\n+a = 2\n"
HARNESS_KEYS = {"total_instances", "submitted_instances", "completed_instances", "resolved_instances",
                "unresolved_instances", "empty_patch_instances", "error_instances", "completed_ids",
                "incomplete_ids", "empty_patch_ids", "submitted_ids", "resolved_ids", "unresolved_ids", "error_ids",
                "schema_version"}
PRED_KEYS = {"instance_id", "model_name_or_path", "model_patch", "exit_status"}  # the harness ignores the last


def episode(instance_id: str, sample: int = 0, *, patch: str | None = PATCH, correct: bool = False, status: str = "ok",
            failure: str | None = None, error: str | None = None, eval_error: str | None = None,
            **info: Any) -> Trajectory:
    """A finished SWE episode as the environment records it (``patch=None``: no ``patch`` in its info)."""
    info = {"instance_id": instance_id, "correct": correct, "error": error, "eval_error": eval_error,
            "exit_status": "submitted", "report": {"status": "resolved" if correct else "unresolved"}, **info}
    if patch is not None:
        info["patch"] = patch
    turn = TurnRecord(prompt_len=2, completion_len=1, finish_reason="stop", weight_version=None, t_start=0.0, t_end=1.0)
    return Trajectory(episode_id=uuid.uuid4().hex, env="swe-local", task_id=instance_id, sample=sample, seed=1,
                      token_ids=(1, 2, 3), action_mask=(0, 0, 1), logprobs=(0.0, 0.0, -0.5), turns=(turn,),
                      messages=({"role": "user", "content": "fix it"}, {"role": "assistant", "content": "done é"}),
                      reward=float(correct), terminated=True, truncated=False, status=status,
                      error=error if status != "ok" else None, info=info, failure=failure)


# one of each outcome, and "f", planned but not run
RECORDS = {
    "a": episode("a", correct=True),
    "b": episode("b"),
    "c": episode("c", patch=""),
    "d": episode("d", patch=None, status="failed", failure="infra_error", error="DockerException: daemon away"),
    "e": episode("e", eval_error="the tests cannot run in this image"),
    "g": episode("g", error="the grading container did not start"),  # ok episode, grading could not run
    "h": episode("h", patch=None, status="failed", failure="env_error", error="ValueError: bug"),
}
PLANNED = ["a", "b", "c", "d", "e", "f", "g", "h"]


def write(tmp_path: Path, records: dict[tuple[str, int], Trajectory], samples: int = 1,
          planned: list[str] = PLANNED) -> SweFiles:
    files = SweFiles(tmp_path, samples, "org/model")
    files.write_all(planned, records)
    return files


def test_outcomes_as_the_harness_counts_them_errors_apart():
    kinds = {i: (Outcome.of(t).kind, Outcome.of(t).error) for i, t in RECORDS.items()}
    assert kinds == {"a": ("resolved", None), "b": ("unresolved", None), "c": ("empty_patch", None),
                     "d": ("error", "infra_error"), "e": ("error", "eval_error"), "g": ("error", "infra_error"),
                     "h": ("error", "env_error")}
    # a diff of white space, or none at all (a loop limit cut the episode before the diff was taken): empty
    assert Outcome.of(episode("x", patch=" \n")) == Outcome("x", 0, "empty_patch", "")
    assert Outcome.of(episode("x", patch=None, truncated_by="max_tokens")).kind == "empty_patch"
    # a failed record written before `failure` existed counts as an infrastructure error
    assert Outcome.of(episode("x", status="failed", error="boom")).error == "infra_error"


def test_preds_json_predictions_jsonl_and_the_run_report(tmp_path: Path):
    write(tmp_path, {(i, 0): t for i, t in RECORDS.items()})
    preds = json.loads((tmp_path / "preds.json").read_text())
    assert list(preds) == ["a", "b", "c"]  # the errors are absent: never an empty patch in their place
    assert all(set(p) == PRED_KEYS and p["model_name_or_path"] == "org/model" for p in preds.values())
    assert [preds[i]["model_patch"] for i in "abc"] == [PATCH, PATCH, ""]
    assert [preds[i]["exit_status"] for i in "abc"] == ["submitted"] * 3  # each episode's, from its info
    rows = [json.loads(line) for line in (tmp_path / "predictions.jsonl").read_text().splitlines()]
    assert rows == [{**preds[i], "sample": 0} for i in "abc"]
    report = json.loads((tmp_path / "report.json").read_text())
    assert set(report) == HARNESS_KEYS | {"error_kinds"}
    assert report == {
        "total_instances": 8, "submitted_instances": 7, "completed_instances": 2, "resolved_instances": 1,
        "unresolved_instances": 1, "empty_patch_instances": 1, "error_instances": 4,
        "completed_ids": ["a", "b"], "incomplete_ids": ["f"], "empty_patch_ids": ["c"],
        "submitted_ids": ["a", "b", "c", "d", "e", "g", "h"], "resolved_ids": ["a"], "unresolved_ids": ["b"],
        "error_ids": ["d", "e", "g", "h"], "schema_version": 2,
        "error_kinds": {"d": "infra_error", "e": "eval_error", "g": "infra_error", "h": "env_error"}}
    assert not (tmp_path / "preds.sample0.json").exists()
    assert {p.name for p in (tmp_path / "trajs").iterdir()} == {f"{i}.traj.json" for i in RECORDS}
    assert json.loads((tmp_path / "reports" / "d.json").read_text())["error"] == "DockerException: daemon away"


def test_the_harness_loads_preds_json_and_reports_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """swebench's own loader reads both predictions files; its run report over preds.json, given the
    verdicts sao found, has our report's keys and ids (an error of ours is incomplete there: no prediction)."""
    from swebench.harness.constants import LOG_REPORT, RUN_EVALUATION_LOG_DIR
    from swebench.harness.reporting import make_run_report
    from swebench.harness.utils import get_predictions_from_file

    out = tmp_path / "out"
    out.mkdir()
    write(out, {(i, 0): t for i, t in RECORDS.items()})
    loaded = get_predictions_from_file(str(out / "preds.json"), "SWE-bench/SWE-bench_Verified", "test")
    assert loaded == list(json.loads((out / "preds.json").read_text()).values())
    jsonl = get_predictions_from_file(str(out / "predictions.jsonl"), "SWE-bench/SWE-bench_Verified", "test")
    assert [{k: p[k] for k in PRED_KEYS} for p in jsonl] == loaded
    ours = json.loads((out / "report.json").read_text())
    monkeypatch.chdir(tmp_path)
    for iid in ours["completed_ids"]:  # what the harness's grading would leave for the instances it ran
        log_dir = RUN_EVALUATION_LOG_DIR / "r1" / "org__model" / iid
        log_dir.mkdir(parents=True)
        (log_dir / LOG_REPORT).write_text(json.dumps({iid: {"resolved": iid in ours["resolved_ids"]}}))
    harness = json.loads(make_run_report({p["instance_id"]: p for p in loaded},
                                         [{"instance_id": i} for i in PLANNED], "r1").read_text())
    assert HARNESS_KEYS <= set(harness)  # it adds unstopped_* and unremoved_images without a Docker client
    for key in ("completed_ids", "resolved_ids", "unresolved_ids", "empty_patch_ids", "total_instances",
                "schema_version"):
        assert harness[key] == ours[key], key
    assert harness["incomplete_ids"] == sorted(ours["incomplete_ids"] + ours["error_ids"])
    assert harness["submitted_ids"] == sorted(set(ours["submitted_ids"]) - set(ours["error_ids"]))


def test_several_samples_get_a_file_each(tmp_path: Path):
    records = {("a", 0): episode("a", correct=True), ("a", 1): episode("a", 1),
               ("b", 0): episode("b", eval_error="cannot judge"), ("b", 1): episode("b", 1, patch="")}
    write(tmp_path, records, samples=2, planned=["a", "b"])
    for name in ("preds.json", "predictions.jsonl", "report.json"):
        assert not (tmp_path / name).exists()  # one file per instance cannot hold two predictions
    preds = [json.loads((tmp_path / f"preds.sample{s}.json").read_text()) for s in (0, 1)]
    assert [list(p) for p in preds] == [["a"], ["a", "b"]]
    assert preds[1]["b"]["model_patch"] == ""
    rows = [json.loads(line) for line in (tmp_path / "predictions.sample1.jsonl").read_text().splitlines()]
    assert [(r["instance_id"], r["sample"]) for r in rows] == [("a", 1), ("b", 1)]
    reports = [json.loads((tmp_path / f"report.sample{s}.json").read_text()) for s in (0, 1)]
    assert (reports[0]["resolved_ids"], reports[0]["error_ids"]) == (["a"], ["b"])
    assert (reports[1]["unresolved_ids"], reports[1]["empty_patch_ids"], reports[1]["error_ids"]) == (["a"], ["b"], [])
    assert {p.name for p in (tmp_path / "trajs").iterdir()} == {"a.0.traj.json", "a.1.traj.json", "b.0.traj.json",
                                                                "b.1.traj.json"}
    assert {p.name for p in (tmp_path / "reports").iterdir()} == {"a.0.json", "a.1.json", "b.0.json", "b.1.json"}


def test_a_trajectory_file_is_readable_json_without_the_token_arrays(tmp_path: Path):
    files = SweFiles(tmp_path, 1, "m")
    t = episode("o/r-1", correct=True)  # a '/' in an id does not make a folder
    files.write_traj(t)
    path = tmp_path / "trajs" / "o__r-1.traj.json"
    text = path.read_text()
    assert "\n" in text.strip() and "é" in text  # indented, and the text as it is
    record = json.loads(text)
    assert list(record)[:6] == ["episode_id", "trajectory_format", "instance_id", "sample", "exit_status", "model_patch"]
    assert (record["instance_id"], record["exit_status"], record["model_patch"], record["reward"]) == \
        ("o/r-1", "submitted", PATCH, 1.0)
    assert record["messages"][1]["content"] == "done é" and record["turns"][0]["finish_reason"] == "stop"
    assert record["info"]["correct"] is True and record["n_tokens"] == 3
    assert not {"token_ids", "action_mask", "logprobs"} & set(record)
    assert episode_in(path) == t.episode_id and episode_in(tmp_path / "nothing") is None


def test_the_end_of_a_run_writes_the_missing_and_stale_trajectory_files_only(tmp_path: Path):
    files = SweFiles(tmp_path, 1, "m")
    first, kept, rerun = episode("a", status="failed", failure="infra_error", error="x"), episode("b"), episode("a")
    files.write_traj(first)
    files.write_traj(kept)
    kept_path = tmp_path / "trajs" / "b.traj.json"
    kept_path.write_text(kept_path.read_text().replace('"fix it"', '"untouched"'))
    files.write_all(["a", "b", "c"], {("a", 0): rerun, ("b", 0): kept, ("c", 0): episode("c")})
    assert episode_in(tmp_path / "trajs" / "a.traj.json") == rerun.episode_id  # stale: the rerun replaced it
    assert "untouched" in kept_path.read_text()  # the same episode: not written again
    assert episode_in(tmp_path / "trajs" / "c.traj.json") is not None  # missing (a crash after the record)


def test_a_resumed_run_rebuilds_the_files_from_the_records(tmp_path: Path):
    """Through the runner: an interrupted run's records, then a --resume's, give the files that the
    records say, however the trajectory files were left (none, or an earlier attempt's)."""
    cfg = EvalConfig("swe-local", tmp_path, agent="gold")
    failed = episode("a", patch=None, status="failed", failure="infra_error", error="DockerException: away")
    lines = [failed, episode("b", correct=True)]
    (tmp_path / "trajectories.jsonl").write_text("".join(t.to_json() + "\n" for t in lines))
    SweFiles(tmp_path, 1, "sao-gold").write_traj(failed)
    write_swebench_outputs(cfg, ["a", "b", "c"])
    assert list(json.loads((tmp_path / "preds.json").read_text())) == ["b"]
    report = json.loads((tmp_path / "report.json").read_text())
    assert (report["error_ids"], report["incomplete_ids"], report["resolved_ids"]) == (["a"], ["c"], ["b"])
    rerun = episode("a", correct=True)  # --resume: the failed one again, and the one not run
    with (tmp_path / "trajectories.jsonl").open("a") as fh:
        fh.write(rerun.to_json() + "\n" + episode("c", patch="").to_json() + "\n")
    write_swebench_outputs(cfg, ["a", "b", "c"])
    preds = json.loads((tmp_path / "preds.json").read_text())
    assert list(preds) == ["a", "b", "c"] and preds["a"]["model_name_or_path"] == "sao-gold"
    assert len((tmp_path / "predictions.jsonl").read_text().splitlines()) == 3  # rebuilt, not appended
    report = json.loads((tmp_path / "report.json").read_text())
    assert (report["resolved_ids"], report["empty_patch_ids"], report["error_ids"]) == (["a", "b"], ["c"], [])
    assert episode_in(tmp_path / "trajs" / "a.traj.json") == rerun.episode_id
    assert sorted(p.name for p in (tmp_path / "trajs").iterdir()) == ["a.traj.json", "b.traj.json", "c.traj.json"]


# -- --grade-only's predictions files ---------------------------------------------------------------------


def test_grade_only_reads_the_three_formats(tmp_path: Path):
    rows = [{"instance_id": "a", "model_patch": PATCH, "model_name_or_path": "m"},
            {"instance_id": "b", "model_patch": None}, {"instance_id": 7, "model_patch": ""}]
    want = {"a": PATCH, "b": "", "7": ""}
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n")  # a blank line is skipped
    listed = tmp_path / "p.json"
    listed.write_text(json.dumps(rows))
    keyed = tmp_path / "preds.json"
    keyed.write_text(json.dumps({"a": rows[0], "b": {"model_patch": None}, "7": rows[2]}))  # the key names it
    assert load_predictions(str(jsonl)) == load_predictions(str(listed)) == load_predictions(str(keyed)) == want
    (tmp_path / "out").mkdir()
    write(tmp_path / "out", {(i, 0): t for i, t in RECORDS.items()})  # what sao-eval writes reads back
    assert load_predictions(str(tmp_path / "out" / "preds.json")) == {"a": PATCH, "b": PATCH, "c": ""}


@pytest.mark.parametrize("name, content, message", [
    ("p.csv", "instance_id,model_patch\na,x\n", r"a predictions file is a \.jsonl file"),
    ("p.json", "{not json", r"not JSON"),
    ("p.json", '"a"', r"holds a JSON str"),
    ("p.json", '{"instance_id": "a", "model_patch": "x"}', r"entry 'instance_id' is a JSON str, not a prediction"),
    ("p.json", '{"a": {"instance_id": "b", "model_patch": "x"}}', r"entry 'a' holds instance_id 'b'"),
    ("p.json", '{"a": {"model_patch": "x"}, "a": {"model_patch": "y"}}', r"key 'a' appears twice"),
    ("p.json", '[{"instance_id": "a", "model_patch": "x"}, {"instance_id": "a", "model_patch": "y"}]',
     r"row 2: instance_id 'a' appears twice"),
    ("p.json", '[{"instance_id": "a", "model_patch": "x"}, ["a"]]', r"row 2 is a JSON list"),
    ("p.json", '{"a": {"model_patch": 3}}', r"entry 'a': 'model_patch' must be a string \(a diff\) or null, got int"),
    ("p.json", "[]", r"holds no predictions"),
    ("p.jsonl", '{"instance_id": "a", "model_patch": "x"}\n{"instance_id": "a", "model_patch": "x"}\n',
     r"row 2: instance_id 'a' appears twice"),
    ("p.jsonl", '{"instance_id": "a", "model_patch": {"diff": "x"}}\n', r"row 1: 'model_patch' must be a string"),
    ("p.jsonl", '{"instance_id": "a"}\n', r"row 1: field 'model_patch' is missing"),
    ("p.jsonl", '{"model_patch": "x"}\n', r"row 1: field 'instance_id' is missing"),
    ("p.jsonl", '{"instance_id": " ", "model_patch": "x"}\n', r"row 1: field 'instance_id' is empty"),
    ("p.jsonl", '{"instance_id": "a", "model_patch": "x"}\n[1]\n', r"row 2 \(line 2\) is a JSON list"),
    ("p.jsonl", '{"instance_id": "a", "model_patch": "x"', r"row 1 \(line 1\) is not a JSON object"),
    ("p.jsonl", "\n", r"holds no predictions"),
])
def test_grade_only_refuses_a_file_it_cannot_read_as_predictions(tmp_path: Path, name: str, content: str,
                                                                 message: str):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(EvalError, match=message):
        load_predictions(str(path))
    with pytest.raises(EvalError, match="no such file"):
        load_predictions(str(tmp_path / "missing.jsonl"))


def test_sao_eval_grade_only_exits_2_on_a_bad_predictions_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    from sao.envs.swebench.instances import HARNESS_FIELDS
    from sao.evals.cli import main

    row = {**{f: "x" for f in HARNESS_FIELDS}, "instance_id": "o__r-1", "repo": "someone/unknown",
           "FAIL_TO_PASS": '["t::a"]', "PASS_TO_PASS": "[]", "test_cmd": "pytest -rA",
           "log_parser": "parse_log_pytest"}
    (tmp_path / "instances.jsonl").write_text(json.dumps(row) + "\n")  # a local copy: no Docker to list it
    bad = tmp_path / "preds.json"
    bad.write_text(json.dumps({"o__r-1": {"model_patch": ["not", "a", "diff"]}}))
    assert main(["swe-bench-lite", "--data", str(tmp_path / "instances.jsonl"), "--grade-only", str(bad),
                 "--concurrency", "1", "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "entry 'o__r-1': 'model_patch' must be a string" in err
    assert not (tmp_path / "o" / "trajectories.jsonl").exists()


def test_run_report_of_nothing_run_yet():
    assert run_report(["a", "b"], {})["incomplete_ids"] == ["a", "b"]
    assert run_report(["a", "b"], {})["submitted_instances"] == 0


def test_the_files_get_the_permissions_of_any_file(tmp_path: Path):
    import os

    write(tmp_path, {("a", 0): RECORDS["a"]}, planned=["a"])
    mask = os.umask(0)
    os.umask(mask)
    for name in ("preds.json", "report.json", "trajs/a.traj.json"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o666 & ~mask, name
    assert not [p for p in tmp_path.rglob(".*.tmp")]  # no temporary file left
