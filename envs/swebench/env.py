"""The SWE-bench environment: one instance an episode, tools in the agent's container, the diff
graded in a fresh one (see the package docstring)."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

from sao.hints import did_you_mean
from sao.sandboxes import LABEL_VALUE, DockerSandbox, SandboxLimits

from ..core import Message, TextEnv
from ..errors import DatasetError, TaskError
from ..swe_policies import baseline_policy
from .brief import brief_task
from .episode import Episode, first_messages, run_tool_calls
from .grading import GradeResult, grade_patch, grade_prediction, instance_report, ungraded, unsubmitted
from .image_prep import EnvImages
from .images import ImageResolver, ResolvedImage, check_platform, instance_platform, load_image_map
from .pulls import PULL_RETRIES
from .instances import SWEInstance
from .tools import SYSTEM_PROMPT, TOOLS, Workspace
from .workspace import TESTBED, final_diff, prepare_workspace

log = logging.getLogger(__name__)


Limits = SandboxLimits | Mapping[str, Any]  # a mapping: the fields that change (SandboxLimits.overridden)


def _default_limits(command_timeout_s: float) -> SandboxLimits:
    return SandboxLimits(cpus=2.0, memory_mb=4096, pids=1024, network=False, output_limit_bytes=256_000,
                         default_timeout_s=command_timeout_s)


class SWEBenchEnv(TextEnv):
    """Resolve a SWE-bench instance with ``bash``/``editor``/``submit``; reward 1.0 when resolved.

    ``images``: instance id -> image (or a JSON file of that map); ``pull``: pull missing images, a try given
    up after ``pull_timeout_s`` without progress, ``pull_retries`` more; ``build``: swebench's builders as a
    last resort; ``platform``: ``linux/amd64`` or ``linux/arm64`` for every image (default: the host's, and
    ``linux/amd64`` for swebench's ``USE_X86`` instances on arm64: :func:`.images.instance_platform`).
    ``max_steps``: turns before truncation; ``max_format_errors``: consecutive turns without a usable tool
    call before the episode ends. ``command_timeout_s``: per bash command; ``eval_timeout_s``: the test run
    at grading. ``limits``: the agent's container (2 CPUs, 4 GiB, 1024 processes, no network); ``grading_limits``:
    the grader's (default ``limits``); each a SandboxLimits or a mapping of fields to change (``--cpus``, ...).
    Grading without network keeps the agent's code from fetching the fix while the tests run (an eval script
    that must download: ``grading_limits`` with ``network=True``). ``label``: the ``io.sao.sandbox`` label value of
    every container. ``hide_history``: remove every route to later commits (package docstring).
    ``autosubmit``: an episode that ends without ``submit`` (the step limit, format errors, a limit of
    the agent loop through :meth:`finish_cut`) has its diff graded, as SWE-agent does; with False it is
    scored as an empty patch, as mini-swe-agent does (the diff kept in ``info["unsubmitted_patch"]``).
    """

    tools = TOOLS
    # besides episodes (sao.envs.capabilities): --agent gold|empty, --grade-only, --prepare, a plug-in's brief, finish_cut
    scripted_policies, prediction_grader = staticmethod(baseline_policy), staticmethod(grade_prediction)
    instance_images, brief = EnvImages, staticmethod(brief_task)

    def __init__(self, instances: Sequence[SWEInstance], *, name: str = "swe-bench",
                 images: Mapping[str, str] | str | os.PathLike | None = None, pull: bool = True,
                 pull_timeout_s: float = 30.0, pull_retries: int = PULL_RETRIES, build: bool = False,
                 platform: str | None = None, max_steps: int = 50, max_format_errors: int = 3,
                 command_timeout_s: float = 120.0, eval_timeout_s: float = 1800.0,
                 limits: Limits | None = None, grading_limits: Limits | None = None,
                 observation_chars: int = 12_000,
                 max_patch_bytes: int = 2_000_000, label: str = LABEL_VALUE, hide_history: bool = True,
                 system_prompt: str | None = SYSTEM_PROMPT, docker_client: Any = None, autosubmit: bool = True,
                 render_mode: str | None = None):
        super().__init__(render_mode=render_mode)
        if not instances:
            raise DatasetError(f"{name}: no instances")
        problems = [f"{k} must be >= {low} (got {v})" for k, v, low in (("max_steps", max_steps, 1),
                    ("max_format_errors", max_format_errors, 1), ("pull_retries", pull_retries, 0)) if v < low]
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
        self.pull_retries, self.platform = pull_retries, check_platform(platform)
        self.max_steps, self.max_format_errors = max_steps, max_format_errors
        self.command_timeout_s, self.eval_timeout_s = command_timeout_s, eval_timeout_s
        self.limits = _default_limits(command_timeout_s).overridden(limits)
        self.grading_limits = self.limits.overridden(grading_limits)
        self.observation_chars, self.max_patch_bytes = observation_chars, max_patch_bytes
        self.label, self.hide_history, self.system_prompt = label, hide_history, system_prompt
        self.autosubmit = bool(autosubmit)
        self._client = docker_client
        self._own_client = docker_client is None
        self._resolver: ImageResolver | None = None
        self.instance: SWEInstance | None = None
        self.workspace: Workspace | None = None
        self._episode: Episode | None = None

    # -- TextEnv --------------------------------------------------------------------------------

    def task_ids(self, limit: int | None = None) -> list[str]:
        return [inst.instance_id for inst in self.instances[:limit]]

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
        image = self.resolve_image(inst)
        resolved = time.monotonic()
        sb = DockerSandbox(image.name, limits=self.limits, label=self.label, client=self._docker(), workdir=TESTBED,
                           name_prefix="sao-swe-", platform=image.platform)
        running = time.monotonic()
        try:
            baseline = prepare_workspace(sb, inst.base_commit, hide_history=self.hide_history)
        except BaseException:
            sb.close()
            raise
        self.instance = inst
        self.workspace = Workspace(sb, command_timeout_s=self.command_timeout_s,
                                   observation_chars=self.observation_chars)
        now = time.monotonic()
        self._episode = Episode(baseline, image, timing={
            "reset_s": now - started, "image_s": resolved - started, "container_start_s": running - resolved,
            "workspace_s": now - running, "tools_s": 0.0})
        info = {**self._info(), "image": image.name, "image_source": image.source, "image_pulled": image.pulled,
                "base_commit": inst.base_commit}
        return first_messages(self.system_prompt, inst), info

    def _respond(self, action: Message):
        if self.workspace is None or self._episode is None or self.instance is None:
            raise RuntimeError("no episode in progress (the last reset failed or the env was closed); call reset()")
        ep = self._episode
        ep.steps += 1
        turn = run_tool_calls(self.workspace, action, ep.timing)
        obs = turn.observations
        ep.format_errors = 0 if turn.usable else ep.format_errors + 1
        if turn.failure:
            return obs, 0.0, False, True, self._finish("infra_error", turn.failure)
        ended = ("submitted" if turn.submitted else "format_errors" if ep.format_errors >= self.max_format_errors
                 else "max_steps" if ep.steps >= self.max_steps else None)
        if ended is None:
            return obs, 0.0, False, False, self._info()
        info = self._finish(ended)  # graded: the reward is final (terminated); the step limit cut it (truncated)
        return obs, float(info["correct"]), True, ended == "max_steps", info

    def finish_cut(self, reason: str) -> tuple[float, dict[str, Any]]:
        """:class:`~sao.envs.capabilities.CutGrading`: a limit of the agent loop (``reason``: ``max_turns``,
        ``max_tokens``, ``context``, ...) cut the episode; end it as the step limit does: reward, final info."""
        if self.workspace is None or self._episode is None or self.instance is None:
            raise RuntimeError("no episode in progress (it ended, the last reset failed or the env was closed)")
        info, self._done = self._finish(reason), True  # TextEnv's flag: no step after this
        return float(info["correct"]), info

    def close(self) -> None:
        self._end_workspace()
        if self._own_client and self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
            self._client, self._resolver = None, None
        super().close()

    # -- internals ------------------------------------------------------------------------------

    def _docker(self) -> Any:
        if self._client is None:
            from sao.sandboxes.docker import connect

            self._client = connect()
        return self._client

    def _info(self) -> dict[str, Any]:
        assert self.instance is not None
        return {"task_id": self.instance.instance_id, "instance_id": self.instance.instance_id,
                "repo": self.instance.repo, "steps": self._episode.steps if self._episode else 0,
                "timing": _rounded(self._episode.timing) if self._episode else {}}

    def _finish(self, exit_status: str, error: str | None = None) -> dict[str, Any]:
        """Take the diff, close the agent's container, grade it (unless unsubmitted without autosubmit)."""
        assert self.instance is not None and self.workspace is not None and self._episode is not None
        ep, inst = self._episode, self.instance
        started = time.monotonic()
        patch, problem, error = final_diff(self.workspace.sb, ep.baseline, self.max_patch_bytes, error)
        self._end_workspace()
        ep.timing["diff_s"] = time.monotonic() - started  # the diff and the agent's container's removal
        text = patch.decode("utf-8", errors="replace") if patch else ""
        kept: dict[str, Any] = {}
        if error is None and exit_status != "submitted" and not self.autosubmit:  # scored as an empty patch
            kept, text, result = {"unsubmitted_patch": text}, "", unsubmitted(inst.instance_id, exit_status)
        elif error is not None or patch is None:
            result = ungraded(inst.instance_id, patch is None, problem, error)
        else:
            result = self.grade_diff(inst, patch, ep.image.name)
        ep.timing["grading_s"] = result.duration_s  # 0 when nothing was graded (no diff, an error)
        return {**self._info(), "correct": bool(result.resolved), "answer": text or None, "error": result.error,
                "eval_error": result.eval_error,
                "report": result.report, "patch": text, "exit_status": exit_status, "image": ep.image.name,
                "image_source": ep.image.source, "image_pulled": ep.image.pulled, "grading_log": result.log, **kept}

    def resolve_image(self, inst: SWEInstance) -> ResolvedImage:
        """The image of ``inst`` (see :class:`ImageResolver`); raises :class:`InstanceImageError` when none works."""
        if self._resolver is None:
            self._resolver = ImageResolver(self._docker(), images=self.image_map, pull=self.pull, build=self.build,
                                           pull_timeout_s=self.pull_timeout_s, pull_retries=self.pull_retries,
                                           platform=self.platform)
        return self._resolver.resolve(inst)

    def grade_diff(self, inst: SWEInstance, patch: bytes, image: str) -> GradeResult:
        """Grade a non-empty ``patch`` in a fresh container of ``image`` with this environment's grading
        settings; an unexpected failure is recorded as an infrastructure error (a bad rollout is data)."""
        platform = instance_platform(inst.instance_id, self.platform)[1]  # as the agent's container had it
        try:
            return grade_patch(inst, patch, image, client=self._docker(), label=self.label, platform=platform,
                               limits=self.grading_limits, timeout_s=self.eval_timeout_s,
                               hide_history=self.hide_history)
        except Exception as exc:  # noqa: BLE001 - record why grading broke
            log.exception("grading %s failed", inst.instance_id)
            report = instance_report(inst.instance_id, "error", patch_exists=True)
            return GradeResult(False, report, f"grading failed: {type(exc).__name__}: {exc}")

    def _end_workspace(self) -> None:
        if self.workspace is not None:
            workspace, self.workspace = self.workspace, None
            workspace.sb.close()


def _rounded(timing: Mapping[str, float]) -> dict[str, float]:
    return {k: round(v, 3) for k, v in timing.items()}

