"""SWE-bench on the text-environment contract: fix a repository's issue with tools, graded by its tests.

An episode is one SWE-bench instance. The agent works in a Docker container of the instance's
image (the repository at ``/testbed``, checked out at ``base_commit``) through three tools,
``bash``, ``editor`` and ``submit``. When it submits (or runs out of steps), its ``git diff`` is
taken from that container and graded in a *fresh* container of the same image, the way
SWE-bench's harness grades a prediction: apply the diff, apply ``test_patch``, run the tests,
parse the log with swebench's parser, and grade with swebench's ``get_eval_tests_report`` /
``get_resolution_status``. Reward 1.0 when resolved (every FAIL_TO_PASS and PASS_TO_PASS test
passes), else 0.0.

Instances
    SWE-bench's schema: ``instance_id, repo, base_commit, problem_statement, patch, test_patch,
    FAIL_TO_PASS, PASS_TO_PASS, version, environment_setup_commit`` (the two test lists as JSON
    strings or lists). Repositories that swebench's specs know (``MAP_REPO_VERSION_TO_SPECS``) are
    graded with swebench's own eval script and log parser. Others must add ``test_cmd`` (the
    command that runs tests from the repository root; the FAIL_TO_PASS and PASS_TO_PASS ids are
    appended) and ``log_parser`` (the name of one of swebench's parsers, e.g.
    ``parse_log_pytest``); both are ignored for repositories swebench knows. ``image``
    (optional) names the image to use. A row without a harness field fails when the environment
    is built, naming the file, the row and every missing field.

Images, in order (``info["image_source"]``):
    ``images-arg``: the constructor's ``images`` map (instance id -> image, or a JSON file of one);
    ``row-image``: the row's ``image`` field; ``swebench-name``: an image named as swebench names
    instance images (``sweb.eval.<arch>.<id>:latest`` as its builders tag them, or
    ``swebench/sweb.eval.<arch>.<id with __ -> _1776_>:latest`` as its registry publishes them);
    ``swebench-build``: built with swebench's builders (only with ``build=True``; needs network).
    Names that are not present locally are pulled when ``pull=True`` (with a time limit; a failed
    pull is not retried by the same environment). When nothing works, reset raises
    :class:`InstanceImageError` listing why each source failed.

Reward integrity (``hide_history=True``, the default)
    Before the episode starts, the agent's container loses every route to the fix: remotes, every
    ref but a fresh branch at ``base_commit``, tags, stash, reflogs, ``ORIG_HEAD``/``FETCH_HEAD``,
    then ``git gc --prune=now``; the environment then checks that every commit object left is an
    ancestor of ``base_commit`` and refuses to start otherwise. The container has no network and
    never sees ``test_patch``. The grading container loses the later history the same way (the
    tests run the agent's code, which could otherwise read the fix from a later commit). At
    grading, files touched by ``test_patch`` are reset (or removed, for files it creates) before
    it is applied, so agent edits to those tests are overwritten.
    Nothing the agent writes reaches the grader but the diff text. (Like upstream SWE-bench, a
    diff can still change other files the tests read, such as a ``conftest.py``.)

The diff
    ``git add -A`` into a temporary index, then ``git diff --cached`` against the *baseline*: the
    tree of ``base_commit``, or, when the image's working tree already differs from it (some
    SWE-bench images edit files while installing), a snapshot of that tree taken before the
    episode, so that the diff holds the agent's changes only. New files are included, files
    ignored by ``.gitignore`` are not.

Errors: agent failures vs infrastructure (``info["error"]``)
    Agent failures are graded 0.0 with ``error=None``, and ``info["report"]["status"]`` says what
    happened: an empty diff (``empty_patch``, no container is started), a diff that applies
    neither with ``git apply`` nor with ``patch --fuzz`` (``patch_failed``), a diff over
    ``max_patch_bytes`` (``patch_too_large``), a working tree whose diff cannot be taken because
    the agent broke the repository (``diff_failed``), tests that fail (``unresolved``).
    Infrastructure errors set ``error`` (and status ``error``): the grading container does not
    start or dies, the agent's container dies mid-episode, ``test_patch`` does not apply once
    the tests are reset (a data problem), the test log lacks swebench's start/end markers, or
    the tests run past ``eval_timeout_s``. (A timeout may be caused by the agent's code, e.g. an
    endless loop, but it cannot be told apart from a slow machine, so it is reported, not
    graded as a failure.) A missing image raises at reset (:class:`InstanceImageError`).

Episode ends
    ``submit`` -> ``terminated``; ``max_format_errors`` consecutive turns without a usable tool
    call -> ``terminated`` (exit status ``format_errors``); ``max_steps`` turns -> ``truncated``;
    the agent's container failing -> ``truncated`` with ``error`` set and no grading. The others
    are graded on the diff that exists, and the final info always holds ``correct``, ``answer`` (the diff, or None when
    empty), ``error``, ``report``, ``patch`` and ``exit_status``.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import platform
import posixpath
import shlex
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sao.sandboxes import (
    LABEL_VALUE,
    DockerSandbox,
    SandboxClosedError,
    SandboxError,
    SandboxLimits,
    SandboxStartError,
)

from .core import Message, TextEnv
from .datasets import is_blank, load_rows
from .errors import DatasetError, TaskError, did_you_mean

log = logging.getLogger(__name__)

HUB_SOURCES = {
    "verified": "princeton-nlp/SWE-bench_Verified",
    "lite": "princeton-nlp/SWE-bench_Lite",
    "full": "princeton-nlp/SWE-bench",
}
HARNESS_FIELDS = ("instance_id", "repo", "base_commit", "problem_statement", "patch", "test_patch",
                  "FAIL_TO_PASS", "PASS_TO_PASS", "version", "environment_setup_commit")
LOCAL_SPEC_FIELDS = ("test_cmd", "log_parser")
TESTBED = "/testbed"
START_TEST_OUTPUT = ">>>>> Start Test Output"  # swebench.harness.constants, kept here to import swebench lazily
END_TEST_OUTPUT = ">>>>> End Test Output"
_HEREDOC = "EOF_114329324912"


class InstanceImageError(TaskError, SandboxStartError):
    """No image could be found, pulled or built for an instance; the message lists every attempt."""


class WorkspaceError(SandboxError):
    """The agent's container could not be prepared (history hiding failed or could not be verified)."""


# -- instances ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SWEInstance:
    """One SWE-bench task. ``row`` keeps the source row (swebench's script builders read it)."""

    instance_id: str
    repo: str
    base_commit: str
    problem_statement: str
    patch: str
    test_patch: str
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]
    version: str
    environment_setup_commit: str
    test_cmd: str | None = None
    log_parser: str | None = None
    image: str | None = None
    row: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def known_to_swebench(self) -> bool:
        """swebench's specs know this repository and version (its eval script and parser apply)."""
        from swebench.harness.constants import MAP_REPO_VERSION_TO_SPECS

        return self.version in MAP_REPO_VERSION_TO_SPECS.get(self.repo, {})

    def swebench_row(self) -> dict[str, Any]:
        """The row as swebench's functions expect it (normalised fields over the source row)."""
        return {**self.row, "instance_id": self.instance_id, "repo": self.repo, "base_commit": self.base_commit,
                "patch": self.patch, "test_patch": self.test_patch, "version": self.version,
                "environment_setup_commit": self.environment_setup_commit,
                "FAIL_TO_PASS": list(self.fail_to_pass), "PASS_TO_PASS": list(self.pass_to_pass)}


def _test_list(value: Any, where: str, name: str) -> tuple[str, ...]:
    if hasattr(value, "tolist"):  # numpy arrays from parquet
        value = value.tolist()
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{where}: {name} is not a JSON list ({exc.msg})") from exc
    if not isinstance(value, (list, tuple)) or not all(isinstance(t, str) for t in value):
        raise DatasetError(f"{where}: {name} must be a list of test ids (or a JSON string of one)")
    return tuple(value)


def _version(value: Any) -> str:
    # Hub rows hold strings ("3.0", "0.12"); a float from a lossy copy is kept as Python prints it.
    return value.strip() if isinstance(value, str) else str(value)


def log_parser_names() -> list[str]:
    """The names of swebench's log parsers (``parse_log_*`` in ``swebench.harness.log_parsers``)."""
    return sorted(_log_parsers())


@functools.lru_cache(maxsize=1)
def _log_parsers() -> dict[str, Any]:
    import importlib
    import inspect
    import pkgutil

    import swebench.harness.log_parsers as pkg

    found: dict[str, Any] = {}
    for module in pkgutil.iter_modules(pkg.__path__):
        mod = importlib.import_module(f"{pkg.__name__}.{module.name}")
        found.update({n: f for n, f in vars(mod).items() if n.startswith("parse_log") and inspect.isfunction(f)})
    return found


def instances_from_rows(rows: Sequence[Mapping[str, Any]], *, source: str) -> list[SWEInstance]:
    """Check and convert rows; a broken row raises :class:`DatasetError` naming the source and row."""
    from swebench.harness.constants import MAP_REPO_VERSION_TO_SPECS

    if not rows:
        raise DatasetError(f"{source}: no rows")
    incomplete = [(i, [f for f in HARNESS_FIELDS if is_blank(r.get(f))]) for i, r in enumerate(rows, start=1)]
    incomplete = [(i, missing) for i, missing in incomplete if missing]
    if incomplete:
        i, missing = incomplete[0]
        iid = rows[i - 1].get("instance_id")
        more = (f"; {len(incomplete) - 1} more of the {len(rows)} rows lack harness fields too"
                if len(incomplete) > 1 else "")
        raise DatasetError(
            f"{source}: row {i}{f' (instance_id {iid!r})' if iid else ''}: missing "
            f"{', '.join(repr(f) for f in missing)}{more}. Grading needs every one of "
            f"{', '.join(HARNESS_FIELDS)}; a copy with prompts and gold patches only cannot be graded. Load the "
            f"full dataset (e.g. {HUB_SOURCES['verified']} from the Hugging Face hub) or a complete local copy.")
    parsers = _log_parsers()
    instances: list[SWEInstance] = []
    seen: set[str] = set()
    for i, r in enumerate(rows, start=1):
        iid = str(r["instance_id"])
        where = f"{source}: row {i} (instance_id {iid!r})"
        if iid in seen:
            raise DatasetError(f"{where}: duplicate instance_id")
        seen.add(iid)
        f2p = _test_list(r["FAIL_TO_PASS"], where, "FAIL_TO_PASS")
        if not f2p:
            raise DatasetError(f"{where}: FAIL_TO_PASS is empty; an instance needs at least one test it fixes")
        version = _version(r["version"])
        repo = str(r["repo"])
        opt = {k: (None if is_blank(r.get(k)) else str(r[k])) for k in ("test_cmd", "log_parser", "image")}
        known = version in MAP_REPO_VERSION_TO_SPECS.get(repo, {})
        if not known:
            missing = [f for f in LOCAL_SPEC_FIELDS if opt[f] is None]
            if missing:
                raise DatasetError(
                    f"{where}: swebench's specs do not know repo {repo!r} version {version!r}, so the row must "
                    f"say how to run and read its tests: missing {', '.join(repr(f) for f in missing)} (e.g. "
                    f"test_cmd 'python3 -m pytest -rA', log_parser 'parse_log_pytest')")
        if opt["log_parser"] is not None and opt["log_parser"] not in parsers:
            raise DatasetError(f"{where}: unknown log_parser {opt['log_parser']!r}."
                               f"{did_you_mean(opt['log_parser'], list(parsers))} Known: {', '.join(sorted(parsers))}")
        instances.append(SWEInstance(
            instance_id=iid, repo=repo, base_commit=str(r["base_commit"]).strip(),
            problem_statement=str(r["problem_statement"]), patch=str(r["patch"]), test_patch=str(r["test_patch"]),
            fail_to_pass=f2p, pass_to_pass=_test_list(r["PASS_TO_PASS"], where, "PASS_TO_PASS"), version=version,
            environment_setup_commit=str(r["environment_setup_commit"]), row=dict(r), **opt))
    return instances


def load_instances(source: str | os.PathLike, *, split: str = "test") -> list[SWEInstance]:
    """Instances from a hub dataset id or a local jsonl/json/parquet/csv file (see the module docstring)."""
    return list(_cached_instances(str(source), split, _mtime(str(source))))


def _mtime(source: str) -> float:
    path = Path(source).expanduser()
    return path.stat().st_mtime if path.exists() else 0.0


@functools.lru_cache(maxsize=8)
def _cached_instances(source: str, split: str, _stamp: float) -> tuple[SWEInstance, ...]:
    return tuple(instances_from_rows(load_rows(source, split=split), source=source))


# -- images ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ResolvedImage:
    name: str
    source: str  # images-arg | row-image | swebench-name | swebench-build
    pulled: bool = False


def docker_arch() -> str:
    """swebench's name for this machine's architecture (``x86_64`` or ``arm64``)."""
    machine = platform.machine().lower()
    return "arm64" if machine in ("arm64", "aarch64") else "x86_64"


def swebench_image_names(instance_id: str, arch: str | None = None, namespace: str = "swebench") -> tuple[str, str]:
    """``(local, remote)``: the names swebench gives an instance image when it builds it and when it
    publishes it (``TestSpec.instance_image_key`` without and with a namespace)."""
    key = f"sweb.eval.{arch or docker_arch()}.{instance_id.lower()}:latest"
    return key, f"{namespace}/{key}".replace("__", "_1776_")


class ImageResolver:
    """Finds the image of an instance: user map (exclusive when it names the instance), else the row's
    ``image``, swebench's names (local or pulled), swebench's build."""

    def __init__(self, client: Any, *, images: Mapping[str, str] | None = None, pull: bool = True,
                 pull_timeout_s: float = 30.0, pull_max_s: float = 3600.0, build: bool = False,
                 build_timeout_s: float = 3600.0):
        self.client = client
        self.images = dict(images or {})
        self.pull = pull
        self.pull_timeout_s = pull_timeout_s
        self.pull_max_s = pull_max_s
        self.build = build
        self.build_timeout_s = build_timeout_s
        self._failed_pulls: dict[str, str] = {}
        self._lock = threading.Lock()

    def resolve(self, inst: SWEInstance) -> ResolvedImage:
        attempts: list[str] = []
        candidates: list[tuple[str, str]] = []
        local, remote = swebench_image_names(inst.instance_id)
        if inst.instance_id in self.images:
            # An image the user named explicitly is the only candidate: falling back to another one
            # would grade against an environment the user did not ask for.
            candidates.append((self.images[inst.instance_id], "images-arg"))
        else:
            attempts.append("images-arg: the `images` map has no entry for this instance")
            if inst.image:
                candidates.append((inst.image, "row-image"))
            else:
                attempts.append("row-image: the row has no `image` field")
            candidates += [(local, "swebench-name"), (remote, "swebench-name")]
        for name, source in candidates:
            if self._present(name, attempts, source):
                return ResolvedImage(name, source)
            if name == local:  # swebench's own builders' tag; it is never published, so not pulled
                continue
            if self.pull and self._pull(name, attempts, source):
                return ResolvedImage(name, source, pulled=True)
        if not self.pull:
            attempts.append("pull: pulling is off (pull=False)")
        built = self._build(inst, attempts) if inst.instance_id not in self.images else None
        if built:
            return ResolvedImage(built, "swebench-build")
        raise InstanceImageError(
            f"no image for instance {inst.instance_id!r}:\n- " + "\n- ".join(attempts)
            + "\nProvide one with images={instance_id: image} or the row's `image` field, load swebench's image "
              f"({remote}) with `docker load`, or pass build=True where swebench's builders can reach the network.")

    def _present(self, name: str, attempts: list[str], source: str) -> bool:
        import docker.errors

        try:
            self.client.images.get(name)
            return True
        except docker.errors.ImageNotFound:
            attempts.append(f"{source}: {name} is not present locally")
        except Exception as exc:  # noqa: BLE001 - a bad name or an API error: report it and go on
            attempts.append(f"{source}: cannot look up {name}: {type(exc).__name__}: {exc}")
        return False

    def _pull(self, name: str, attempts: list[str], source: str) -> bool:
        with self._lock:
            if name in self._failed_pulls:
                attempts.append(f"{source}: pull {name} failed earlier ({self._failed_pulls[name]})")
                return False
        from docker.utils import parse_repository_tag

        repository, tag = parse_repository_tag(name)
        started = time.monotonic()
        outcome: dict[str, Any] = {"last_event": started}

        def pull() -> None:
            try:
                for event in self.client.api.pull(repository, tag=tag or "latest", stream=True, decode=True):
                    outcome["last_event"] = time.monotonic()
                    if isinstance(event, dict) and event.get("error"):
                        raise RuntimeError(event["error"])
                self.client.images.get(name)
                outcome["ok"] = True
            except Exception as exc:  # noqa: BLE001 - reported below
                outcome["error"] = f"{type(exc).__name__}: {exc}"

        # The time limit is on silence (no progress from the registry), so that a slow but moving
        # download of a multi-GB image goes on, and an unreachable registry fails fast.
        worker = threading.Thread(target=pull, name=f"pull-{name}", daemon=True)
        worker.start()
        reason = ""
        while worker.is_alive():
            worker.join(0.25)
            now = time.monotonic()
            if now - outcome["last_event"] > self.pull_timeout_s:
                reason = f"no progress for {self.pull_timeout_s:g} s"
                break
            if now - started > self.pull_max_s:
                reason = f"not done within pull_max_s={self.pull_max_s:g} s"
                break
        if outcome.get("ok"):
            return True
        reason = outcome.get("error") or reason
        with self._lock:
            self._failed_pulls[name] = reason
        attempts.append(f"{source}: pull {name} failed ({reason})")
        return False

    def _build(self, inst: SWEInstance, attempts: list[str]) -> str | None:
        if not self.build:
            attempts.append("swebench-build: building is off (pass build=True to build with swebench's builders; "
                            "they download the repository, conda and packages, so they need network access)")
            return None
        if not inst.known_to_swebench:
            attempts.append(f"swebench-build: swebench's specs do not know {inst.repo} {inst.version}, so its "
                            "builders cannot build this instance")
            return None
        outcome: dict[str, Any] = {}

        def build() -> None:
            try:
                from swebench.harness.docker_build import build_env_images, build_instance_image
                from swebench.harness.test_spec.test_spec import make_test_spec

                spec = make_test_spec(inst.swebench_row(), namespace=None, arch=docker_arch())
                _, failed = build_env_images(self.client, [spec], max_workers=1)
                if failed:
                    raise RuntimeError(f"environment image {spec.env_image_key} failed to build")
                build_instance_image(spec, self.client, None, nocache=False)
                outcome["name"] = spec.instance_image_key
            except BaseException as exc:  # noqa: BLE001 - swebench raises several kinds, some SystemExit-like
                outcome["error"] = f"{type(exc).__name__}: {str(exc).strip()[:500]}"

        worker = threading.Thread(target=build, name=f"build-{inst.instance_id}", daemon=True)
        worker.start()
        worker.join(self.build_timeout_s)
        if "name" in outcome:
            return outcome["name"]
        reason = outcome.get("error") or f"not done within {self.build_timeout_s:g} s"
        attempts.append(f"swebench-build: swebench's builders failed ({reason}); without network access they "
                        "cannot fetch the repository, conda or packages")
        return None


def load_image_map(images: Mapping[str, str] | str | os.PathLike | None) -> dict[str, str]:
    """The ``images`` argument: a mapping, or the path of a JSON object ``{instance_id: image}``."""
    if images is None:
        return {}
    if isinstance(images, Mapping):
        data: Any = dict(images)
        where = "images"
    else:
        where = str(images)
        try:
            data = json.loads(Path(images).expanduser().read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise DatasetError(f"{where}: cannot read the image map ({type(exc).__name__}: {exc})") from exc
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
        raise DatasetError(f"{where}: the image map must be a JSON object of instance_id -> image name")
    return data


# -- the workspace (agent container) ----------------------------------------------------------------

# $1 base commit. Hides every later commit, then verifies; prints the baseline (commit or tree).
_PREPARE = r"""
set -eu
cd /testbed
git config --global --add safe.directory /testbed 2>/dev/null || true
base=$(git rev-parse --verify --quiet "$1^{commit}") || { echo "base commit $1 is not in the repository" >&2; exit 3; }
head=$(git rev-parse --verify --quiet "HEAD^{commit}") || { echo "HEAD does not name a commit" >&2; exit 3; }
[ "$head" = "$base" ] || { echo "HEAD is $head, not the base commit $base" >&2; exit 3; }
if [ "$2" = hide ]; then
    branch=$(git symbolic-ref --quiet --short HEAD 2>/dev/null || echo main)
    case $branch in sao/*|"") branch=main ;; esac
    for r in $(git remote); do git remote remove "$r"; done
    git update-ref --no-deref "refs/heads/$branch" "$base"
    git symbolic-ref HEAD "refs/heads/$branch"
    git for-each-ref --format='delete %(refname)' | grep -vxF "delete refs/heads/$branch" | git update-ref --stdin
    rm -rf .git/logs .git/refs/original .git/rebase-merge .git/rebase-apply .git/sequencer .git/worktrees
    rm -f .git/ORIG_HEAD .git/FETCH_HEAD .git/MERGE_HEAD .git/CHERRY_PICK_HEAD .git/REVERT_HEAD \
          .git/COMMIT_EDITMSG .git/MERGE_MSG .git/SQUASH_MSG .git/AUTO_MERGE .git/BISECT_LOG .git/BISECT_START \
          .git/BISECT_EXPECTED_REV .git/objects/pack/*.keep
    if [ -s .git/objects/info/alternates ]; then git repack -a -d -q; rm -f .git/objects/info/alternates; fi
    git -c gc.reflogExpire=now -c gc.reflogExpireUnreachable=now -c gc.rerereResolved=now \
        -c gc.rerereUnresolved=now -c gc.cruftPacks=false gc --prune=now --quiet
    git cat-file --batch-all-objects --batch-check='%(objecttype) %(objectname)' | sed -n 's/^commit //p' \
        | sort > /tmp/.sao-commits
    git rev-list "$base" | sort > /tmp/.sao-ancestors
    extra=$(comm -23 /tmp/.sao-commits /tmp/.sao-ancestors | head -n 3)
    rm -f /tmp/.sao-commits /tmp/.sao-ancestors
    [ -z "$extra" ] || { echo "commits that are not ancestors of the base commit remain: $extra" >&2; exit 4; }
fi
idx=$(mktemp)
cp .git/index "$idx"
GIT_INDEX_FILE=$idx git add -A
tree=$(GIT_INDEX_FILE=$idx git write-tree)
rm -f "$idx"
if [ "$tree" = "$(git rev-parse "$base^{tree}")" ]; then
    echo "baseline=$base"
else
    git update-ref refs/sao/baseline "$tree"  # keeps the snapshot alive through a `git gc`
    echo "baseline=$tree"
fi
"""

# $1 baseline, $2 output file. The diff of the working tree (new files included) against the baseline.
_DIFF = r"""
set -eu
cd /testbed
idx=$(mktemp)
cp .git/index "$idx" 2>/dev/null || rm -f "$idx"
export GIT_INDEX_FILE="$idx"
git -c core.autocrlf=false -c core.safecrlf=false add -A
git -c core.quotePath=true -c diff.noprefix=false -c diff.mnemonicPrefix=false -c color.ui=never \
    diff --cached --binary --no-color --no-ext-diff --no-textconv --no-renames --src-prefix=a/ --dst-prefix=b/ \
    "$1" > "$2"
rm -f "$idx"
wc -c < "$2"
"""

# Commands run with bash; swebench's images keep the project's Python in the conda env "testbed".
_SHELL_PRELUDE = ("if [ -f /opt/miniconda3/bin/activate ]; then . /opt/miniconda3/bin/activate >/dev/null 2>&1 "
                  "&& conda activate testbed >/dev/null 2>&1; fi\n")
_TOOL_ENV = {"PAGER": "cat", "GIT_PAGER": "cat", "MANPAGER": "cat", "SYSTEMD_PAGER": "", "TERM": "dumb",
             "PIP_PROGRESS_BAR": "off", "PIP_NO_INPUT": "1", "TQDM_DISABLE": "1", "PYTHONDONTWRITEBYTECODE": "1"}


def shell(command: str) -> str:
    """``command`` as a bash script with the instance's environment activated."""
    return f"bash -c {shlex.quote(_SHELL_PRELUDE + command)}"


def prepare_workspace(sb: DockerSandbox, base_commit: str, *, hide_history: bool) -> str:
    """Hide the history after ``base_commit`` (and verify); return the baseline to diff against."""
    result = sb.run(f"sh -c {shlex.quote(_PREPARE)} prepare {shlex.quote(base_commit)} "
                    f"{'hide' if hide_history else 'keep'}", timeout_s=600)
    baseline = next((ln.split("=", 1)[1] for ln in result.output.splitlines() if ln.startswith("baseline=")), "")
    if result.exit_code != 0 or not baseline:
        raise WorkspaceError(f"cannot prepare the repository in {sb.name} (exit {result.exit_code}): "
                             f"{result.output.strip()[-1500:]}")
    return baseline.strip()


def take_diff(sb: DockerSandbox, baseline: str, *, max_bytes: int) -> tuple[bytes | None, str]:
    """``(diff, problem)``: the agent's diff, or None and why it could not be taken (the agent's doing)."""
    out = "/tmp/.sao-agent.diff"
    result = sb.run(f"sh -c {shlex.quote(_DIFF)} diff {shlex.quote(baseline)} {out}", timeout_s=300)
    if result.exit_code != 0:
        return None, f"diff_failed: `git diff` failed in the agent's repository (exit {result.exit_code}): " \
                     f"{result.output.strip()[-800:]}"
    size = int(result.output.strip().splitlines()[-1]) if result.output.strip() else 0
    if size > max_bytes:
        return None, f"patch_too_large: the diff has {size} bytes, over max_patch_bytes={max_bytes}"
    return (sb.read_file(out) if size else b""), ""


# -- grading --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GradeResult:
    """The outcome of grading one diff. ``report`` is swebench's per-instance report plus ``status``."""

    resolved: bool
    report: dict[str, Any]
    error: str | None = None
    log: str = ""
    duration_s: float = 0.0


def patch_files(patch: str) -> tuple[list[str], list[str]]:
    """``(existing, created)``: files a unified diff modifies/deletes, and files it creates."""
    from unidiff import PatchSet

    existing, created = [], []
    for f in PatchSet(patch):
        target = f.target_file[2:] if f.target_file.startswith("b/") else f.target_file
        source = f.source_file[2:] if f.source_file.startswith("a/") else f.source_file
        if f.source_file == "/dev/null":
            created.append(target)
        else:
            existing.append(source)
    return existing, created


def _test_spec(inst: SWEInstance, eval_lines: list[str]) -> Any:
    """A swebench ``TestSpec`` for the parsers, built without ``make_test_spec`` (which may go to the network)."""
    from swebench.harness.constants import MAP_REPO_TO_EXT, MAP_REPO_VERSION_TO_SPECS
    from swebench.harness.test_spec.test_spec import TestSpec

    specs = MAP_REPO_VERSION_TO_SPECS.get(inst.repo, {}).get(inst.version, {})
    return TestSpec(instance_id=inst.instance_id, repo=inst.repo, version=inst.version, repo_script_list=[],
                    eval_script_list=eval_lines, env_script_list=[], arch=docker_arch(),
                    FAIL_TO_PASS=list(inst.fail_to_pass), PASS_TO_PASS=list(inst.pass_to_pass),
                    language=MAP_REPO_TO_EXT.get(inst.repo, "py"), docker_specs=specs.get("docker_specs", {}),
                    namespace=None)


def eval_script(inst: SWEInstance) -> tuple[str, Any, Any]:
    """``(script, test_spec, parser)``: swebench's eval script and parser for known repositories; for
    others the same steps with the row's ``test_cmd`` (plus the test ids) and its named parser."""
    if inst.known_to_swebench:
        from swebench.harness.constants import MAP_REPO_VERSION_TO_SPECS
        from swebench.harness.log_parsers import MAP_REPO_TO_PARSER
        from swebench.harness.test_spec.create_scripts import make_eval_script_list

        specs = MAP_REPO_VERSION_TO_SPECS[inst.repo][inst.version]
        lines = make_eval_script_list(inst.swebench_row(), specs, "testbed", TESTBED, inst.base_commit,
                                      inst.test_patch)
        parser = MAP_REPO_TO_PARSER[inst.repo]
    else:
        existing, _ = patch_files(inst.test_patch)
        reset = (f"git checkout {inst.base_commit} -- {' '.join(shlex.quote(f) for f in existing)}"
                 if existing else ": no test files to reset")
        ids = " ".join(shlex.quote(t) for t in dict.fromkeys(inst.fail_to_pass + inst.pass_to_pass))
        lines = [
            f"cd {TESTBED}",
            f"git config --global --add safe.directory {TESTBED}",
            "git -c core.fileMode=false status",
            reset,
            f"git apply -v - <<'{_HEREDOC}'\n{inst.test_patch}\n{_HEREDOC}",
            f": '{START_TEST_OUTPUT}'",
            f"{inst.test_cmd} {ids}",
            f": '{END_TEST_OUTPUT}'",
            reset,
        ]
        parser = _log_parsers()[inst.log_parser or "parse_log_pytest"]
    script = "\n".join(["#!/bin/bash", "set -uxo pipefail", *lines]) + "\n"
    return script, _test_spec(inst, lines), parser


def grade_report(inst: SWEInstance, log_text: str, test_spec: Any, parser: Any) -> tuple[bool, dict[str, Any]]:
    """swebench's grading of a test log: status map -> ``get_eval_tests_report`` -> resolution status."""
    from swebench.harness.constants import FAIL_ONLY_REPOS, FAIL_TO_PASS, PASS_TO_PASS, EvalType, ResolvedStatus
    from swebench.harness.grading import get_eval_tests_report, get_resolution_status

    # As swebench.harness.grading.get_logs_eval: parse between the markers, else the whole log.
    section = log_text.split(START_TEST_OUTPUT, 1)[1].split(END_TEST_OUTPUT, 1)[0]
    status_map = parser(section, test_spec) or parser(log_text, test_spec)
    eval_type = EvalType.FAIL_ONLY if inst.repo in FAIL_ONLY_REPOS else EvalType.PASS_AND_FAIL
    tests = get_eval_tests_report(status_map, {FAIL_TO_PASS: list(inst.fail_to_pass),
                                               PASS_TO_PASS: list(inst.pass_to_pass)}, eval_type=eval_type)
    resolution = get_resolution_status(tests)
    return resolution == ResolvedStatus.FULL.value, {"resolution_status": resolution, "tests_status": tests}


_APPLY_CMDS = ("git apply --verbose", "patch --batch --fuzz=5 -p1 -i")


def grade_patch(inst: SWEInstance, patch: bytes, image: str, *, client: Any = None, label: str = LABEL_VALUE,
                limits: SandboxLimits | None = None, timeout_s: float = 1800.0, hide_history: bool = True,
                log_chars: int = 20_000) -> GradeResult:
    """Grade ``patch`` (the agent's diff) in a fresh container of ``image``; see the module docstring.

    ``hide_history`` removes the commits after ``base_commit`` from the grading container too: the
    agent's code runs there (the tests import it), and could otherwise read the fix from the
    repository's later history (``git log --all``, tags) while the tests run.
    """
    started = time.monotonic()
    report: dict[str, Any] = {"instance_id": inst.instance_id, "patch_is_None": False,
                              "patch_exists": bool(patch.strip()), "patch_successfully_applied": False,
                              "resolved": False}

    def done(status: str, error: str | None = None, log_text: str = "") -> GradeResult:
        report["status"] = status
        return GradeResult(report["resolved"], report, error, log_text[-log_chars:], time.monotonic() - started)

    if not patch.strip():
        return done("empty_patch")
    try:
        script, test_spec, parser = eval_script(inst)
        existing, created = patch_files(inst.test_patch)
    except Exception as exc:  # noqa: BLE001 - e.g. a test_patch unidiff cannot parse: the instance's fault
        return done("error", f"cannot build the eval script for this instance: {type(exc).__name__}: {exc}")
    try:
        sb = DockerSandbox(image, limits=limits or SandboxLimits(), label=label, client=client, workdir=TESTBED,
                           name_prefix="sao-swe-grade-")
    except SandboxError as exc:
        return done("error", f"the grading container did not start: {exc}")
    try:
        if hide_history:
            try:
                prepare_workspace(sb, inst.base_commit, hide_history=True)
            except WorkspaceError as exc:
                return done("error", f"cannot hide the later history in the grading container: {exc}")
        sb.write_file("/tmp/.sao-agent.patch", patch)
        outputs = []
        for cmd in _APPLY_CMDS:
            res = sb.run(f"{cmd} /tmp/.sao-agent.patch", timeout_s=300)
            outputs.append(f"$ {cmd}\n{res.output.strip()}")
            if res.ok:
                report.update(patch_successfully_applied=True, applied_with=cmd)
                break
        if not report["patch_successfully_applied"]:
            report["apply_output"] = "\n".join(outputs)[-4000:]
            return done("patch_failed")
        # Overwrite the agent's edits to the tests: reset what test_patch changes, remove what it creates.
        prep = [f"git checkout -q {inst.base_commit} -- {' '.join(map(shlex.quote, existing))}" if existing else ":",
                f"rm -rf -- {' '.join(map(shlex.quote, created))}" if created else ":",
                f"git apply --check - <<'{_HEREDOC}'\n{inst.test_patch}\n{_HEREDOC}"]
        res = sb.run(shell("set -e\n" + "\n".join(prep)), timeout_s=300)
        if not res.ok:
            return done("error", "test_patch does not apply to the repository once its test files are reset "
                                 f"(a problem of the instance data): {res.output.strip()[-1000:]}")
        sb.write_file("/sao_eval.sh", script, mode=0o755)
        res = sb.run("bash /sao_eval.sh > /sao_eval.log 2>&1", timeout_s=timeout_s)
        try:
            log_text = sb.read_file("/sao_eval.log").decode("utf-8", errors="replace")
        except FileNotFoundError:
            log_text = ""
        if res.timed_out:
            return done("error", f"the tests did not finish within eval_timeout_s={timeout_s:g} s", log_text)
        if START_TEST_OUTPUT not in log_text or END_TEST_OUTPUT not in log_text:
            return done("error", f"the test log lacks swebench's start/end markers (eval script exit "
                                 f"{res.exit_code}); see info['grading_log']", log_text)
        resolved, graded = grade_report(inst, log_text, test_spec, parser)
        report.update(graded, resolved=resolved)
        return done("resolved" if resolved else "unresolved", None, log_text)
    except SandboxError as exc:
        return done("error", f"the grading container failed: {exc}")
    finally:
        sb.close()


# -- tools ----------------------------------------------------------------------------------------


def _function(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": required, "additionalProperties": False}}}


BASH_TOOL = _function(
    "bash",
    "Run a bash command in the repository's container (working directory /testbed; no network). Each call "
    "starts a fresh shell: `cd` and variables do not carry over. Long output is truncated; a command that "
    "runs too long is killed.",
    {"command": {"type": "string", "description": "the bash command to run"}},
    ["command"],
)
EDITOR_TOOL = _function(
    "editor",
    "View, create or edit files. `view`: a file with line numbers (optionally `view_range` [start, end], "
    "1-based, end -1 = to the end) or a directory listing. `str_replace`: replace `old_str`, which must occur "
    "exactly once in the file, with `new_str`. `create`: write `file_text` to `path`. Relative paths are "
    "relative to /testbed.",
    {"command": {"type": "string", "enum": ["view", "str_replace", "create"]},
     "path": {"type": "string"},
     "view_range": {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2},
     "old_str": {"type": "string"}, "new_str": {"type": "string"}, "file_text": {"type": "string"}},
    ["command", "path"],
)
SUBMIT_TOOL = _function(
    "submit",
    "Submit the current state of the repository as your solution and end the episode. Your changes are "
    "taken as a `git diff` of /testbed and graded by the project's tests.",
    {}, [],
)
TOOLS = (BASH_TOOL, EDITOR_TOOL, SUBMIT_TOOL)

SYSTEM_PROMPT = (
    "You are a software engineer working in a Linux container. The repository for the task is at /testbed, "
    "checked out at the commit where the issue was reported. Resolve the issue by editing the repository's "
    "source files with the tools: `bash` runs commands, `editor` views and edits files, `submit` ends the "
    "episode. Make one or more tool calls in every reply. Your change is graded by running the project's tests, "
    "including tests you cannot see, so fix the behaviour itself rather than adapting existing tests."
)
USER_TEMPLATE = (
    "<issue>\n{problem_statement}\n</issue>\n\n"
    "Resolve this issue in the repository at /testbed (repository {repo}). Reproduce the problem, fix the "
    "source, check your fix, and then call `submit`."
)
NO_TOOL_CALL = ("Your reply had no tool call. Reply with one or more tool calls: `bash` to run a command, "
                "`editor` to view or change a file, `submit` when the issue is resolved.")


MAX_EDITOR_BYTES = 4_000_000


class ToolError(Exception):
    """A tool call the agent got wrong; its message becomes the tool's observation."""


def clip(text: str, limit: int) -> str:
    """Keep the head and the tail of a long observation around a marker line."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... observation truncated: {len(text) - 2 * half} characters omitted ...]\n{text[-half:]}"


class Workspace:
    """The tools, on one agent container."""

    def __init__(self, sb: DockerSandbox, *, command_timeout_s: float, observation_chars: int):
        self.sb = sb
        self.command_timeout_s = command_timeout_s
        self.observation_chars = observation_chars

    def bash(self, command: str) -> str:
        if "\0" in command:
            raise ToolError("the command contains a NUL byte")
        result = self.sb.run(shell(command), timeout_s=self.command_timeout_s, env=_TOOL_ENV)
        body = result.output if result.output.strip() else "(no output)\n"
        return clip(f"[exit code {result.exit_code}]\n{body}", self.observation_chars)

    def editor(self, command: str, path: str, view_range: list[int] | None = None, old_str: str | None = None,
               new_str: str | None = None, file_text: str | None = None) -> str:
        path = posixpath.normpath(posixpath.join(TESTBED, path))
        if command == "view":
            return clip(self._view(path, view_range), self.observation_chars)
        if command == "create":
            if file_text is None:
                raise ToolError("`create` needs `file_text`")
            kind, _ = self._kind(path)
            if kind == "directory":
                raise ToolError(f"{path} is a directory; `create` writes files")
            if kind == "other":
                raise ToolError(f"{path} is not a regular file")
            self.sb.write_file(path, file_text)
            return f"{'Overwrote' if kind == 'file' else 'Created'} {path} ({len(file_text.splitlines())} lines)."
        if command == "str_replace":
            if not old_str:
                raise ToolError("`str_replace` needs a non-empty `old_str`")
            if new_str is None:
                raise ToolError("`str_replace` needs `new_str` (use \"\" to delete)")
            text = self._read_text(path)
            count = text.count(old_str)
            if count == 0:
                raise ToolError(f"no replacement made: `old_str` does not occur verbatim in {path}")
            if count > 1:
                lines = sorted({text.count("\n", 0, i) + 1 for i in _find_all(text, old_str)})
                raise ToolError(f"no replacement made: `old_str` occurs {count} times in {path} (lines "
                                f"{', '.join(map(str, lines))}); include more context to make it unique")
            mode = self.sb.run(f"stat -c %a {shlex.quote(path)}", timeout_s=30).output.strip()
            at = text.index(old_str)
            new_text = text[:at] + new_str + text[at + len(old_str):]
            self.sb.write_file(path, new_text, mode=int(mode, 8) if mode.isdigit() else 0o644)
            first = new_text.count("\n", 0, at) + 1
            last = first + new_str.count("\n")
            snippet = _numbered(new_text.splitlines(), max(1, first - 3), last + 3)
            return clip(f"Edited {path}. The region around the change:\n{snippet}", self.observation_chars)
        raise ToolError(f"unknown editor command {command!r}; use view, str_replace or create")

    def _kind(self, path: str) -> tuple[str, int]:
        """``(kind, size)``: kind is file, directory, other or missing."""
        res = self.sb.run(f"stat -L -c '%F|%s' {shlex.quote(path)}", timeout_s=30)
        if res.exit_code != 0:
            return "missing", 0
        kind, _, size = res.output.strip().rpartition("|")
        kind = {"regular file": "file", "regular empty file": "file", "directory": "directory"}.get(kind, "other")
        return kind, int(size) if size.isdigit() else 0

    def _read(self, path: str) -> bytes:
        kind, size = self._kind(path)
        if kind == "missing":
            raise ToolError(f"{path}: no such file or directory")
        if kind == "directory":
            raise IsADirectoryError(path)
        if kind == "other":
            raise ToolError(f"{path} is not a regular file")
        if size > MAX_EDITOR_BYTES:
            raise ToolError(f"{path} has {size} bytes, more than the editor handles ({MAX_EDITOR_BYTES}); "
                            "use bash (sed, head, grep)")
        try:
            return self.sb.read_file(path)
        except FileNotFoundError:
            raise ToolError(f"{path}: no such file or directory") from None

    def _read_text(self, path: str) -> str:
        try:
            data = self._read(path)
        except IsADirectoryError:
            raise ToolError(f"{path} is a directory") from None
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise ToolError(f"{path} is not UTF-8 text; edit it with bash") from None

    def _view(self, path: str, view_range: list[int] | None) -> str:
        try:
            data = self._read(path)
        except IsADirectoryError:
            listing = self.sb.run(f"find {shlex.quote(path)} -maxdepth 2 -not -path '*/.*' | sort | head -n 400",
                                  timeout_s=60)
            return f"Files and directories up to 2 levels deep in {path}:\n{listing.output}"
        lines = data.decode("utf-8", errors="replace").splitlines()
        start, end = 1, len(lines)
        if view_range is not None:
            if (not isinstance(view_range, list) or len(view_range) != 2
                    or not all(isinstance(v, int) and not isinstance(v, bool) for v in view_range)):
                raise ToolError("`view_range` must be two integers [start, end]")
            start, end = view_range
            end = len(lines) if end == -1 else end
            if not 1 <= start <= max(len(lines), 1) or end < start:
                raise ToolError(f"invalid `view_range` {view_range}: the file has {len(lines)} lines")
        return _numbered(lines, start, min(end, len(lines))) or "(empty file)"


def _find_all(text: str, sub: str) -> list[int]:
    found, at = [], text.find(sub)
    while at != -1:
        found.append(at)
        at = text.find(sub, at + 1)
    return found


def _numbered(lines: list[str], start: int, end: int) -> str:
    return "\n".join(f"{n:6d}\t{lines[n - 1]}" for n in range(start, min(end, len(lines)) + 1))


_ARG_TYPES = {"command": str, "path": str, "old_str": str, "new_str": str, "file_text": str, "view_range": list}


def _arguments(call: Mapping[str, Any], tool: Mapping[str, Any]) -> dict[str, Any]:
    raw = call["function"].get("arguments") or "{}"
    try:
        args = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ToolError(f"the arguments are not valid JSON ({exc.msg} at position {exc.pos})") from None
    if not isinstance(args, dict):
        raise ToolError("the arguments must be a JSON object")
    params = tool["function"]["parameters"]
    unknown = sorted(set(args) - set(params["properties"]))
    missing = [p for p in params["required"] if p not in args]
    wrong = [k for k, v in args.items() if k in _ARG_TYPES and v is not None and not isinstance(v, _ARG_TYPES[k])]
    problems = ([f"unknown argument(s) {unknown}"] if unknown else []) + \
               ([f"missing required argument(s) {missing}"] if missing else []) + \
               ([f"argument(s) of the wrong type: {wrong}"] if wrong else [])
    if problems:
        raise ToolError("; ".join(problems) + f". Expected: {json.dumps(params['properties'])}")
    return args


# -- the environment ------------------------------------------------------------------------------


@dataclass
class _Episode:
    """The state of the current episode."""

    baseline: str  # what the agent's diff is taken against (a commit, or a tree snapshot)
    image: ResolvedImage
    reset_s: float
    steps: int = 0
    format_errors: int = 0  # consecutive turns without a usable tool call


def _default_limits(command_timeout_s: float) -> SandboxLimits:
    return SandboxLimits(cpus=2.0, memory_mb=4096, pids=1024, network=False, output_limit_bytes=256_000,
                         default_timeout_s=command_timeout_s)


class SWEBenchEnv(TextEnv):
    """Resolve a SWE-bench instance with ``bash``/``editor``/``submit``; reward 1.0 when resolved.

    ``images``: instance id -> image (or a JSON file of that map); ``pull``: pull missing images,
    giving up after ``pull_timeout_s`` without progress; ``build``: build with swebench's
    builders as a last resort. ``max_steps``: turns before truncation; ``max_format_errors``:
    consecutive turns without a usable tool call before the episode ends.
    ``command_timeout_s``: per bash command; ``eval_timeout_s``: the test run at grading.
    ``limits``: the agent's container (default 2 CPUs, 4 GiB, no network); ``grading_limits``:
    the grader's (default: ``limits``). Grading without network keeps the agent's code from
    fetching the fix while the tests run; swebench's eval scripts for some repositories re-run
    ``pip install -e .``, which may need network for build dependencies, in which case pass
    ``grading_limits`` with ``network=True``. ``label``: the ``io.sao.sandbox`` label value of
    every container. ``hide_history``: remove every route to later commits (module docstring).
    """

    tools = TOOLS

    def __init__(self, instances: Sequence[SWEInstance], *, name: str = "swe-bench",
                 images: Mapping[str, str] | str | os.PathLike | None = None, pull: bool = True,
                 pull_timeout_s: float = 30.0, build: bool = False, max_steps: int = 50, max_format_errors: int = 3,
                 command_timeout_s: float = 120.0, eval_timeout_s: float = 1800.0,
                 limits: SandboxLimits | None = None, grading_limits: SandboxLimits | None = None,
                 observation_chars: int = 12_000,
                 max_patch_bytes: int = 2_000_000, label: str = LABEL_VALUE, hide_history: bool = True,
                 system_prompt: str | None = SYSTEM_PROMPT, docker_client: Any = None,
                 render_mode: str | None = None):
        super().__init__(render_mode=render_mode)
        if not instances:
            raise DatasetError(f"{name}: no instances")
        problems = [f"{k} must be >= 1 (got {v})" for k, v in
                    (("max_steps", max_steps), ("max_format_errors", max_format_errors)) if v < 1]
        problems += [f"{k} must be > 0 (got {v})" for k, v in
                     (("command_timeout_s", command_timeout_s), ("eval_timeout_s", eval_timeout_s),
                      ("observation_chars", observation_chars), ("max_patch_bytes", max_patch_bytes)) if not v > 0]
        if problems:
            raise ValueError(f"{name}: " + "; ".join(problems))
        self.name = name
        self.instances = tuple(instances)
        self._by_id = {inst.instance_id: inst for inst in self.instances}
        if len(self._by_id) != len(self.instances):
            raise DatasetError(f"{name}: duplicate instance ids")
        self.image_map = load_image_map(images)
        self.pull, self.pull_timeout_s, self.build = pull, pull_timeout_s, build
        self.max_steps, self.max_format_errors = max_steps, max_format_errors
        self.command_timeout_s, self.eval_timeout_s = command_timeout_s, eval_timeout_s
        self.limits = limits or _default_limits(command_timeout_s)
        self.grading_limits = grading_limits or self.limits
        self.observation_chars, self.max_patch_bytes = observation_chars, max_patch_bytes
        self.label, self.hide_history, self.system_prompt = label, hide_history, system_prompt
        self._client = docker_client
        self._own_client = docker_client is None
        self._resolver: ImageResolver | None = None
        self.instance: SWEInstance | None = None
        self.workspace: Workspace | None = None
        self._episode: _Episode | None = None

    # -- TextEnv --------------------------------------------------------------------------------

    def task_ids(self, limit: int | None = None) -> list[str]:
        return [inst.instance_id for inst in self.instances[:limit]]

    def grade_prediction(self, task_id: str, patch: str) -> dict[str, Any]:
        """Grade a given patch (``--grade-only``): no agent container, only the fresh grading one.

        Returns the same final info as an episode (``exit_status`` "grade_only"); a missing image or
        a grading container that fails is an infrastructure error in ``error``, never a silent 0.
        """
        inst = self.get(task_id)
        base = {"task_id": inst.instance_id, "instance_id": inst.instance_id, "repo": inst.repo, "steps": 0,
                "answer": patch or None, "patch": patch, "exit_status": "grade_only"}
        report = {"instance_id": inst.instance_id, "patch_is_None": not patch, "patch_exists": bool(patch.strip()),
                  "patch_successfully_applied": False, "resolved": False}
        try:
            client = self._docker()
            if self._resolver is None:
                self._resolver = ImageResolver(client, images=self.image_map, pull=self.pull,
                                               pull_timeout_s=self.pull_timeout_s, build=self.build)
            image = self._resolver.resolve(inst)
        except Exception as exc:  # noqa: BLE001 - no image is an infrastructure error of this instance
            return {**base, "correct": False, "error": f"{type(exc).__name__}: {exc}",
                    "report": {**report, "status": "error"}}
        if not patch.strip():
            return {**base, "correct": False, "error": None, "report": {**report, "status": "empty_patch"},
                    "image": image.name, "image_source": image.source}
        try:
            result = grade_patch(inst, patch.encode("utf-8"), image.name, client=client, label=self.label,
                                 limits=self.grading_limits, timeout_s=self.eval_timeout_s,
                                 hide_history=self.hide_history)
        except Exception as exc:  # noqa: BLE001
            log.exception("grading %s failed", inst.instance_id)
            result = GradeResult(False, {**report, "status": "error"}, f"grading failed: {type(exc).__name__}: {exc}")
        return {**base, "correct": bool(result.resolved), "error": result.error, "report": result.report,
                "image": image.name, "image_source": image.source, "grading_log": result.log,
                "timing": {"grading_s": round(result.duration_s, 3)}}

    def scripted_policy(self, name: str, task_id: str):
        """A model-free agent for task ``task_id``: ``gold`` applies the gold patch, ``empty`` submits nothing."""
        from .swe_policies import empty_policy, gold_policy

        if name == "gold":
            return gold_policy(self.get(task_id))
        if name == "empty":
            return empty_policy()
        raise ValueError(f"unknown scripted agent {name!r}; this environment has 'gold' and 'empty'")

    def get(self, task_id: str) -> SWEInstance:
        try:
            return self._by_id[task_id]
        except KeyError:
            hint = did_you_mean(task_id, list(self._by_id))
            raise TaskError(f"{self.name}: no instance {task_id!r}.{hint}") from None

    def _begin(self, task_id: str | None) -> tuple[list[Message], dict[str, Any]]:
        inst = self.get(task_id) if task_id is not None else \
            self.instances[int(self.np_random.integers(len(self.instances)))]
        self._end_workspace()
        self._episode = None
        started = time.monotonic()
        client = self._docker()
        if self._resolver is None:
            self._resolver = ImageResolver(client, images=self.image_map, pull=self.pull,
                                           pull_timeout_s=self.pull_timeout_s, build=self.build)
        image = self._resolver.resolve(inst)
        sb = DockerSandbox(image.name, limits=self.limits, label=self.label, client=client, workdir=TESTBED,
                           name_prefix="sao-swe-")
        try:
            baseline = prepare_workspace(sb, inst.base_commit, hide_history=self.hide_history)
        except BaseException:
            sb.close()
            raise
        self.instance = inst
        self.workspace = Workspace(sb, command_timeout_s=self.command_timeout_s,
                                   observation_chars=self.observation_chars)
        self._episode = _Episode(baseline, image, reset_s=time.monotonic() - started)
        messages: list[Message] = []
        if self.system_prompt:
            messages.append({"role": "system", "content": self.system_prompt})
        messages.append({"role": "user", "content": USER_TEMPLATE.format(
            problem_statement=inst.problem_statement.strip(), repo=inst.repo)})
        return messages, {**self._info(), "image": image.name, "image_source": image.source,
                          "image_pulled": image.pulled, "base_commit": inst.base_commit}

    def _respond(self, action: Message):
        if self.workspace is None or self._episode is None or self.instance is None:
            raise RuntimeError("no episode in progress (the last reset failed or the env was closed); call reset()")
        ep = self._episode
        ep.steps += 1
        obs: list[Message] = []
        invalid = action.get("invalid_tool_calls") or []
        calls = action.get("tool_calls") or []
        for problem in invalid:
            obs.append({"role": "user", "content": f"A tool call in your reply could not be parsed: {problem}. "
                                                   "Repeat it as a well-formed tool call."})
        usable, submitted, failure = False, False, None
        for call in calls:
            call_id = str(call.get("id") or "")
            if submitted or failure:
                obs.append(_tool_message(call_id, "Not run: the episode has ended."))
                continue
            try:
                content, ok, submitted = self._call(call)
                usable = usable or ok
            except SandboxError as exc:
                failure = f"the agent's container failed: {exc}"
                content = f"Error: {failure}"
            obs.append(_tool_message(call_id, content))
        if not calls and not invalid:
            obs.append({"role": "user", "content": NO_TOOL_CALL})
        ep.format_errors = 0 if usable else ep.format_errors + 1
        if failure:
            return obs, 0.0, False, True, self._finish("agent_container_error", failure)
        if submitted:
            info = self._finish("submitted")
            return obs, float(info["correct"]), True, False, info
        if ep.format_errors >= self.max_format_errors:
            info = self._finish("format_errors")
            return obs, float(info["correct"]), True, False, info
        if ep.steps >= self.max_steps:
            info = self._finish("step_limit")
            return obs, float(info["correct"]), False, True, info
        return obs, 0.0, False, False, self._info()

    def close(self) -> None:
        self._end_workspace()
        if self._own_client and self._client is not None:
            try:
                self._client.close()
            except Exception:  # noqa: BLE001
                pass
            self._client = None
            self._resolver = None
        super().close()

    # -- internals ------------------------------------------------------------------------------

    def _docker(self) -> Any:
        if self._client is None:
            from ..sandboxes.docker import connect

            self._client = connect()
        return self._client

    def _info(self) -> dict[str, Any]:
        assert self.instance is not None
        return {"task_id": self.instance.instance_id, "instance_id": self.instance.instance_id,
                "repo": self.instance.repo, "steps": self._episode.steps if self._episode else 0}

    def _call(self, call: Mapping[str, Any]) -> tuple[str, bool, bool]:
        """``(observation, usable, submitted)`` for one tool call; agent mistakes become observations."""
        assert self.workspace is not None
        name = call["function"]["name"]
        tool = next((t for t in TOOLS if t["function"]["name"] == name), None)
        if tool is None:
            known = [t["function"]["name"] for t in TOOLS]
            return (f"Error: unknown tool {name!r}.{did_you_mean(name, known)} Available tools: "
                    f"{', '.join(known)}.", False, False)
        try:
            args = _arguments(call, tool)
        except ToolError as exc:
            return f"Error: {exc}", False, False
        if name == "submit":
            return "Submitted. Your changes will be graded by the project's tests.", True, True
        try:
            if name == "bash":
                return self.workspace.bash(args["command"]), True, False
            return self.workspace.editor(**args), True, False
        except ToolError as exc:
            return f"Error: {exc}", True, False
        except SandboxClosedError:
            raise
        except SandboxError as exc:
            # A file operation the container refused (a directory as a file, a device, ...) is the
            # agent's mistake as long as the container still answers.
            self.workspace.sb.run("true", timeout_s=30)
            return f"Error: {exc}", True, False

    def _finish(self, exit_status: str, error: str | None = None) -> dict[str, Any]:
        """Take the diff, close the agent's container, grade; the final info."""
        assert self.instance is not None and self.workspace is not None and self._episode is not None
        ep, inst = self._episode, self.instance
        patch: bytes | None = None
        problem = ""
        if error is None:
            try:
                patch, problem = take_diff(self.workspace.sb, ep.baseline, max_bytes=self.max_patch_bytes)
            except SandboxError as exc:
                error = f"the agent's container failed while taking the diff: {exc}"
        self._end_workspace()
        text = patch.decode("utf-8", errors="replace") if patch else ""
        if error is not None or patch is None:
            status = "error" if error is not None else problem.split(":", 1)[0]
            report = {"instance_id": inst.instance_id, "patch_is_None": patch is None, "patch_exists": False,
                      "patch_successfully_applied": False, "resolved": False, "status": status}
            if problem:
                report["detail"] = problem
            result = GradeResult(False, report, error)
        else:
            try:
                result = grade_patch(inst, patch, ep.image.name, client=self._docker(), label=self.label,
                                     limits=self.grading_limits, timeout_s=self.eval_timeout_s,
                                     hide_history=self.hide_history)
            except Exception as exc:  # noqa: BLE001 - a bad rollout is data: record why grading broke
                log.exception("grading %s failed", inst.instance_id)
                report = {"instance_id": inst.instance_id, "patch_is_None": False, "patch_exists": True,
                          "patch_successfully_applied": False, "resolved": False, "status": "error"}
                result = GradeResult(False, report, f"grading failed: {type(exc).__name__}: {exc}")
        return {**self._info(), "correct": bool(result.resolved), "answer": text or None, "error": result.error,
                "report": result.report, "patch": text, "exit_status": exit_status, "image": ep.image.name,
                "image_source": ep.image.source, "grading_log": result.log,
                "timing": {"reset_s": round(ep.reset_s, 3), "grading_s": round(result.duration_s, 3)}}

    def _end_workspace(self) -> None:
        if self.workspace is not None:
            workspace, self.workspace = self.workspace, None
            workspace.sb.close()


def _tool_message(call_id: str, content: str) -> Message:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


# -- factories (registered in sao.envs.registry) ----------------------------------------------------


def _hub_env(kind: str, data: str | os.PathLike | None, split: str, kwargs: dict[str, Any]) -> SWEBenchEnv:
    source = str(data or HUB_SOURCES[kind])
    kwargs.setdefault("name", source)
    return SWEBenchEnv(load_instances(source, split=split), **kwargs)


def swe_bench_verified(data: str | os.PathLike | None = None, split: str = "test", **kwargs: Any) -> SWEBenchEnv:
    """SWE-bench Verified: 500 human-validated GitHub issues (hub ``princeton-nlp/SWE-bench_Verified``, or ``data``)."""
    return _hub_env("verified", data, split, kwargs)


def swe_bench_lite(data: str | os.PathLike | None = None, split: str = "test", **kwargs: Any) -> SWEBenchEnv:
    """SWE-bench Lite: 300 self-contained issues (hub ``princeton-nlp/SWE-bench_Lite``, or ``data``)."""
    return _hub_env("lite", data, split, kwargs)


def swe_bench_full(data: str | os.PathLike | None = None, split: str = "test", **kwargs: Any) -> SWEBenchEnv:
    """SWE-bench: the full test split, 2,294 issues (hub ``princeton-nlp/SWE-bench``, or ``data``)."""
    return _hub_env("full", data, split, kwargs)


LOCAL_DIR_ENV = "SAO_SWE_LOCAL_DIR"
BUILDER_ENV = "SAO_SWE_TASKS_BUILDER"


def local_tasks_dir() -> Path:
    """Where the local SWE tasks are built: ``$SAO_SWE_LOCAL_DIR``, else ``$XDG_CACHE_HOME/sao/swe-local``."""
    if os.environ.get(LOCAL_DIR_ENV):
        return Path(os.environ[LOCAL_DIR_ENV]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache).expanduser() / "sao" / "swe-local"


def build_local_tasks(out_dir: str | os.PathLike | None = None, **kwargs: Any) -> Path:
    """Build (or find cached) the local SWE tasks with ``tests/swe_tasks/build_tasks.py`` of the checkout."""
    import importlib.util

    override = os.environ.get(BUILDER_ENV)
    checkout = Path(__file__).resolve().parents[1]
    path = Path(override) if override else checkout / "tests" / "swe_tasks" / "build_tasks.py"
    if not path.is_file():
        raise DatasetError(f"the local SWE task builder is not at {path} (it ships with a source checkout of sao; "
                           f"set {BUILDER_ENV}), or pass data=PATH to an instances file")
    name = "sao_swe_build_tasks"
    module = sys.modules.get(name)
    if module is None or Path(getattr(module, "__file__", "")) != path:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up there
        try:
            spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(name, None)
            raise
    return Path(module.build(Path(out_dir) if out_dir else local_tasks_dir(), **kwargs))


_local_build_lock = threading.Lock()


def swe_local(data: str | os.PathLike | None = None, **kwargs: Any) -> SWEBenchEnv:
    """Six small local repositories with real bugs, in SWE-bench's schema; runs offline.

    ``data`` defaults to the builder's instances file in :func:`local_tasks_dir`; the tasks and
    their images are built there first (cached: about a second when nothing changed).
    """
    if data is None:
        with _local_build_lock:
            data = build_local_tasks()
    kwargs.setdefault("name", "swe-local")
    kwargs.setdefault("eval_timeout_s", 300.0)
    kwargs.setdefault("limits", SandboxLimits(cpus=1.0, memory_mb=1024, pids=256, network=False,
                                              output_limit_bytes=256_000,
                                              default_timeout_s=kwargs.get("command_timeout_s", 60.0)))
    kwargs.setdefault("command_timeout_s", 60.0)
    return SWEBenchEnv(load_instances(data), **kwargs)
