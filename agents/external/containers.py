"""The containers an external agent starts itself (mini-swe-agent's ``docker run``), found by their labels
and removed when its episode ends.

An episode's :class:`~.task.SandboxRules` carry three labels (:func:`episode_labels`): the project's
sandbox label ``io.sao.sandbox`` and its owner ``io.sao.sandbox.owner=HOST:PID`` (this process: after
a crash of it, the orphan reaper of :mod:`sao.sandboxes.orphans` removes them, as it removes any
sandbox of a dead owner), and the episode's own ``io.sao.sandbox.episode=ID``. After the agent's
subprocess ends, however it ended, :func:`remove_episode_containers` removes every container carrying
the episode's label. An agent that starts a container without the rules' labels is outside this net:
the labels are the contract with the adapters.
"""

from __future__ import annotations

import logging
from typing import Any

from sao.sandboxes import LABEL_KEY, LABEL_VALUE, DockerUnavailableError, list_labelled
from sao.sandboxes.docker_cleanup import OWNER_LABEL_KEY, connect
from sao.sandboxes.orphans import owner_label

log = logging.getLogger(__name__)

EPISODE_LABEL_KEY = "io.sao.sandbox.episode"
"""The label naming the episode whose agent started the container."""


def episode_labels(episode_id: str) -> dict[str, str]:
    """The labels every container of the episode ``episode_id`` carries (module doc)."""
    return {LABEL_KEY: LABEL_VALUE, OWNER_LABEL_KEY: owner_label(), EPISODE_LABEL_KEY: episode_id}


def remove_episode_containers(episode_id: str, client: Any = None) -> list[str]:
    """Remove every container (running or not) labelled with ``episode_id``; their names. Without a
    Docker daemon there is nothing to remove (an agent cannot have started one)."""
    import docker.errors

    try:
        docker_client = connect(client)
    except DockerUnavailableError:
        return []
    removed = []
    try:
        for container in list_labelled(docker_client, f"{EPISODE_LABEL_KEY}={episode_id}"):
            try:
                container.remove(force=True, v=True)
                removed.append(container.name)
            except docker.errors.NotFound:
                pass  # gone meanwhile (docker run --rm)
    finally:
        if client is None:
            docker_client.close()
    if removed:
        log.info("removed %d container(s) the agent of episode %s left: %s", len(removed), episode_id,
                 ", ".join(removed))
    return removed
