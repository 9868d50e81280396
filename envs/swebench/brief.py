"""A SWE-bench task as an external agent is told it (:class:`~sao.envs.capabilities.TaskBrief`): the
opening messages, the instance's image (resolved as an episode's would be: found, pulled or built),
the repository's path in it and the environment's container limits. No container is started: the
agent runs its own on the image, and what it returns is graded in a fresh one
(:func:`~.grading.grade_prediction`).

Note that the agent's own container is the image as it is: the environment's ``hide_history`` (which
removes the routes to later commits from an episode's workspace) is not applied there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..capabilities import TaskBrief
from .episode import first_messages
from .workspace import TESTBED

if TYPE_CHECKING:
    from .env import SWEBenchEnv


def brief_task(env: SWEBenchEnv, task_id: str) -> TaskBrief:
    """The SWE environments' :class:`~sao.envs.capabilities.TaskBriefing`."""
    inst = env.get(task_id)
    image = env.resolve_image(inst)
    facts = {"instance_id": inst.instance_id, "repo": inst.repo, "base_commit": inst.base_commit,
             "image_source": image.source, "platform": image.platform}
    return TaskBrief(tuple(first_messages(env.system_prompt, inst)), image=image.name, repo_path=TESTBED,
                     limits=env.limits, facts=facts)
