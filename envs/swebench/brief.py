"""A SWE-bench task as an external agent is told it (:class:`~sao.envs.capabilities.TaskBrief`): the
opening messages, the instance's image (resolved as an episode's would be: found, pulled or built),
the repository's path in it and the environment's container limits. No container is started: the
agent runs its own on the image, and what it returns is graded in a fresh one
(:func:`~.grading.grade_prediction`).

The agent's own container starts from the image as it is, so the brief also gives the shell command that
prepares an episode's workspace (``facts["setup_command"]``: with ``hide_history``, the routes to later
commits removed, as in the environment's own episodes); an agent that runs its own container runs it there
before it starts (the mini-swe-agent plug-in does). ``facts["problem_statement"]`` is the issue's text.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..capabilities import TaskBrief
from .episode import first_messages
from .workspace import TESTBED, prepare_command

if TYPE_CHECKING:
    from .env import SWEBenchEnv


def brief_task(env: SWEBenchEnv, task_id: str) -> TaskBrief:
    """The SWE environments' :class:`~sao.envs.capabilities.TaskBriefing`."""
    inst = env.get(task_id)
    image = env.resolve_image(inst)
    facts = {"instance_id": inst.instance_id, "repo": inst.repo, "base_commit": inst.base_commit,
             "image_source": image.source, "platform": image.platform, "problem_statement": inst.problem_statement,
             "setup_command": prepare_command(inst.base_commit, hide_history=env.hide_history)}
    return TaskBrief(tuple(first_messages(env.system_prompt, inst)), image=image.name, repo_path=TESTBED,
                     limits=env.limits, facts=facts)
