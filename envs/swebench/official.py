"""swebench's official harness, ``python -m swebench.harness.run_evaluation`` (4.1.0, unchanged), run
offline on local images: the check that the project's grader and the harness agree.

Two provisions make the shipped harness run here (docs: ENVIRONMENT, "swebench's own harness can grade
here"), and nothing else of it is changed:

* **Image names.** With its default namespace the harness looks up
  ``swebench/sweb.eval.<arch>.<id, "__" -> "_1776_">:latest`` (``client.images.get``) before it
  would pull. :class:`HarnessTags` gives each instance's local image that name for the run and
  removes, afterwards, exactly the tags it added (a name that already existed is left as it was).
* **Raw GitHub reads.** While it builds a ``TestSpec``, swebench 4.1.0 reads requirements files and
  ``environment.yml`` from ``raw.githubusercontent.com`` with ``requests.get`` in
  ``swebench.harness.test_spec.python`` (``get_requirements_by_commit``,
  ``get_environment_yml_by_commit``), even when the image exists. :func:`harness_main` replaces that
  module's ``requests`` name with :class:`SnapshotReads`, which answers the same URLs with
  ``git show COMMIT:PATH`` from the repository's fetched snapshot (``$SAO_SWE_MIRROR/owner+name``,
  default ``/work/.mirror``): the same bytes. A path absent at the commit is a 404, as GitHub answers
  (the harness then tries its next candidate path); a missing snapshot or commit is a
  :class:`HarnessInputError` that says what to fetch.

:func:`run_harness` runs it in a subprocess, in a working directory of the caller's (the harness
writes ``logs/`` and its run report ``<model>.<run_id>.json`` in its cwd), with
``--cache_level instance --clean false`` so that it removes no image, and reads back its verdicts
(:class:`HarnessRun`).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from ..errors import EnvError
from .images import swebench_image_names

log = logging.getLogger(__name__)

MIRROR_ENV = "SAO_SWE_MIRROR"
DEFAULT_MIRROR = Path("/work/.mirror")
RAW_HOST = "raw.githubusercontent.com"
HARNESS_MODULE = "swebench.harness.run_evaluation"
VERDICTS = ("resolved", "unresolved", "empty", "error")


class HarnessInputError(EnvError):
    """The harness cannot be run here: a snapshot, a commit in it, or an image is missing."""


class HarnessRunError(EnvError):
    """``run_evaluation`` exited with an error or wrote no run report."""


# -- the raw GitHub reads, served from a snapshot ------------------------------------------------------


def mirror_root() -> Path:
    return Path(os.environ.get(MIRROR_ENV) or DEFAULT_MIRROR).expanduser()


def snapshot_git_dir(repo: str, root: Path | None = None) -> Path:
    """The git dir of ``repo``'s snapshot: ``ROOT/owner+name/repo`` (as the fetch tool lays it out) or
    ``ROOT/owner+name`` itself."""
    folder = (root or mirror_root()) / repo.replace("/", "+")
    for candidate in (folder / "repo", folder, folder / ".git"):
        if (candidate / "HEAD").is_file() and (candidate / "objects").is_dir():
            return candidate
    raise HarnessInputError(f"swebench's harness reads files of {repo} from GitHub; offline they come from a "
                            f"snapshot, and there is none at {folder}: fetch github:{repo} (or set ${MIRROR_ENV} "
                            "to a folder that holds owner+name/repo)")


@dataclass
class RawResponse:
    """What ``requests.get`` returns, as much of it as ``test_spec/python.py`` reads."""

    status_code: int
    text: str
    url: str

    @property
    def ok(self) -> bool:
        return self.status_code == 200

    def raise_for_status(self) -> None:
        if not self.ok:
            raise HarnessInputError(f"{self.url}: {self.status_code} ({self.text})")


@dataclass
class SnapshotReads:
    """A stand-in for the ``requests`` module inside ``swebench.harness.test_spec.python``: ``get`` of
    ``https://raw.githubusercontent.com/OWNER/NAME/COMMIT/PATH`` answered by ``git show COMMIT:PATH`` in
    the snapshot of OWNER/NAME. Any other URL is refused (the harness reaches nothing else through it).
    ``served`` and ``missing`` record the reads (``repo@commit:path``)."""

    root: Path | None = None
    served: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    def get(self, url: str, *args: Any, **kwargs: Any) -> RawResponse:
        parts = urlsplit(url)
        pieces = [unquote(p) for p in parts.path.split("/") if p and p != "."]
        if parts.netloc != RAW_HOST or len(pieces) < 4:
            raise HarnessInputError(f"swebench asked for {url}; offline only {RAW_HOST}/OWNER/NAME/COMMIT/PATH "
                                    "reads are served (from a snapshot)")
        repo, commit, path = f"{pieces[0]}/{pieces[1]}", pieces[2], "/".join(pieces[3:])
        git_dir = snapshot_git_dir(repo, self.root)
        has_commit = subprocess.run(["git", "--git-dir", str(git_dir), "cat-file", "-e", f"{commit}^{{commit}}"],
                                    capture_output=True)
        if has_commit.returncode != 0:
            raise HarnessInputError(f"the snapshot of {repo} at {git_dir} lacks commit {commit} (swebench reads "
                                    f"{path} there): fetch github:{repo} again for a newer snapshot")
        shown = subprocess.run(["git", "--git-dir", str(git_dir), "show", f"{commit}:{path}"], capture_output=True)
        where = f"{repo}@{commit}:{path}"
        if shown.returncode != 0:
            self.missing.append(where)
            log.info("%s is not in the snapshot (a 404, as GitHub answers)", where)
            return RawResponse(404, f"{path} is not in {repo} at {commit} (snapshot {git_dir})", url)
        self.served.append(where)
        return RawResponse(200, shown.stdout.decode("utf-8", errors="replace"), url)


def harness_main(argv: Sequence[str], root: Path | None = None, module: str = HARNESS_MODULE) -> None:
    """``python -m swebench.harness.run_evaluation ARGV`` (``module``: another, in tests) with its raw
    GitHub reads served from the snapshots (:class:`SnapshotReads`). When the harness gives up because
    a file it looked for at a commit is in none of its candidate paths, the error names the snapshot
    reads that missed."""
    import runpy

    import swebench.harness.test_spec.python as test_spec_python

    reads = SnapshotReads(root)
    test_spec_python.requests = reads  # the one replacement: this module's raw GitHub reads
    sys.argv = [module, *argv]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except ValueError as exc:
        if reads.missing and "Could not find" in str(exc):
            raise HarnessInputError(f"{exc}; not in the snapshot under {reads.root or mirror_root()}: "
                                    f"{', '.join(reads.missing)}. Fetch a snapshot that has them") from exc
        raise


# -- the image names the harness looks up -------------------------------------------------------------


def harness_image_name(instance_id: str) -> str:
    """The name ``run_evaluation`` (namespace ``swebench``) looks up for an instance's image."""
    return swebench_image_names(instance_id)[1]


class HarnessTags:
    """Tags each instance's local image with :func:`harness_image_name` on entry and removes, on exit,
    exactly the tags it added (``added``), each only while it still names the image it was added to.
    A name already present is used and left as it is when it names the same image, and refused
    (:class:`HarnessInputError`) when it names another: the harness would grade in that one."""

    def __init__(self, client: Any, images: Mapping[str, str]):
        self.client = client
        self.images = dict(images)
        self.added: list[str] = []
        self._ids: dict[str, str] = {}  # each added tag's image id

    def __enter__(self) -> HarnessTags:
        import docker.errors

        try:
            for instance_id, image in self.images.items():
                name = harness_image_name(instance_id)
                try:
                    local = self.client.images.get(image)
                except docker.errors.ImageNotFound as exc:
                    raise HarnessInputError(f"the image of {instance_id}, {image}, is not present locally") from exc
                try:
                    present = self.client.images.get(name)
                except docker.errors.ImageNotFound:
                    present = None
                if present is not None:
                    if present.id != local.id:  # the harness would grade in another image than ours
                        raise HarnessInputError(f"{name} is present and is not {image} ({present.id[:19]} vs "
                                                f"{local.id[:19]}): remove or rename it to compare on {image}")
                    log.info("%s already names %s: used as it is, and left in place", name, image)
                    continue
                repository, tag = name.rsplit(":", 1)
                if not local.tag(repository, tag=tag):
                    raise HarnessInputError(f"cannot tag {image} as {name}")
                self.added.append(name)
                self._ids[name] = local.id
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        import docker.errors

        for name in list(self.added):
            try:
                if self.client.images.get(name).id != self._ids[name]:
                    log.warning("%s now names another image: left in place", name)
                    continue
                self.client.images.remove(name, noprune=True)  # the image keeps its own tag: an untag
            except docker.errors.ImageNotFound:
                pass
            self.added.remove(name)


# -- one run and its verdicts --------------------------------------------------------------------------


@dataclass(frozen=True)
class HarnessVerdict:
    """The harness's verdict on one prediction: ``verdict`` is one of :data:`VERDICTS` (its run report's
    ``resolved_ids``, ``unresolved_ids``, ``empty_patch_ids``, ``error_ids``); ``tests_status`` is its
    per-instance ``report.json``'s (``FAIL_TO_PASS``/``PASS_TO_PASS`` -> ``success``/``failure``), None
    when it wrote none; ``log`` is where its per-instance logs are."""

    instance_id: str
    verdict: str
    tests_status: dict[str, dict[str, list[str]]] | None = None
    patch_applied: bool | None = None
    log: Path | None = None


@dataclass(frozen=True)
class HarnessRun:
    """One ``run_evaluation``: its run report (``<model>.<run_id>.json``), the verdicts by instance,
    its output, the wall time and the tags added for it."""

    run_id: str
    report: dict[str, Any]
    verdicts: dict[str, HarnessVerdict]
    output: str
    duration_s: float
    tags_added: tuple[str, ...]


def harness_command(rows: Path, predictions: Path, run_id: str, *, timeout_s: int = 1800,
                    python: str = sys.executable) -> list[str]:
    """The wrapper's command line: ``run_evaluation`` on a local dataset file, one worker, and a cache
    level at which it removes no image (``instance``, ``--clean false``)."""
    return [python, "-c", "import sys; from sao.envs.swebench.official import harness_main; "
                          "harness_main(sys.argv[1:])",
            "--dataset_name", str(rows), "--predictions_path", str(predictions), "--run_id", run_id,
            "--max_workers", "1", "--cache_level", "instance", "--clean", "false", "--timeout", str(timeout_s)]


def run_harness(rows: Path, predictions: Path, images: Mapping[str, str], workdir: Path, run_id: str, *,
                client: Any = None, timeout_s: int = 1800, wall_limit_s: float = 7200.0,
                mirror: Path | None = None) -> HarnessRun:
    """``run_evaluation`` of ``predictions`` (a preds.json or .jsonl) over the rows of ``rows`` (a
    .jsonl), on the local ``images`` ({instance_id: image}), in ``workdir`` (its ``logs/`` and run
    report land there; the caller removes it). Raises :class:`HarnessRunError` when it fails or
    writes no run report; a prediction it could not grade is an ``error`` verdict, not an exception."""
    import docker

    client = client or docker.from_env()
    workdir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if mirror is not None:
        env[MIRROR_ENV] = str(mirror)
    started = time.monotonic()
    with HarnessTags(client, images) as tags:
        added = tuple(tags.added)
        try:
            proc = subprocess.run(harness_command(Path(rows).resolve(), Path(predictions).resolve(), run_id,
                                                  timeout_s=timeout_s),
                                  cwd=workdir, env=env, capture_output=True, text=True, timeout=wall_limit_s)
        finally:
            remove_run_containers(client, run_id)
    output = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise HarnessRunError(f"run_evaluation exited {proc.returncode}:\n{output[-4000:]}")
    return read_run(workdir, run_id, predictions, output=output, duration_s=time.monotonic() - started,
                    tags_added=added)


def remove_run_containers(client: Any, run_id: str) -> list[str]:
    """The harness names its containers ``sweb.eval.<id>.<run_id>`` and removes them; any it left are
    removed here (the run id is unique to the run, so no other container matches)."""
    left = [c for c in client.containers.list(all=True) if c.name.endswith(f".{run_id}")]
    for c in left:
        log.warning("the harness left container %s: removing it", c.name)
        c.remove(force=True)
    return [c.name for c in left]


def harness_predictions(path: Path) -> dict[str, dict[str, Any]]:
    """The predictions as the harness reads them (``get_predictions_from_file``), by instance id."""
    from swebench.harness.utils import get_predictions_from_file

    return {p["instance_id"]: p for p in get_predictions_from_file(str(path), "", "test")}


def read_run(workdir: Path, run_id: str, predictions: Path, *, output: str = "", duration_s: float = 0.0,
             tags_added: tuple[str, ...] = ()) -> HarnessRun:
    """The verdicts of a finished run in ``workdir``: its run report, and per instance the
    ``logs/run_evaluation/<run_id>/<model>/<id>/report.json`` when there is one."""
    preds = harness_predictions(Path(predictions))
    model = next(iter(preds.values()))["model_name_or_path"].replace("/", "__")
    report_path = workdir / f"{model}.{run_id}.json"
    if not report_path.is_file():
        raise HarnessRunError(f"run_evaluation wrote no run report ({report_path}):\n{output[-4000:]}")
    report = json.loads(report_path.read_text())
    kinds = {"resolved": "resolved_ids", "unresolved": "unresolved_ids", "empty": "empty_patch_ids",
             "error": "error_ids"}
    verdicts = {}
    for instance_id, pred in preds.items():
        found = [v for v, key in kinds.items() if instance_id in report.get(key, [])]
        verdict = found[0] if len(found) == 1 else "error"
        log_dir = workdir / "logs" / "run_evaluation" / run_id / pred["model_name_or_path"].replace("/", "__") / \
            instance_id
        tests_status, applied = None, None
        per_instance = log_dir / "report.json"
        if per_instance.is_file():
            entry = json.loads(per_instance.read_text()).get(instance_id, {})
            tests_status = entry.get("tests_status")
            applied = entry.get("patch_successfully_applied")
        verdicts[instance_id] = HarnessVerdict(instance_id, verdict, tests_status, applied,
                                               log_dir if log_dir.is_dir() else None)
    return HarnessRun(run_id, report, verdicts, output, duration_s, tags_added)
