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
    The image's ``HEAD`` must be ``base_commit``, or the one ``SWE-bench`` commit on top of it that
    swebench's own builders add (``git commit --allow-empty -am SWE-bench``); anything else is
    refused. Before the episode starts, the agent's container loses every route to the fix:
    remotes, every ref but a fresh branch at ``base_commit`` and the tags that point into
    ``base_commit``'s own history (setuptools_scm computes the package's version from them, and
    they reveal nothing later: swebench keeps the tags older than the base commit), stash,
    reflogs, ``ORIG_HEAD``/``FETCH_HEAD``, ``.keep``/``.promisor`` pack markers, alternates, then
    ``git gc --prune=now``; the environment then checks that every commit object left is an
    ancestor of ``base_commit`` and refuses to start otherwise (naming what kept the objects). A
    partial clone is refused. The container has no network and
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
    neither with ``git apply`` nor with ``patch --fuzz``, or that touches a path outside the
    repository or in ``.git`` (refused by :func:`patch_problem` before a container starts)
    (``patch_failed``), a diff over
    ``max_patch_bytes`` (``patch_too_large``), a working tree whose diff cannot be taken because
    the agent broke the repository (``diff_failed``), tests that fail (``unresolved``).
    Infrastructure errors set ``error`` (and status ``error``): the grading container does not
    start or dies, the agent's container dies mid-episode, ``test_patch`` does not apply once
    the tests are reset (a data problem), the test log lacks swebench's start/end markers, or
    the tests run past ``eval_timeout_s``. (A timeout may be caused by the agent's code, e.g. an
    endless loop, but it cannot be told apart from a slow machine, so it is reported, not
    graded as a failure.) A missing image raises at reset (:class:`InstanceImageError`).

Episode ends (``info["exit_status"]``, the vocabulary of :mod:`sao.agents.loop.exits`)
    ``submit`` -> ``terminated`` (``submitted``); ``max_format_errors`` consecutive turns without a
    usable tool call -> ``terminated`` (``format_errors``); ``max_steps`` turns -> ``terminated`` and
    ``truncated`` (``max_steps``: graded, so the reward is final, and a limit cut it); a limit of the
    agent loop (turns, tokens, context) -> :meth:`SWEBenchEnv.finish_cut`, the environment's
    :class:`~sao.envs.capabilities.CutGrading`, which the loop calls, recorded ``terminated`` and
    ``truncated`` (exit status the limit: ``max_turns``, ``max_tokens``, ``context``); the agent's
    container failing -> ``truncated`` with ``error`` set and no grading (``infra_error``). The
    others are graded on the diff that exists ("autosubmit", as SWE-agent does); with
    ``autosubmit=False`` only a submitted diff is graded and every other end scores as an empty patch
    (as mini-swe-agent does; the diff is kept in ``unsubmitted_patch``). The final info always holds
    ``correct``, ``answer`` (the diff, or None when empty), ``error``, ``report``, ``patch`` and
    ``exit_status``.

Scripted agents and grading of given patches
    ``--agent gold|empty`` and ``--grade-only`` reach :class:`SWEBenchEnv` through
    :mod:`sao.envs.capabilities`: its class names :func:`sao.envs.swe_policies.baseline_policy`
    and :func:`grade_prediction` (a given diff graded as an episode's diff is, exit status
    ``grade_only``).

Modules, one role each
    ``instances`` (the schema, the checks of a row, loading), ``images`` (:class:`ImageResolver`),
    ``workspace`` (the agent's container: history hiding, the shell, the diff), ``tools`` (``bash``,
    ``editor``, ``submit`` and the prompts), ``grading`` (a diff graded in a fresh container; every
    report made by :func:`instance_report`), ``episode`` (one episode's state and its turns' tool calls
    in the agent's container), ``env`` (:class:`SWEBenchEnv`: reset, step, the episode's end),
    ``factories`` (the registered names), ``local_tasks`` (the builder of ``swe-local``'s repositories and
    images) and ``official`` (swebench's own ``run_evaluation``, run offline on local images, to check that
    it and the grader here agree: ``benchmarks/swe_parity.py``).
"""

from .env import SWEBenchEnv
from .factories import (
    LOCAL_DIR_ENV,
    build_local_tasks,
    local_tasks_dir,
    swe_bench_full,
    swe_bench_lite,
    swe_bench_verified,
    swe_local,
)
from .grading import (
    END_TEST_OUTPUT,
    START_TEST_OUTPUT,
    GradeResult,
    eval_script,
    grade_patch,
    grade_prediction,
    grade_report,
    instance_report,
    patch_files,
    patch_problem,
)
from .images import (
    ImageResolver,
    InstanceImageError,
    ResolvedImage,
    docker_arch,
    load_image_map,
    swebench_image_names,
)
from .instances import (
    HARNESS_FIELDS,
    HUB_SOURCES,
    LOCAL_SPEC_FIELDS,
    SWEInstance,
    instances_from_rows,
    load_instances,
    log_parser_names,
)
from .official import (
    HarnessInputError,
    HarnessRun,
    HarnessRunError,
    HarnessTags,
    HarnessVerdict,
    SnapshotReads,
    harness_image_name,
    run_harness,
)
from .tools import (
    BASH_TOOL,
    EDITOR_TOOL,
    MAX_EDITOR_BYTES,
    NO_TOOL_CALL,
    SUBMIT_TOOL,
    SYSTEM_PROMPT,
    TOOLS,
    USER_TEMPLATE,
    ToolError,
    Workspace,
    clip,
)
from .workspace import TESTBED, WorkspaceError, prepare_workspace, shell, take_diff

__all__ = [
    # instances
    "HARNESS_FIELDS", "HUB_SOURCES", "LOCAL_SPEC_FIELDS", "SWEInstance", "instances_from_rows", "load_instances",
    "log_parser_names",
    # images
    "ImageResolver", "InstanceImageError", "ResolvedImage", "docker_arch", "load_image_map", "swebench_image_names",
    # the workspace
    "TESTBED", "WorkspaceError", "prepare_workspace", "shell", "take_diff",
    # grading
    "END_TEST_OUTPUT", "START_TEST_OUTPUT", "GradeResult", "eval_script", "grade_patch", "grade_report",
    "grade_prediction", "instance_report", "patch_files", "patch_problem",
    # swebench's own harness, offline
    "HarnessInputError", "HarnessRun", "HarnessRunError", "HarnessTags", "HarnessVerdict", "SnapshotReads",
    "harness_image_name", "run_harness",
    # tools
    "BASH_TOOL", "EDITOR_TOOL", "MAX_EDITOR_BYTES", "NO_TOOL_CALL", "SUBMIT_TOOL", "SYSTEM_PROMPT", "TOOLS",
    "USER_TEMPLATE", "ToolError", "Workspace", "clip",
    # the environment and its factories
    "SWEBenchEnv", "LOCAL_DIR_ENV", "build_local_tasks", "local_tasks_dir", "swe_bench_full",
    "swe_bench_lite", "swe_bench_verified", "swe_local",
]
