"""SWE-bench grading of a diff in a fresh container, with swebench's eval scripts, log parsers and
grading (not to be confused with :mod:`sao.envs.grading`, the math answers' grading)."""

from __future__ import annotations

import codecs
import posixpath
import shlex
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sao.sandboxes import LABEL_VALUE, DockerSandbox, SandboxError, SandboxLimits

from .images import docker_arch
from .instances import SWEInstance, _log_parsers
from .tools import clip
from .workspace import TESTBED, WorkspaceError, prepare_workspace, shell

if TYPE_CHECKING:
    from .env import SWEBenchEnv

START_TEST_OUTPUT = ">>>>> Start Test Output"  # swebench.harness.constants, kept here to import swebench lazily
END_TEST_OUTPUT = ">>>>> End Test Output"
_HEREDOC = "EOF_114329324912"


@dataclass(frozen=True)
class GradeResult:
    """The outcome of grading one diff. ``report`` is swebench's per-instance report plus ``status``."""

    resolved: bool
    report: dict[str, Any]
    error: str | None = None  # an infrastructure error: the grading could not run (retried on resume)
    log: str = ""
    duration_s: float = 0.0
    # the tests ran but could not test anything, with or without the diff (a collection, configuration
    # or install error of the image): no verdict on the diff, counted apart from unresolved and infra
    eval_error: str | None = None


def clip_log(text: str, limit: int) -> str:
    """``text`` within ``limit`` characters: its head (a quarter) and its tail, the cut marked. An
    install or collection error shows at the head of a test log, the verdicts at its tail."""
    return clip(text, limit, head_share=0.25, what="log")


def instance_report(instance_id: str, status: str, *, patch_exists: bool, patch_is_none: bool = False,
                    resolved: bool = False, applied_with: str | None = None, apply_output: str | None = None,
                    graded: Mapping[str, Any] | None = None, detail: str | None = None) -> dict[str, Any]:
    """The grading report of one instance (``info["report"]``); every path that grades, or gives up, makes it here.

    swebench's per-instance keys (``instance_id``, ``patch_is_None``, ``patch_exists``,
    ``patch_successfully_applied``, ``resolved``), then what the path learned: ``applied_with``
    (the command that applied the diff), ``apply_output`` (why none did), ``graded`` (from
    :func:`grade_report`: ``resolution_status``, ``tests_status``), then ``status`` (``resolved``,
    ``unresolved``, ``eval_error``, ``empty_patch``, ``patch_failed``, ``patch_too_large``,
    ``diff_failed`` or ``error``) and ``detail`` (why no diff could be taken, or why the test run
    could not judge it).
    """
    report: dict[str, Any] = {"instance_id": instance_id, "patch_is_None": patch_is_none, "patch_exists": patch_exists,
                              "patch_successfully_applied": applied_with is not None, "resolved": resolved}
    if applied_with is not None:
        report["applied_with"] = applied_with
    if apply_output is not None:
        report["apply_output"] = apply_output
    report.update(graded or {})
    report["status"] = status
    if detail:
        report["detail"] = detail
    return report


def ungraded(instance_id: str, patch_is_none: bool, problem: str, error: str | None) -> GradeResult:
    """An episode's diff that is not graded: the agent's container failed (``error``: an infrastructure
    error), or the diff is missing, empty or too large (``problem``, as :func:`~.workspace.take_diff` says)."""
    status = "error" if error is not None else problem.split(":", 1)[0]
    report = instance_report(instance_id, status, patch_is_none=patch_is_none, patch_exists=False, detail=problem)
    return GradeResult(False, report, error)


def unsubmitted(instance_id: str, exit_status: str) -> GradeResult:
    """An episode that ended without ``submit`` (``exit_status``) while ``autosubmit`` is off: its diff is
    not graded but scored as an empty patch, as mini-swe-agent scores a limit."""
    return ungraded(instance_id, False, f"empty_patch: the episode ended without submit ({exit_status}) and "
                                        "autosubmit is off: scored as an empty patch", None)


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


_SYMLINK_MODE = "120000"


def patch_problem(patch: bytes | str) -> str | None:
    """Why a diff must not reach the grading container (None when it may go): it names no file, or a
    file outside the repository (an absolute path, a ``..`` component), inside ``.git`` (a hook there
    would run while the tests are reset), or it makes a symbolic link that points out of the
    repository. A diff that cannot be parsed is left to ``git apply`` and ``patch`` to refuse."""
    from unidiff import PatchSet
    from unidiff.errors import UnidiffParseError

    text = patch.decode("utf-8", errors="replace") if isinstance(patch, bytes) else patch
    try:
        files = PatchSet(text)
    except UnidiffParseError:
        return None
    if not files:
        return "the diff names no file (it is not a unified diff)"
    for f in files:
        header = [str(line).rstrip("\n") for line in f.patch_info or ()]  # None: no git header
        names = [_unquote(n) for n in (f.source_file, f.target_file) if n != "/dev/null"]
        names = [n[2:] if n[:2] in ("a/", "b/") else n for n in names]
        names += [_unquote(line.split(" ", 2)[2]) for line in header
                  if line.startswith(("rename from ", "rename to ", "copy from ", "copy to "))]
        for name in names:
            if (problem := _path_problem(name)) is not None:
                return problem
        if names and _makes_symlink(header):
            target = "".join(line.value for hunk in f for line in hunk if line.is_added).strip()
            where = posixpath.normpath(posixpath.join(posixpath.dirname(names[-1]), target))
            if target and _path_problem(where) is not None:
                return f"{names[-1]!r} becomes a symbolic link to {target!r}, out of the repository's files"
    return None


def _makes_symlink(header: list[str]) -> bool:
    """A file section's header creates a symbolic link, or changes one (mode 120000 on both sides)."""
    return any(line in (f"new file mode {_SYMLINK_MODE}", f"new mode {_SYMLINK_MODE}")
               or (line.startswith("index ") and line.endswith(f" {_SYMLINK_MODE}")) for line in header)


def _unquote(name: str) -> str:
    """A file name as git writes it: C-quoted (``"a/caf\\303\\251"``) when it has unusual characters."""
    name = name.strip()
    if len(name) > 1 and name[0] == name[-1] == '"':
        try:
            return codecs.escape_decode(name[1:-1].encode("utf-8"))[0].decode("utf-8", errors="replace")
        except ValueError:  # a malformed escape: as written
            return name
    return name


def _path_problem(path: str) -> str | None:
    parts = path.split("/")
    if path.startswith("/") or ".." in parts:
        return f"the diff touches {path!r}, outside the repository"
    if any(part.lower() == ".git" for part in parts):
        return f"the diff touches {path!r}, inside .git"
    return None


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
    # swebench counts a test missing from the log as failed; how many of them the log holds at all is
    # what tells a failing diff from a test run that never ran (see test_run_broken)
    found = {FAIL_TO_PASS: sum(t in status_map for t in dict.fromkeys(inst.fail_to_pass)),
             PASS_TO_PASS: sum(t in status_map for t in dict.fromkeys(inst.pass_to_pass))}
    return resolution == ResolvedStatus.FULL.value, {"resolution_status": resolution, "tests_status": tests,
                                                     "tests_found": found}


MIN_PASS_TO_PASS_FOUND = 0.5
"""A run whose log holds fewer than this share of the PASS_TO_PASS tests (or none of FAIL_TO_PASS and
PASS_TO_PASS) did not test the code as a whole: a collection, configuration or install error."""


def test_run_broken(inst: SWEInstance, graded: Mapping[str, Any]) -> str | None:
    """Why the graded log cannot be a verdict on the code (None when it can): it holds none of the
    instance's tests, or far fewer of PASS_TO_PASS than there are."""
    found = graded.get("tests_found") or {}
    f2p, p2p = found.get("FAIL_TO_PASS", 0), found.get("PASS_TO_PASS", 0)
    n_f2p, n_p2p = len(set(inst.fail_to_pass)), len(set(inst.pass_to_pass))
    if f2p + p2p == 0:
        return f"the test log holds none of the {n_f2p + n_p2p} FAIL_TO_PASS and PASS_TO_PASS tests"
    if n_p2p and p2p < MIN_PASS_TO_PASS_FOUND * n_p2p:
        return f"the test log holds only {p2p} of the {n_p2p} PASS_TO_PASS tests"
    return None


_APPLY_CMDS = ("git apply --verbose", "patch --batch --fuzz=5 -p1 -i")


@dataclass
class _TestRun:
    """One run of the eval script in a fresh container: what happened, up to the graded log."""

    error: str | None = None  # infrastructure: the run could not happen or finish
    applied_with: str | None = None
    apply_output: str | None = None  # set when the diff applied with no command
    log_text: str = ""
    graded: dict[str, Any] | None = None
    resolved: bool = False


def _run_tests(inst: SWEInstance, patch: bytes | None, image: str, script: str, test_spec: Any, parser: Any,
               existing: list[str], created: list[str], *, client: Any, label: str, limits: SandboxLimits | None,
               timeout_s: float, hide_history: bool, platform: str | None = None) -> _TestRun:
    """Apply ``patch`` (None: no diff, the base code) in a fresh container of ``image``, reset the
    tests ``test_patch`` touches, run the eval script and grade its log."""
    run = _TestRun()
    try:
        sb = DockerSandbox(image, limits=limits or SandboxLimits(), label=label, client=client, workdir=TESTBED,
                           name_prefix="sao-swe-grade-", platform=platform)
    except SandboxError as exc:
        run.error = f"the grading container did not start: {exc}"
        return run
    try:
        if hide_history:
            try:
                prepare_workspace(sb, inst.base_commit, hide_history=True)
            except WorkspaceError as exc:
                run.error = f"cannot hide the later history in the grading container: {exc}"
                return run
        if patch is not None:
            sb.write_file("/tmp/.sao-agent.patch", patch)
            outputs = []
            for cmd in _APPLY_CMDS:
                res = sb.run(f"{cmd} /tmp/.sao-agent.patch", timeout_s=300)
                outputs.append(f"$ {cmd}\n{res.output.strip()}")
                if res.ok:
                    run.applied_with = cmd
                    break
            if run.applied_with is None:
                run.apply_output = "\n".join(outputs)[-4000:]
                return run
        # Overwrite the agent's edits to the tests: reset what test_patch changes, remove what it creates.
        prep = [f"git checkout -q {inst.base_commit} -- {' '.join(map(shlex.quote, existing))}" if existing else ":",
                f"rm -rf -- {' '.join(map(shlex.quote, created))}" if created else ":",
                f"git apply --check - <<'{_HEREDOC}'\n{inst.test_patch}\n{_HEREDOC}"]
        res = sb.run(shell("set -e\n" + "\n".join(prep)), timeout_s=300)
        if not res.ok:
            run.error = ("test_patch does not apply to the repository once its test files are reset "
                         f"(a problem of the instance data): {res.output.strip()[-1000:]}")
            return run
        sb.write_file("/sao_eval.sh", script, mode=0o755)
        res = sb.run("bash /sao_eval.sh > /sao_eval.log 2>&1", timeout_s=timeout_s)
        try:
            run.log_text = sb.read_file("/sao_eval.log").decode("utf-8", errors="replace")
        except FileNotFoundError:
            run.log_text = ""
        if res.timed_out:
            run.error = f"the tests did not finish within eval_timeout_s={timeout_s:g} s"
        elif START_TEST_OUTPUT not in run.log_text or END_TEST_OUTPUT not in run.log_text:
            run.error = (f"the test log lacks swebench's start/end markers (eval script exit {res.exit_code}); "
                         "see info['grading_log']")
        else:
            run.resolved, run.graded = grade_report(inst, run.log_text, test_spec, parser)
        return run
    except SandboxError as exc:
        run.error = f"the grading container failed: {exc}"
        return run
    finally:
        sb.close()


def grade_patch(inst: SWEInstance, patch: bytes, image: str, *, client: Any = None, label: str = LABEL_VALUE,
                limits: SandboxLimits | None = None, timeout_s: float = 1800.0, hide_history: bool = True,
                log_chars: int = 20_000, platform: str | None = None) -> GradeResult:
    """Grade ``patch`` (the agent's diff) in a fresh container of ``image`` (its ``platform`` variant when
    given, as :class:`~sao.sandboxes.DockerSandbox` takes it); see the package docstring.

    ``hide_history`` removes the commits after ``base_commit`` from the grading container too: the
    agent's code runs there (the tests import it), and could otherwise read the fix from the
    repository's later history (``git log --all``, tags) while the tests run.

    A diff that :func:`patch_problem` refuses (a path outside the repository or in ``.git``, a symbolic
    link out of it) is ``patch_failed`` before any container starts.

    A test run that holds too few of the instance's tests to judge anything (:func:`test_run_broken`)
    is run once more without the diff. When the base code's run is as broken, the image cannot run
    its tests: status ``eval_error`` (``GradeResult.eval_error``), never a silent "unresolved". When
    the base code's run is whole, the diff broke the run (an import error, say): "unresolved", with
    the reason in ``detail``. The log kept is the head and tail of the first run's (``log_chars``).
    """
    started = time.monotonic()

    def done(status: str, run: _TestRun | None = None, error: str | None = None, *, eval_error: str | None = None,
             detail: str | None = None) -> GradeResult:
        run = run or _TestRun()
        report = instance_report(inst.instance_id, status, patch_exists=bool(patch.strip()), resolved=run.resolved,
                                 applied_with=run.applied_with, apply_output=run.apply_output, graded=run.graded,
                                 detail=detail)
        return GradeResult(run.resolved, report, error, clip_log(run.log_text, log_chars),
                           time.monotonic() - started, eval_error)

    if not patch.strip():
        return done("empty_patch")
    if (refused := patch_problem(patch)) is not None:  # the agent's doing: no container needed to say so
        return done("patch_failed", _TestRun(apply_output=f"refused before applying: {refused}"))
    try:
        script, test_spec, parser = eval_script(inst)
        existing, created = patch_files(inst.test_patch)
    except Exception as exc:  # noqa: BLE001 - e.g. a test_patch unidiff cannot parse: the instance's fault
        return done("error", error=f"cannot build the eval script for this instance: {type(exc).__name__}: {exc}")
    kwargs = dict(client=client, label=label, limits=limits, timeout_s=timeout_s, hide_history=hide_history,
                  platform=platform)
    run = _run_tests(inst, patch, image, script, test_spec, parser, existing, created, **kwargs)
    if run.error is not None:
        return done("error", run, run.error)
    if run.applied_with is None:
        return done("patch_failed", run)
    broken = None if run.resolved or run.graded is None else test_run_broken(inst, run.graded)
    if broken is None:
        return done("resolved" if run.resolved else "unresolved", run)
    base = _run_tests(inst, None, image, script, test_spec, parser, existing, created, **kwargs)
    if base.error is not None:
        return done("error", run, f"{broken}; checking the test run on the base code failed: {base.error}")
    base_broken = test_run_broken(inst, base.graded or {})
    if base_broken is None:
        return done("unresolved", run, detail=f"the diff broke the test run: {broken} (without the diff it "
                                                f"holds them: {(base.graded or {}).get('tests_found')})")
    return done("eval_error", run, eval_error=f"the tests cannot run in this image: {broken}, and without the "
                                              f"diff {base_broken.removeprefix('the test log ')}; see "
                                              f"info['grading_log'] (head and tail)")


def grade_prediction(env: SWEBenchEnv, task_id: str, patch: str) -> dict[str, Any]:
    """Grade a given patch (``--grade-only``): no agent container, only the fresh grading one.

    The SWE environments' :class:`~sao.envs.capabilities.PredictionGrader`. Returns the same final
    info as an episode (``exit_status`` "grade_only"); a missing image or a grading container that
    fails is an infrastructure error in ``error``, never a silent 0.
    """
    inst = env.get(task_id)
    base = {"task_id": inst.instance_id, "instance_id": inst.instance_id, "repo": inst.repo, "steps": 0,
            "answer": patch or None, "patch": patch, "exit_status": "grade_only"}
    flags = {"patch_is_none": not patch, "patch_exists": bool(patch.strip())}
    size = len(patch.encode("utf-8"))
    if size > env.max_patch_bytes:  # as an episode's diff is (workspace.take_diff)
        return {**base, "correct": False, "error": None, "report": instance_report(
            inst.instance_id, "patch_too_large", **flags,
            detail=f"the diff has {size} bytes, over max_patch_bytes={env.max_patch_bytes}")}
    try:
        image = env.resolve_image(inst)
    except Exception as exc:  # noqa: BLE001 - no image is an infrastructure error of this instance
        return {**base, "correct": False, "error": f"{type(exc).__name__}: {exc}",
                "report": instance_report(inst.instance_id, "error", **flags)}
    if not patch.strip():
        return {**base, "correct": False, "error": None,
                "report": instance_report(inst.instance_id, "empty_patch", **flags), "image": image.name,
                "image_source": image.source}
    result = env.grade_diff(inst, patch.encode("utf-8"), image.name)
    return {**base, "correct": bool(result.resolved), "error": result.error, "eval_error": result.eval_error,
            "report": result.report,
            "image": image.name, "image_source": image.source, "grading_log": result.log,
            "timing": {"grading_s": round(result.duration_s, 3)}}
