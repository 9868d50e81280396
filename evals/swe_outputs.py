"""The files of a SWE evaluation that the SWE-bench ecosystem reads (swebench's harness, sb-cli, the
tools of mini-swe-agent and SWE-agent), built from sao's recorded episodes; and the predictions files
that ``--grade-only`` reads.

In ``--output`` (``S`` below: the sample index, ``sample`` in ``trajectories.jsonl``, 0 to N-1):

* ``preds.json``: ``{instance_id: {"instance_id", "model_name_or_path", "model_patch", "exit_status"}}``,
  the object that ``python -m swebench.harness.run_evaluation --predictions_path preds.json`` and sb-cli
  read (the harness reads the first three and ignores ``exit_status``: how the episode ended, as
  mini-swe-agent's preds.json says it, e.g. ``submitted`` or ``max_turns``);
* ``predictions.jsonl``: the same predictions, one a line, each with its ``sample`` too;
* ``report.json``: the harness's run report (the keys of ``swebench.harness.reporting.make_run_report``,
  ``schema_version`` 2) from sao's own grading, see :func:`run_report`;
* ``trajs/INSTANCE_ID.traj.json``: each episode's record as readable JSON (:func:`traj_record`),
  written as the episode ends;
* ``reports/INSTANCE_ID.json``: each instance's grading report (sao's own).

With ``--samples N > 1`` an instance has N predictions, and a predictions file holds one per instance
(the harness keeps the last of two silently): each sample gets its own ``preds.sampleS.json``,
``predictions.sampleS.jsonl`` and ``report.sampleS.json``, and ``trajs/INSTANCE_ID.S.traj.json``,
``reports/INSTANCE_ID.S.json``; there is no ``preds.json``, ``predictions.jsonl`` or ``report.json``.

An episode that could not be judged (an infrastructure error in the agent's or the grading container,
an ``eval_error``, an error of the environment's own code) has no prediction: it is left out of the
predictions files and listed in the report's ``error_ids``. Written as an empty patch, the harness
would count it unresolved, a silent wrong score. Its patch, if it has one, stays in its trajectory.

The predictions files and the reports are rebuilt from ``trajectories.jsonl`` at the end of every
invocation (``--resume`` included), never appended to; a trajectory file missing or left stale by an
interrupted run is written then too. A resumed run ends with the files an uninterrupted one writes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sao.agents import Trajectory

from .errors import EvalError

log = logging.getLogger(__name__)

PREDS, PREDICTIONS, REPORT, TRAJS, REPORTS = "preds.json", "predictions.jsonl", "report.json", "trajs", "reports"
OUTCOMES = ("resolved", "unresolved", "empty_patch", "error")
HARNESS_SCHEMA = 2  # make_run_report's schema_version (swebench 4.1)
TRAJ_FORMAT = "sao-traj-1"


@dataclass(frozen=True)
class Outcome:
    """What one recorded episode counts as in the harness's terms: ``kind`` is one of :data:`OUTCOMES`;
    ``error`` says why for an ``error`` (``infra_error``, ``eval_error`` or ``env_error``)."""

    instance_id: str
    sample: int
    kind: str
    patch: str  # "" for an empty patch; an error's patch is kept here but written nowhere
    error: str | None = None
    exit_status: str | None = field(default=None, compare=False)  # the episode's (info), for preds.json

    @classmethod
    def of(cls, t: Trajectory) -> Outcome:
        patch = t.info.get("patch") or ""
        patch = patch if isinstance(patch, str) else str(patch)
        error, ended = error_kind(t), t.info.get("exit_status")
        if error is not None:
            return cls(t.task_id, t.sample, "error", patch, error, ended)
        if not patch.strip():  # no diff (also one a limit cut before it was taken): as the harness counts it
            return cls(t.task_id, t.sample, "empty_patch", "", exit_status=ended)
        return cls(t.task_id, t.sample, "resolved" if t.correct else "unresolved", patch, exit_status=ended)


def error_kind(t: Trajectory) -> str | None:
    """Why ``t`` could not be judged (None when it was), as the summary counts it: a failed episode
    (``infra_error``, or ``env_error``), grading that could not run (``infra_error``) or judge
    (``eval_error``)."""
    if t.status != "ok":
        return t.failure or "infra_error"  # a record older than the field: an infrastructure error
    if t.info.get("error"):
        return "infra_error"
    if t.info.get("eval_error"):
        return "eval_error"
    return None


@dataclass(frozen=True)
class Prediction:
    """One prediction in swebench's format."""

    instance_id: str
    model_name_or_path: str
    model_patch: str
    exit_status: str | None = None  # how the episode ended (trajectory info's); the harness ignores it

    def harness(self) -> dict[str, str | None]:
        return {"instance_id": self.instance_id, "model_name_or_path": self.model_name_or_path,
                "model_patch": self.model_patch, "exit_status": self.exit_status}


def patch_benchmark(benchmark: str) -> bool:
    """Whether ``benchmark``'s episodes end with a patch to grade (a coding benchmark: SWE)."""
    from sao.envs import resolve

    return resolve(benchmark).domain == "coding"


def model_name_or_path(agent: str, model: str, grade_only: str | None) -> str:
    """The predictions' ``model_name_or_path``: the model, or who made the patches when no model acted."""
    if grade_only is not None:
        return f"grade-only:{Path(grade_only).name}"
    return model if agent == "llm" else f"sao-{agent}"


def run_report(instance_ids: Sequence[str], outcomes: Mapping[str, Outcome]) -> dict[str, Any]:
    """The harness's run report (``make_run_report``'s keys and meaning) of one sample's ``outcomes``
    (by instance id) over the planned ``instance_ids``.

    ``submitted``: the instances an episode was recorded for; ``incomplete``: the others (not run
    yet). ``completed``: judged by the tests, ``resolved`` or ``unresolved``; ``empty_patch``: no diff;
    ``error``: could not be judged (see :func:`error_kind`; ``error_kinds`` says which, by instance).
    preds.json holds the submitted instances less ``error_ids``. (``make_run_report`` called without a
    Docker client adds ``unstopped_*`` and ``unremoved_images``; ``run_evaluation`` passes one, and its
    report has the keys here but ``error_kinds``.)
    """
    planned = list(dict.fromkeys(instance_ids))
    ids = {kind: sorted(i for i in planned if i in outcomes and outcomes[i].kind == kind) for kind in OUTCOMES}
    submitted = sorted(i for i in planned if i in outcomes)
    completed = sorted(ids["resolved"] + ids["unresolved"])
    return {
        "total_instances": len(planned),
        "submitted_instances": len(submitted),
        "completed_instances": len(completed),
        "resolved_instances": len(ids["resolved"]),
        "unresolved_instances": len(ids["unresolved"]),
        "empty_patch_instances": len(ids["empty_patch"]),
        "error_instances": len(ids["error"]),
        "completed_ids": completed,
        "incomplete_ids": sorted(i for i in planned if i not in outcomes),
        "empty_patch_ids": ids["empty_patch"],
        "submitted_ids": submitted,
        "resolved_ids": ids["resolved"],
        "unresolved_ids": ids["unresolved"],
        "error_ids": ids["error"],
        "schema_version": HARNESS_SCHEMA,
        "error_kinds": {i: outcomes[i].error for i in ids["error"]},  # sao's: why each could not be judged
    }


def traj_record(t: Trajectory) -> dict[str, Any]:
    """An episode as ``trajs/*.traj.json`` holds it: its record in ``trajectories.jsonl`` less the token
    arrays (``n_tokens`` counts them), led by the episode id, the instance, the sample, the exit status."""
    record = asdict(t)
    n_tokens = len(record.pop("token_ids"))
    record.pop("action_mask")
    record.pop("logprobs")
    head = {"episode_id": record.pop("episode_id"), "trajectory_format": TRAJ_FORMAT, "instance_id": t.task_id,
            "sample": t.sample, "exit_status": t.info.get("exit_status"), "model_patch": t.info.get("patch")}
    return {**head, **record, "n_tokens": n_tokens}


def write_atomic(path: Path, text: str) -> None:
    """``text`` into ``path`` through a temporary file renamed over it: a reader (or a crash) never sees half.
    (Opened as any file is, so that it gets the permissions the umask gives, not mkstemp's 0600.)"""
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")
    try:
        with tmp.open("x", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def file_name(instance_id: str) -> str:
    """An instance id as a file name (a ``/`` becomes ``__``, as the harness names its log folders)."""
    return instance_id.replace("/", "__").replace(os.sep, "__")


@dataclass(frozen=True)
class SweFiles:
    """The SWE files of one run in ``output``: where each goes, and their writers."""

    output: Path
    samples: int
    model_name_or_path: str

    def path(self, stem: str, suffix: str, sample: int) -> Path:
        """``stem + suffix`` with one sample; ``stem.sampleS + suffix`` with several (one file per sample)."""
        return self.output / (f"{stem}{suffix}" if self.samples == 1 else f"{stem}.sample{sample}{suffix}")

    def traj_path(self, instance_id: str, sample: int) -> Path:
        tail = "" if self.samples == 1 else f".{sample}"
        return self.output / TRAJS / f"{file_name(instance_id)}{tail}.traj.json"

    def report_path(self, instance_id: str, sample: int) -> Path:
        tail = "" if self.samples == 1 else f".{sample}"
        return self.output / REPORTS / f"{file_name(instance_id)}{tail}.json"

    def write_traj(self, t: Trajectory) -> None:
        """``trajs/``'s file of the episode ``t``, written as it ends; a file that cannot be written is
        logged (the run goes on, and the end of the run writes it again or fails with the reason)."""
        try:
            self._write_traj(t)
        except OSError as exc:
            log.warning("%s cannot be written (%s); the end of the run tries again",
                        self.traj_path(t.task_id, t.sample), exc)

    def _write_traj(self, t: Trajectory) -> None:
        path = self.traj_path(t.task_id, t.sample)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(traj_record(t), indent=1, ensure_ascii=False, default=str) + "\n")

    def write_all(self, instance_ids: Sequence[str], records: Mapping[tuple[str, int], Trajectory]) -> None:
        """Every file, rebuilt from ``records`` (the episode that counts per (instance, sample) pair) over
        the planned ``instance_ids``: per sample the predictions and the run report; per episode its
        grading report, and its trajectory file when it is missing or holds another episode."""
        planned = set(instance_ids)
        for sample in range(self.samples):
            outcomes = {i: Outcome.of(records[(i, sample)]) for i in instance_ids if (i, sample) in records}
            self.write_sample(sample, instance_ids, outcomes)
        kept = [t for (instance_id, _), t in sorted(records.items()) if instance_id in planned]
        if kept:
            (self.output / REPORTS).mkdir(exist_ok=True)
        for t in kept:
            write_atomic(self.report_path(t.task_id, t.sample), json.dumps(instance_report(t), indent=2) + "\n")
            if episode_in(self.traj_path(t.task_id, t.sample)) != t.episode_id:
                self._write_traj(t)

    def write_sample(self, sample: int, instance_ids: Sequence[str], outcomes: Mapping[str, Outcome]) -> None:
        """One sample's ``preds.json``, ``predictions.jsonl`` and ``report.json`` (per-sample names with
        several samples); the episodes that could not be judged have no prediction."""
        preds = [Prediction(i, self.model_name_or_path, o.patch, o.exit_status) for i, o in sorted(outcomes.items())
                 if o.kind != "error"]
        write_atomic(self.path("preds", ".json", sample),
                     json.dumps({p.instance_id: p.harness() for p in preds}, indent=2) + "\n")
        write_atomic(self.path("predictions", ".jsonl", sample),
                     "".join(json.dumps({**p.harness(), "sample": sample}) + "\n" for p in preds))
        write_atomic(self.path("report", ".json", sample),
                     json.dumps(run_report(instance_ids, outcomes), indent=2) + "\n")


def instance_report(t: Trajectory) -> dict[str, Any]:
    """``reports/INSTANCE_ID.json``: the episode's grading, as sao reports it."""
    return {"instance_id": t.task_id, "sample": t.sample, "resolved": bool(t.info.get("correct")),
            "error": t.info.get("error") or t.error, "exit_status": t.info.get("exit_status"),
            "image": t.info.get("image"), "image_source": t.info.get("image_source"),
            "report": t.info.get("report")}


_EPISODE_ID = re.compile(r'^\{\s*"episode_id":\s*("(?:[^"\\]|\\.)*")')


def episode_in(path: Path) -> str | None:
    """The episode id a trajectory file holds (its first key, read from its head), None when there is
    no such file or it cannot be read."""
    try:
        with path.open(encoding="utf-8", errors="replace") as fh:
            found = _EPISODE_ID.match(fh.read(1024))
    except OSError:
        return None
    return json.loads(found.group(1)) if found else None


# -- reading predictions (--grade-only) ------------------------------------------------------------------

FORMATS = ("a .jsonl file (one prediction a line), or a .json file holding a list of predictions or an object "
           "of them keyed by instance_id (preds.json)")


class _DuplicateKey(ValueError):
    def __init__(self, key: str):
        super().__init__(f"key {key!r} appears twice")
        self.key = key


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json's ``object_pairs_hook``: an object, refused when a key appears twice (json keeps the last)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def load_predictions(path: str) -> dict[str, str]:
    """``instance_id -> model_patch`` (a null patch: "") from a predictions file in the formats swebench's
    harness reads: jsonl, a JSON list of predictions, or preds.json's object keyed by instance id. A file
    that is none of these, an instance twice, a prediction without ``model_patch`` or with one that is
    not a string (or null) is an :class:`EvalError` that names the row."""
    out: dict[str, str] = {}
    for where, row in prediction_rows(Path(path)):
        instance_id = _instance_id(path, where, row)
        if "model_patch" not in row:
            raise EvalError(f"{path}: {where}: field 'model_patch' is missing")
        patch = row["model_patch"]
        if patch is not None and not isinstance(patch, str):
            raise EvalError(f"{path}: {where}: 'model_patch' must be a string (a diff) or null, "
                            f"got {type(patch).__name__}")
        if instance_id in out:  # which of the two would be graded?
            raise EvalError(f"{path}: {where}: instance_id {instance_id!r} appears twice; keep one prediction "
                            "per instance")
        out[instance_id] = patch or ""
    if not out:
        raise EvalError(f"{path}: holds no predictions")
    return out


def _instance_id(path: str, where: str, row: Mapping[str, Any]) -> str:
    value = row.get("instance_id")
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        state = "missing" if "instance_id" not in row else f"a {type(value).__name__}, not text"
        raise EvalError(f"{path}: {where}: field 'instance_id' is {state}")
    if not str(value).strip():
        raise EvalError(f"{path}: {where}: field 'instance_id' is empty")
    return str(value)


def prediction_rows(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """The predictions of ``path``, each with where it is (``row N``, or ``entry 'ID'`` of preds.json)."""
    if not path.is_file():
        raise EvalError(f"{path}: no such file" if not path.exists() else f"{path}: not a file")
    suffix = path.suffix.lower()
    if suffix not in (".jsonl", ".json"):
        raise EvalError(f"{path}: a predictions file is {FORMATS}")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise EvalError(f"{path}: cannot be read ({exc})") from exc
    return _jsonl_rows(path, text) if suffix == ".jsonl" else _json_rows(path, text)


def _jsonl_rows(path: Path, text: str) -> list[tuple[str, dict[str, Any]]]:
    rows: list[tuple[str, dict[str, Any]]] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"row {len(rows) + 1}"
        try:
            row = json.loads(line, object_pairs_hook=_unique)
        except ValueError as exc:
            raise EvalError(f"{path}: {where} (line {lineno}) is not a JSON object: {exc}") from exc
        if not isinstance(row, dict):
            raise EvalError(f"{path}: {where} (line {lineno}) is a JSON {type(row).__name__}, not a prediction "
                            "object (instance_id, model_patch)")
        rows.append((where, row))
    return rows


def _json_rows(path: Path, text: str) -> list[tuple[str, dict[str, Any]]]:
    try:
        data = json.loads(text, object_pairs_hook=_unique)
    except _DuplicateKey as exc:
        raise EvalError(f"{path}: {exc} in one object (an instance twice? keep one prediction per "
                        "instance)") from exc
    except ValueError as exc:
        raise EvalError(f"{path}: not JSON ({exc}); a predictions file is {FORMATS}") from exc
    if isinstance(data, list):
        for i, row in enumerate(data, start=1):
            if not isinstance(row, dict):
                raise EvalError(f"{path}: row {i} is a JSON {type(row).__name__}, not a prediction object "
                                "(instance_id, model_patch)")
        return [(f"row {i}", row) for i, row in enumerate(data, start=1)]
    if not isinstance(data, dict):
        raise EvalError(f"{path}: holds a JSON {type(data).__name__}; a predictions file is {FORMATS}")
    rows = []
    for key, row in data.items():
        where = f"entry {key!r}"
        if not isinstance(row, dict):
            raise EvalError(f"{path}: {where} is a JSON {type(row).__name__}, not a prediction object; a "
                            f"predictions file is {FORMATS}")
        if "instance_id" in row and str(row["instance_id"]) != key:
            raise EvalError(f"{path}: {where} holds instance_id {row['instance_id']!r}: preds.json's keys are "
                            "the instance ids of their predictions")
        rows.append((where, {"instance_id": key, **row}))
    return rows
