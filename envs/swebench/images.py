"""The image of an instance: the user's map, the row's ``image``, swebench's names (local or pulled),
swebench's builders."""

from __future__ import annotations

import json
import os
import platform as host
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sao.sandboxes import SandboxStartError

from ..errors import DatasetError, TaskError
from .instances import SWEInstance
from .pulls import PLATFORMS, PULL_RETRIES, pull_image


class InstanceImageError(TaskError, SandboxStartError):
    """No image could be found, pulled or built for an instance; the message lists every attempt
    (``attempts``, one line each)."""

    def __init__(self, message: str, attempts: tuple[str, ...] = ()):
        super().__init__(message)
        self.attempts = attempts


@dataclass(frozen=True)
class ResolvedImage:
    name: str
    source: str  # images-arg | row-image | swebench-name | swebench-build
    pulled: bool = False
    platform: str | None = None  # the platform it was asked for (pulls, containers); None: the daemon's own


def docker_arch() -> str:
    """swebench's name for this machine's architecture (``x86_64`` or ``arm64``)."""
    machine = host.machine().lower()
    return "arm64" if machine in ("arm64", "aarch64") else "x86_64"


def instance_platform(instance_id: str, platform: str | None = None) -> tuple[str, str | None]:
    """``(arch, platform)``: the architecture in swebench's names of the instance's image and the platform to
    pull it for and run it on. ``platform`` (``linux/amd64`` or ``linux/arm64``) decides when given; else
    an instance of swebench's ``USE_X86`` (its environment does not build on arm64) is ``linux/amd64`` on
    an arm64 host, as swebench's harness runs it; else the host's own (platform None)."""
    if platform is not None:
        return PLATFORMS[check_platform(platform)], platform
    if docker_arch() == "arm64":
        from swebench.harness.constants import USE_X86

        if instance_id in USE_X86:
            return "x86_64", "linux/amd64"
    return docker_arch(), None


def check_platform(platform: str | None) -> str | None:
    """``platform`` when it is one of :data:`~.pulls.PLATFORMS` (or None), else a ``ValueError`` naming them."""
    if platform is not None and platform not in PLATFORMS:
        from sao.hints import did_you_mean

        raise ValueError(f"platform {platform!r} is not one of {sorted(PLATFORMS)}.{did_you_mean(platform, PLATFORMS)}")
    return platform


def swebench_image_names(instance_id: str, arch: str | None = None, namespace: str = "swebench") -> tuple[str, str]:
    """``(local, remote)``: the names swebench gives an instance image when it builds it and when it
    publishes it (``TestSpec.instance_image_key`` without and with a namespace)."""
    key = f"sweb.eval.{arch or docker_arch()}.{instance_id.lower()}:latest"
    return key, f"{namespace}/{key}".replace("__", "_1776_")


class ImageResolver:
    """Finds the image of an instance: user map (exclusive when it names the instance), else the row's
    ``image``, swebench's names (local or pulled), swebench's build."""

    def __init__(self, client: Any, *, images: Mapping[str, str] | None = None, pull: bool = True,
                 pull_timeout_s: float = 30.0, pull_max_s: float = 3600.0, pull_retries: int = PULL_RETRIES,
                 build: bool = False, build_timeout_s: float = 3600.0, platform: str | None = None):
        self.client = client
        self.images = dict(images or {})
        self.pull = pull
        self.pull_timeout_s = pull_timeout_s
        self.pull_max_s = pull_max_s
        self.pull_retries = pull_retries
        self.platform = check_platform(platform)
        self.build = build
        self.build_timeout_s = build_timeout_s
        self._failed_pulls: dict[str, str] = {}
        self._lock = threading.Lock()

    def resolve(self, inst: SWEInstance) -> ResolvedImage:
        attempts: list[str] = []
        candidates: list[tuple[str, str]] = []
        arch, platform = instance_platform(inst.instance_id, self.platform)
        local, remote = swebench_image_names(inst.instance_id, arch)
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
                return ResolvedImage(name, source, platform=platform)
            if name == local:  # swebench's own builders' tag; it is never published, so not pulled
                continue
            if self.pull and self._pull(name, attempts, source, platform):
                return ResolvedImage(name, source, pulled=True, platform=platform)
        if not self.pull:
            attempts.append("pull: pulling is off (pull=False)")
        built = self._build(inst, attempts, arch) if inst.instance_id not in self.images else None
        if built:
            return ResolvedImage(built, "swebench-build", platform=platform)
        raise InstanceImageError(
            f"no image for instance {inst.instance_id!r}:\n- " + "\n- ".join(attempts)
            + "\nProvide one with images={instance_id: image} or the row's `image` field, load swebench's image "
              f"({remote}) with `docker load`, or pass build=True where swebench's builders can reach the network.",
            tuple(attempts))

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

    def _pull(self, name: str, attempts: list[str], source: str, platform: str | None) -> bool:
        with self._lock:
            if name in self._failed_pulls:
                attempts.append(f"{source}: pull {name} failed earlier ({self._failed_pulls[name]})")
                return False
        result = pull_image(self.client, name, platform=platform, timeout_s=self.pull_timeout_s,
                            max_s=self.pull_max_s, retries=self.pull_retries)
        if result.ok:
            return True
        tries = f"{result.tries} tries: " if result.tries > 1 else ""
        reason = f"{tries}{result.reason}" + (" - not retried, the registry's answer is final" * result.definitive)
        with self._lock:
            self._failed_pulls[name] = reason
        attempts.append(f"{source}: pull {name}{f' for {platform}' if platform else ''} failed ({reason})")
        return False

    def _build(self, inst: SWEInstance, attempts: list[str], arch: str) -> str | None:
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

                spec = make_test_spec(inst.swebench_row(), namespace=None, arch=arch)
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

