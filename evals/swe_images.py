"""A SWE run's instance images: ``--prepare`` (every selected instance's image found, pulled or built
before any engine or episode starts), the record of the images the run pulled or built (``images.json``
in the output folder, so that it survives ``--resume``), ``--clean-images`` (those removed after
grading), and the disk the daemon's images take at the start and at the end (``summary.json``).

``images.json`` holds ``{"owned": {image: {"instance_id", "source", "how"}}}``: the images this run's
preparation or episodes pulled (``how``: ``pulled``) or built (``built``). An image that was present
when the run looked for it is never in it, nor is one named in ``--image-map`` removed."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sao.agents import Trajectory
from sao.envs import make, resolve
from sao.envs.capabilities import InstanceImages, instance_images

from .errors import EvalError

log = logging.getLogger(__name__)

IMAGES = "images.json"
DISK_MEASURE = "docker system df LayersSize (bytes; each layer once)"


class ImagesMissing(EvalError):
    """``--prepare`` found no image for some selected instances; the message lists each with the reasons."""


class RunImages:
    """The images side of one invocation of a SWE run (see the module docstring)."""

    def __init__(self, output: Path, keeper: InstanceImages):
        self.output, self.keeper = output, keeper
        self.disk_start = keeper.disk_bytes()

    def prepare(self, task_ids: list[str]) -> Any:
        """Find every task's image; record those pulled or built; :class:`ImagesMissing` when any is missing."""
        prep = self.keeper.prepare(task_ids)
        self.record({name: entry(iid, prep.ready[iid].source, prep.ready[iid].pulled)
                     for name, iid in prep.owned().items()})
        if prep.missing:
            raise ImagesMissing(missing_message(prep, len(task_ids)))
        return prep

    def owned(self) -> dict[str, dict[str, Any]]:
        path = self.output / IMAGES
        if not path.is_file():
            return {}
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise EvalError(f"{path} cannot be read ({exc}): it records the images this run pulled; fix or "
                            "remove it (then --clean-images cannot remove what it named)") from exc
        return dict(data.get("owned", {})) if isinstance(data, dict) else {}

    def record(self, new: dict[str, dict[str, Any]]) -> None:
        """Add ``new`` (image -> how it came) to ``images.json``; earlier entries stay (a resumed run's pulls)."""
        owned = self.owned()
        if not new.keys() - owned.keys():
            return
        path = self.output / IMAGES
        path.write_text(json.dumps({"owned": owned | {k: v for k, v in new.items() if k not in owned}}, indent=2) + "\n")

    def finish(self, episodes: Iterable[Trajectory], clean: bool) -> dict[str, Any]:
        """Record the images the episodes pulled or built, remove the run's images with ``clean``; the
        summary's image figures."""
        self.record({t.info["image"]: entry(t.task_id, t.info.get("image_source"), bool(t.info.get("image_pulled")))
                     for t in episodes if episode_owned(t)})
        out: dict[str, Any] = {"images_disk_start_bytes": self.disk_start}
        if clean:
            report = self.keeper.clean(self.owned())
            out["images_cleaned"] = {"removed": report.removed, "gone": report.gone, "kept": report.kept,
                                     "failed": report.failed}
            for name, why in report.failed.items():
                log.warning("--clean-images: %s was not removed: %s", name, why)
        return out | {"images_disk_end_bytes": self.keeper.disk_bytes(), "images_disk_measure": DISK_MEASURE}


def episode_owned(t: Trajectory) -> bool:
    """Whether the episode pulled or built its image (``info``'s ``image_pulled``, ``image_source``)."""
    from sao.envs.swebench.image_prep import owned  # the SWE package, imported by SWE runs only

    return isinstance(t.info.get("image"), str) and owned(t.info.get("image_pulled"), t.info.get("image_source"))


def entry(instance_id: str, source: str | None, pulled: bool) -> dict[str, Any]:
    """An ``images.json`` entry of an image the run pulled or built."""
    return {"instance_id": instance_id, "source": source, "how": "pulled" if pulled else "built"}


def missing_message(prep: Any, total: int) -> str:
    return (f"{len(prep.missing)} of {total} instance images are missing; nothing was started:\n"
            f"{prep.describe_missing()}\n"
            "Fix: name images with --image-map FILE (instance_id -> image), `docker load` swebench's images, let "
            "the pulls reach the registry (--pull-timeout S for a slow one), or build them with --build-images "
            "(needs the network); `sao-sandbox images ROWS` checks the same without running")


@contextmanager
def run_images(benchmark: str, output: Path, env_kwargs: dict[str, Any], *,
               required: bool = False) -> Iterator[RunImages | None]:
    """The run's :class:`RunImages`, its environment closed at the end; None for an environment without
    instance images (:func:`~sao.envs.capabilities.instance_images`), an error when ``required``."""
    env = make(resolve(benchmark).name, **env_kwargs)
    try:
        keeper = instance_images(env)
        if keeper is None and required:
            raise EvalError(f"{benchmark} has no instance images (its class declares no `instance_images`): "
                            "--prepare and --clean-images are for environments that do")
        yield None if keeper is None else RunImages(output, keeper)
    finally:
        env.close()
