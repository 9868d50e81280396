"""Which tasks ``sao-eval`` runs (evals/selection.py, and its use in evals/runner.py and evals/cli.py):
``--instance-ids``, ``--filter``, ``--shuffle``, ``--slice``, ``--limit`` in that order, ``--split``, the
selection in the run's identity for ``--resume``, and sampling seeds that follow the task id, so an
instance keeps its seed under any selection. No engine: the scripted gold agent plays arithmetic."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sao.agents.loop import episode_seed, task_seed
from sao.agents.store import read_trajectories
from sao.evals.cli import main
from sao.evals.runner import ENDLESS_DEFAULT_LIMIT, EvalConfig, candidate_ids, evaluate, plan
from sao.evals.selection import Selection, parse_instance_ids, parse_slice, shuffled
from sao.evals.errors import EvalError

IDS = [f"repo__pkg-{i}" for i in range(10)] + ["other__lib-1", "other__lib-2"]


# -- the selection itself ----------------------------------------------------------------------------


@pytest.mark.parametrize("selection, expected", [
    (Selection(), IDS),
    (Selection(instance_ids=("other__lib-2", "repo__pkg-3")), ["repo__pkg-3", "other__lib-2"]),  # the benchmark's order
    (Selection(filter=r"^other__"), ["other__lib-1", "other__lib-2"]),
    (Selection(filter=r"pkg-[12]$"), ["repo__pkg-1", "repo__pkg-2"]),  # re.search: anywhere in the id
    (Selection(slice=(2, 4)), ["repo__pkg-2", "repo__pkg-3"]),
    (Selection(slice=(None, 2)), ["repo__pkg-0", "repo__pkg-1"]),
    (Selection(slice=(-2, None)), ["other__lib-1", "other__lib-2"]),
    (Selection(slice=(10, 99)), ["other__lib-1", "other__lib-2"]),  # Python's slice: an end past the list is fine
    (Selection(limit=3), IDS[:3]),
    (Selection(limit=99), IDS),
])
def test_each_flag_alone(selection: Selection, expected: list[str]):
    assert selection.apply(IDS) == expected


def test_shuffle_is_a_seeded_permutation_and_an_ids_place_does_not_depend_on_the_others():
    once, again, other = (Selection(shuffle=True, seed=s).apply(IDS) for s in (0, 0, 1))
    assert sorted(once) == sorted(IDS) and once == again and once != IDS and other != once
    fewer = Selection(filter="pkg", shuffle=True, seed=0).apply(IDS)
    assert fewer == [t for t in once if "pkg" in t]  # the same relative order without the filtered-out ids


def test_the_flags_apply_in_order_ids_filter_shuffle_slice_then_limit():
    chosen = IDS[:8] + ["other__lib-1"]
    full = Selection(instance_ids=tuple(chosen), filter="pkg", shuffle=True, seed=3, slice=(1, 6), limit=2)
    step = [t for t in IDS if t in chosen]  # ids
    step = [t for t in step if "pkg" in t]  # then the filter
    step = shuffled(step, 3)  # then the shuffle
    step = step[1:6]  # then the slice
    assert full.apply(IDS) == step[:2]  # then the limit: the slice's first 2, not the list's
    assert Selection(slice=(4, 8), limit=2).apply(IDS) == ["repo__pkg-4", "repo__pkg-5"]


def test_unknown_instance_ids_are_named_with_a_suggestion():
    with pytest.raises(EvalError, match=r"2 id\(s\) not in swe-x: 'repo__pkg-77', 'nope'\. Did you mean 'repo__pkg-7'"):
        Selection(instance_ids=("repo__pkg-77", "repo__pkg-1", "nope")).apply(IDS, source="swe-x")


@pytest.mark.parametrize("selection, message", [
    (Selection(filter="^django"), r"--filter '\^django' matches none of the 12 task id\(s\) of the benchmark"),
    (Selection(filter="lib", slice=(5, None)), r"--slice 5: leaves none of the 2 task id\(s\) .* flags before it"),
    (Selection(slice=(3, 3)), r"--slice 3:3 leaves none of the 12"),
])
def test_a_selection_that_leaves_nothing_says_which_flag(selection: Selection, message: str):
    with pytest.raises(EvalError, match=message):
        selection.apply(IDS)


def test_bad_values_are_eval_errors_that_say_what_to_write(tmp_path: Path):
    with pytest.raises(EvalError, match="not a regular expression"):
        Selection(filter="(unclosed")
    with pytest.raises(EvalError, match="--limit must be >= 1"):
        Selection(limit=0)
    with pytest.raises(EvalError, match="names no instance"):
        Selection(instance_ids=())
    for bad in ("5", "1:2:3", "a:b", "1.5:"):
        with pytest.raises(EvalError, match="--slice"):
            parse_slice(bad)
    assert [parse_slice(t) for t in ("10:20", ":50", "-10:", ":")] == [(10, 20), (None, 50), (-10, None), (None, None)]
    empty = tmp_path / "none.txt"
    empty.write_text("# nothing\n\n")
    with pytest.raises(EvalError, match="names no instance"):
        parse_instance_ids(str(empty))
    with pytest.raises(EvalError, match="no such file"):
        parse_instance_ids(str(tmp_path / "missing.txt"))


def test_instance_ids_from_commas_or_from_a_file(tmp_path: Path):
    assert parse_instance_ids(" a, b,,a ") == ("a", "b")
    listed = tmp_path / "ids"
    listed.write_text("# chosen by hand\nrepo__pkg-3\n\n  other__lib-1  \n")
    assert parse_instance_ids(str(listed)) == ("repo__pkg-3", "other__lib-1")


def test_task_seeds_and_the_shuffle_are_the_same_in_another_process():
    code = ("from sao.agents.loop import task_seed; from sao.evals.selection import shuffled; "
            f"print(task_seed(7, 'django__django-11099', 2), shuffled({IDS!r}, 5))")
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                           env={**os.environ, "PYTHONHASHSEED": salt}) for salt in ("1", "2")]
    assert runs[0].returncode == 0, runs[0].stderr
    assert runs[0].stdout == runs[1].stdout == f"{task_seed(7, 'django__django-11099', 2)} {shuffled(IDS, 5)}\n"
    assert task_seed(7, "django__django-11099", 2) == 282_733_483  # pinned: --resume relies on it


def test_task_seeds_differ_by_run_seed_task_and_sample_and_training_seeds_are_unchanged():
    seeds = {task_seed(s, t, k) for s in (0, 1) for t in IDS for k in range(4)}
    assert len(seeds) == 2 * len(IDS) * 4 and all(0 <= x < 2**31 for x in seeds)
    assert episode_seed(7, 3, 1) == 7_003_049  # training's, by prompt index


def test_an_endless_source_is_selected_from_enough_of_its_stream():
    assert Selection().stream_length(100) == 100 and Selection(limit=5).stream_length(100) == 5
    assert Selection(limit=500).stream_length(100) == 500
    assert Selection(filter="add", limit=5).stream_length(100) == 100
    assert Selection(slice=(150, 160)).stream_length(100) == 160
    assert Selection(slice=(-5, None)).stream_length(100) == 100


# -- in sao-eval -----------------------------------------------------------------------------------


def gold(tmp_path: Path, name: str, **kw) -> EvalConfig:
    return EvalConfig("arithmetic", tmp_path / name, agent="gold", seed=3, **kw)


def seeds_of(cfg: EvalConfig) -> dict[str, int]:
    evaluate(cfg)
    return {t.task_id: t.seed for t in read_trajectories(cfg.output / "trajectories.jsonl")}


def test_an_instance_keeps_its_seed_under_any_selection(tmp_path: Path):
    stream = plan(gold(tmp_path, "plan", limit=6))[0]
    x = stream[4]  # the 5th of the stream
    first = seeds_of(gold(tmp_path, "first", limit=6))
    chosen = seeds_of(gold(tmp_path, "ids", instance_ids=(x, stream[1])))
    op = x.split("-")[0]
    filtered = seeds_of(gold(tmp_path, "filtered", filter=f"^{op}-", shuffle=True, slice=(None, 50)))
    sliced = seeds_of(gold(tmp_path, "sliced", slice=(4, 5)))
    assert len(chosen) == 2 and list(sliced) == [x] and x in filtered and len(filtered) > 1
    assert first[x] == chosen[x] == filtered[x] == sliced[x] == task_seed(3, x, 0)
    assert first[x] != episode_seed(3, 4, 0)  # not the position's seed any more


def test_plan_keeps_the_endless_default_and_reads_further_for_a_slice(tmp_path: Path):
    every, _ = plan(EvalConfig("arithmetic", tmp_path))
    assert len(every) == ENDLESS_DEFAULT_LIMIT
    assert plan(EvalConfig("arithmetic", tmp_path, limit=5))[0] == every[:5]
    later, _ = plan(EvalConfig("arithmetic", tmp_path, slice=(150, 153)))
    assert [t.split("-i")[1] for t in later] == ["150", "151", "152"]
    with pytest.raises(EvalError, match="not in the first 100 tasks of arithmetic"):
        plan(EvalConfig("arithmetic", tmp_path, instance_ids=("add-d1-s0-i100000",)))


def test_split_goes_to_the_environment_and_is_refused_where_there_is_none(tmp_path: Path):
    ids, kwargs = plan(EvalConfig("arithmetic", tmp_path, split="test", limit=3))
    assert kwargs["split"] == "test" and all(t.endswith("-test") for t in ids)
    with pytest.raises(EvalError, match="swe-local takes no split"):
        plan(EvalConfig("swe-local", tmp_path, split="test"))
    with pytest.raises(EvalError, match="both set the split"):
        EvalConfig("arithmetic", tmp_path, split="test", env_args={"split": "train"})


def test_a_resume_with_another_selection_is_refused(tmp_path: Path):
    cfg = gold(tmp_path, "run", filter="^add", shuffle=True, slice=(0, 2))
    evaluate(cfg)
    again = gold(tmp_path, "run", filter="^add", shuffle=True, slice=(0, 2), resume=True)
    assert evaluate(again)["n_episodes"] == 2  # the same selection resumes
    one = plan(cfg)[0][0]
    for other in (dict(filter="^sub"), dict(shuffle=False), dict(slice=(0, 3)), dict(instance_ids=(one,))):
        with pytest.raises(EvalError, match="--resume with a different configuration"):
            evaluate(gold(tmp_path, "run", **{**dict(filter="^add", shuffle=True, slice=(0, 2)), **other}, resume=True))


def test_a_resume_of_a_run_seeded_by_position_is_refused(tmp_path: Path):
    cfg = gold(tmp_path, "old", limit=2)
    evaluate(cfg)
    run = cfg.output / "run.json"
    old = {k: v for k, v in json.loads(run.read_text()).items()
           if k not in ("split", "instance_ids", "filter", "shuffle", "slice", "seeds")}
    run.write_text(json.dumps(old))  # as sao-eval wrote it before selection and task seeds
    with pytest.raises(EvalError, match="seeds: 'episode_seed' -> 'task_seed'.*by their position"):
        evaluate(gold(tmp_path, "old", limit=2, resume=True))


class _Graded:
    """An environment that grades predictions, enough for :func:`candidate_ids`."""

    prediction_grader = staticmethod(lambda env, task_id, patch: {})

    @property
    def unwrapped(self) -> _Graded:
        return self

    def task_ids(self, limit: int | None = None) -> list[str]:
        return IDS[:limit]


def test_grade_only_selects_among_the_predictions_ids(tmp_path: Path):
    preds = tmp_path / "preds.jsonl"
    preds.write_text("".join(json.dumps({"instance_id": t, "model_patch": ""}) + "\n"
                             for t in ("other__lib-1", "repo__pkg-2", "repo__pkg-5")))
    cfg = EvalConfig("swe-local", tmp_path, grade_only=str(preds))
    pool, source = candidate_ids(cfg, _Graded(), "swe-x")
    assert pool == ["repo__pkg-2", "repo__pkg-5", "other__lib-1"]  # the benchmark's order
    assert Selection(filter="pkg", limit=1).apply(pool, source=source) == ["repo__pkg-2"]
    with pytest.raises(EvalError, match=r"not in the predictions of .*preds.jsonl: 'repo__pkg-3'"):
        Selection(instance_ids=("repo__pkg-3",)).apply(pool, source=source)


def test_the_command_line_refuses_a_bad_selection_with_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    ids = tmp_path / "ids.txt"
    ids.write_text(f"{plan(EvalConfig('arithmetic', tmp_path, limit=4))[0][3]}\nsub-d1-s0-i999\n")
    assert main(["arithmetic", "--agent", "gold", "--instance-ids", str(ids), "--output", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert "--instance-ids: 1 id(s) not in the first 100 tasks of arithmetic" in err and ": 'sub-d1-s0-i999'." in err
    assert main(["arithmetic", "--filter", "^nothing", "--output", str(tmp_path / "b")]) == 2
    assert "--filter '^nothing' matches none" in capsys.readouterr().err
    assert main(["arithmetic", "--slice", "1-2", "--output", str(tmp_path / "c")]) == 2
    assert "expected START:END" in capsys.readouterr().err
    assert main(["swe-local", "--split", "test", "--concurrency", "1", "--output", str(tmp_path / "d")]) == 2
    assert "takes no split" in capsys.readouterr().err
    assert not any((tmp_path / d / "trajectories.jsonl").exists() for d in "abcd")
