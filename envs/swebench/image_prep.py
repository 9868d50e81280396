"""Instance images at scale: resolve (and pull, a few at a time) every selected instance's image before
any episode starts, measure the disk images take, and remove the images a run pulled or built.

:func:`prepare_images` is what ``sao-eval --prepare`` and ``sao-sandbox images`` run; :func:`clean_images`
is ``sao-eval --clean-images``. Removal goes by name (``docker rmi NAME``, never forced): an image
that has other names only loses this one, and one a container uses stays (reported)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from .images import InstanceImageError, ResolvedImage
from .instances import SWEInstance

PREPARE_WORKERS = 3
"""Pulls in flight at once. Each pull already downloads 3 layers at a time (the daemon's
``max-concurrent-downloads``), so 3 pulls keep 9 downloads busy; more mostly share the same link."""

OWNED_SOURCES = ("swebench-build",)
"""Sources whose image the run made itself, so it may remove it (a pulled image of any source too)."""


@dataclass(frozen=True)
class ImagePreparation:
    """What preparing found: ``ready`` (instance id -> image) and ``missing`` (instance id -> every attempt,
    one line each, as the resolver tried them)."""

    ready: dict[str, ResolvedImage] = field(default_factory=dict)
    missing: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def owned(self) -> dict[str, str]:
        """Image name -> instance id, for the images this preparation pulled or built."""
        return {img.name: iid for iid, img in self.ready.items() if owned(img.pulled, img.source)}

    def describe(self) -> str:
        """One line per instance: ready (and how), or missing with the resolver's attempts."""
        lines = [f"ready    {iid}: {img.name} ({img.source}{', pulled' if img.pulled else ''}"
                 f"{', built' if img.source in OWNED_SOURCES else ''})" for iid, img in self.ready.items()]
        return "\n".join(lines + ([self.describe_missing()] if self.missing else []))

    def describe_missing(self) -> str:
        """Each missing instance, and under it each attempt."""
        return "\n".join(f"MISSING  {iid}:" + "".join(f"\n    {line}" for line in attempts)
                         for iid, attempts in self.missing.items())


def owned(pulled: bool, source: str | None) -> bool:
    """Whether an image resolved this way was pulled or built by the run that resolved it."""
    return bool(pulled) or source in OWNED_SOURCES


def prepare_images(resolve: Callable[[SWEInstance], ResolvedImage], instances: Sequence[SWEInstance], *,
                   workers: int = PREPARE_WORKERS) -> ImagePreparation:
    """Resolve every instance's image with ``resolve`` (an :class:`~.images.ImageResolver`'s, which pulls
    and, with ``build``, builds), ``workers`` at a time; an instance without one is listed with the
    resolver's attempts (:class:`~.images.InstanceImageError`), the others go on."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1 (got {workers})")

    def one(inst: SWEInstance) -> ResolvedImage | tuple[str, ...]:
        try:
            return resolve(inst)
        except InstanceImageError as exc:
            return exc.attempts or (str(exc),)

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="prepare") as pool:
        found = list(pool.map(one, instances))
    prep = ImagePreparation()
    for inst, got in zip(instances, found):
        if isinstance(got, ResolvedImage):
            prep.ready[inst.instance_id] = got
        else:
            prep.missing[inst.instance_id] = got
    return prep


def images_disk_bytes(client: Any) -> int | None:
    """The disk the daemon's images take: ``docker system df``'s ``LayersSize`` (each layer once, however
    many images share it; the sum of the images' sizes counts a shared base image once per image).
    None when the daemon does not say."""
    try:
        size = client.df().get("LayersSize")
    except Exception:  # noqa: BLE001 - a figure for the summary; its absence is not an error
        return None
    return int(size) if isinstance(size, (int, float)) else None


@dataclass(frozen=True)
class CleanReport:
    removed: list[str] = field(default_factory=list)
    gone: list[str] = field(default_factory=list)  # already absent (an earlier --clean-images, a user's rmi)
    kept: dict[str, str] = field(default_factory=dict)  # name -> why it was not removed
    failed: dict[str, str] = field(default_factory=dict)  # name -> the daemon's error (a container uses it, ...)


def to_remove(owned_images: Iterable[str], protected: Iterable[str]) -> tuple[list[str], dict[str, str]]:
    """The images a run may remove: those it pulled or built, less the ``protected`` ones (named in the
    user's image map); ``(to remove, kept with why)``."""
    keep = set(protected)
    names = sorted(set(owned_images))
    return [n for n in names if n not in keep], {n: "named in the image map" for n in names if n in keep}


def clean_images(client: Any, owned_images: Iterable[str], protected: Iterable[str]) -> CleanReport:
    """Remove :func:`to_remove`'s images by name (not forced: another name of the same image keeps it, and
    an image a container uses is reported in ``failed``)."""
    import docker.errors

    names, kept = to_remove(owned_images, protected)
    report = CleanReport(kept=kept)
    for name in names:
        try:
            client.images.remove(name)
            report.removed.append(name)
        except docker.errors.ImageNotFound:
            report.gone.append(name)
        except Exception as exc:  # noqa: BLE001 - reported; the run's results stand
            report.failed[name] = f"{type(exc).__name__}: {exc}"
    return report


def protected_images(image_map: Mapping[str, str]) -> set[str]:
    """The names the user's image map gives, with ``:latest`` added to a name without a tag, as Docker reads it."""
    from docker.utils import parse_repository_tag

    out = set()
    for name in image_map.values():
        repository, tag = parse_repository_tag(name)
        out |= {name, f"{repository}:{tag or 'latest'}"}
    return out


class EnvImages:
    """:class:`~sao.envs.capabilities.InstanceImages` of a SWE environment: its instances' images, found by
    its own resolver (its ``images``, ``pull``, ``pull_timeout_s``, ``pull_retries``, ``build``, ``platform``)."""

    def __init__(self, env: Any):
        self.env = env

    def prepare(self, task_ids: Sequence[str], workers: int = PREPARE_WORKERS) -> ImagePreparation:
        return prepare_images(self.env.resolve_image, [self.env.get(t) for t in task_ids], workers=workers)

    def disk_bytes(self) -> int | None:
        try:
            client = self.env._docker()
        except Exception:  # noqa: BLE001 - no daemon: no figure (the episodes will say why they failed)
            return None
        return images_disk_bytes(client)

    def clean(self, owned_images: Iterable[str]) -> CleanReport:
        """Remove ``owned_images`` (those a run pulled or built), never one the image map names."""
        return clean_images(self.env._docker(), owned_images, protected_images(self.env.image_map))


def prepare_rows(rows: str, **env_kwargs: Any) -> ImagePreparation:
    """``sao-sandbox images ROWS``: :meth:`EnvImages.prepare` for every instance of the rows file ``rows``
    (jsonl, json, parquet), in a SWE environment made with ``env_kwargs`` (``images``, ``pull``,
    ``pull_timeout_s``, ``pull_retries``, ``build``, ``platform``), as ``sao-eval --prepare`` runs it."""
    from .env import SWEBenchEnv
    from .instances import load_instances

    env = SWEBenchEnv(load_instances(rows), name=f"rows {rows}", **env_kwargs)
    try:
        return EnvImages(env).prepare(env.task_ids())
    finally:
        env.close()
