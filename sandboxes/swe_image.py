"""Build a SWE-bench-style instance image offline: a repository at a commit, its environment, from wheels.

The image, ``FROM`` the local base image (:data:`~sao.sandboxes.base_image.BASE_IMAGE`), holds

* ``/testbed``: the repository checked out at ``base_commit`` (``HEAD`` is that commit, on a branch
  of the source's name), with the history up to it and the tags in it (see
  :mod:`sao.sandboxes.swe_history`); no remote, no later commit;
* ``/opt/miniconda3/envs/testbed``: a venv of the base image's ``python3`` with the requirements
  installed from ``/opt/wheels`` and the project installed by ``install`` (default
  ``python -m pip install -e .``, as SWE-bench does) with ``/testbed``'s git history at hand, so a
  setuptools_scm project computes its version from its own tags (nothing pins it);
* ``/opt/miniconda3/bin/activate``: a shim that defines ``conda activate NAME`` /
  ``conda deactivate`` over those venvs. swebench's eval scripts begin with
  ``source /opt/miniconda3/bin/activate; conda activate testbed`` and may re-run ``install``;
* pip configured (``$VIRTUAL_ENV/pip.conf``) with ``no-index`` and ``find-links = /opt/wheels``,
  so that re-install (build isolation included) works without a network.

Everything is built with ``docker build --network none``; the wheels come from
:func:`~sao.sandboxes.swe_wheels.fetch_wheels` (registry, on the host, cached) and/or a folder
the caller gives. The base image's ``python3`` must be the ``python`` asked for (wheel tags are
chosen for it); the build fails at once, saying so, when it is not.

Cache: the tag's default is ``<name>:<key16>``, where the key hashes every input (base image id,
commit, tags, requirements or wheel hashes, install command, the Dockerfile and shim text, the
builder version). An image with the tag and the same key (label ``io.sao.swe-image.key``) is not
built again, and nothing is downloaded or copied then. The environment layers come before the
repository in the Dockerfile, so instances that share requirements share those layers.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shlex
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .base_image import BASE_IMAGE
from .docker import connect
from .errors import SandboxStartError
from .swe_history import RepoSource, export_history, resolve_source
from .swe_wheels import DEFAULT_PLATFORM, Wheelhouse, fetch_wheels, requirement_lines, wheel_manifest

log = logging.getLogger(__name__)

BUILDER_VERSION = "1"
KEY_LABEL = "io.sao.swe-image.key"
ENV_DIR = "/opt/miniconda3/envs/testbed"
WHEELS = "/opt/wheels"
DEFAULT_INSTALL = "python -m pip install -e ."
PIP_PIN = "pip==23.2.1"
"""The pip that bootstraps the venv (the base image has no ensurepip) when the lists name none."""

CONDA_SHIM = r"""# sao's stand-in for conda's activate script: `conda activate NAME` activates the venv at
# /opt/miniconda3/envs/NAME; nothing else of conda exists here. Safe under `set -u`.
conda() {
    case "${1:-}" in
        activate)
            _sao_env="${2:-testbed}"
            if [ ! -f "/opt/miniconda3/envs/$_sao_env/bin/activate" ]; then
                echo "conda (sao shim): there is no environment $_sao_env" >&2
                return 1
            fi
            . "/opt/miniconda3/envs/$_sao_env/bin/activate"
            export CONDA_DEFAULT_ENV="$_sao_env" CONDA_PREFIX="/opt/miniconda3/envs/$_sao_env"
            ;;
        deactivate)
            if command -v deactivate >/dev/null 2>&1; then deactivate; fi
            unset CONDA_DEFAULT_ENV CONDA_PREFIX
            ;;
        *)
            echo "conda (sao shim): only 'conda activate NAME' and 'conda deactivate' exist here" >&2
            return 1
            ;;
    esac
}
"""

PIP_CONF = f"[global]\nno-index = true\nfind-links = {WHEELS}\ndisable-pip-version-check = true\n"

DOCKERFILE = """FROM {base_image}
COPY wheels/ {wheels}/
COPY activate /opt/miniconda3/bin/activate
COPY pip.conf /tmp/sao-pip.conf
RUN set -eu; \\
    have=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])'); \\
    if [ "$have" != "{python}" ]; then echo "the base image's python3 is $have, not {python}" >&2; exit 1; fi; \\
    python3 -m venv --without-pip {env}; \\
    mv /tmp/sao-pip.conf {env}/pip.conf; \\
    {env}/bin/python {wheels}/{pip_wheel}/pip install --quiet --no-index --find-links {wheels} {pip_req}; \\
    {env}/bin/python -m pip install --no-index --find-links {wheels} {install_args}; \\
    {env}/bin/python -m pip list
COPY testbed.git /testbed/.git
RUN set -eu; cd /testbed; git config core.bare false; git reset --quiet --hard; \\
    test "$(git rev-parse HEAD)" = {base_commit}; \\
    . /opt/miniconda3/bin/activate; conda activate testbed; \\
    {install}; \\
    git status --short
WORKDIR /testbed
"""


@dataclass(frozen=True)
class SWEImageSpec:
    """What an instance image is made of.

    ``repo``: a local clone or git dir holding ``base_commit``. ``requirements``: pinned lines
    (``name==version``) installed into the venv, downloaded as wheels for ``python``;
    ``build_requirements``: pinned lines downloaded only (what ``install`` needs in pip's build
    isolation, e.g. setuptools, setuptools_scm). ``wheels``: a folder of wheels added to the wheel
    folder; when no ``requirements`` are given, every wheel in it is installed. ``install`` runs in
    ``/testbed`` with the venv active. ``tag``: ``NAME`` (the key becomes the tag) or ``NAME:TAG``.
    """

    repo: Path
    base_commit: str
    python: str = "3.11"
    requirements: tuple[str, ...] = ()
    build_requirements: tuple[str, ...] = ()
    wheels: Path | None = None
    install: str = DEFAULT_INSTALL
    tag: str | None = None
    branch: str | None = None
    base_image: str = BASE_IMAGE
    platform: str = DEFAULT_PLATFORM
    labels: tuple[tuple[str, str], ...] = field(default=())

    def __post_init__(self) -> None:
        if not re.fullmatch(r"3\.\d+", self.python):
            raise SandboxStartError(f"python must be a version like 3.11 (got {self.python!r})")
        if not self.requirements and self.wheels is None:
            raise SandboxStartError("give requirements (a pinned list) or a folder of wheels, or both")
        if self.wheels is not None and not Path(self.wheels).is_dir():
            raise SandboxStartError(f"the wheel folder {self.wheels} does not exist")
        requirement_lines(self.requirements + self.build_requirements)  # refuses unpinned lines early


@dataclass(frozen=True)
class ImageBuild:
    """The outcome: the tag, the cache key, whether it was built now (False: found in the cache),
    the seconds it took, and the image's size in bytes."""

    tag: str
    key: str
    built: bool
    duration_s: float
    size_bytes: int


def _pip_pinned(lines: Sequence[str]) -> str | None:
    return next((ln for ln in lines if re.match(r"pip\s*==", ln, re.IGNORECASE)), None)


def image_key(spec: SWEImageSpec, source: RepoSource, base_image_id: str) -> str:
    blob = json.dumps({
        "builder": BUILDER_VERSION, "base_image": base_image_id, "commit": source.base_commit,
        "branch": source.branch, "tags": source.tags, "python": spec.python, "platform": spec.platform,
        "requirements": list(spec.requirements), "build_requirements": sorted(spec.build_requirements),
        "wheels": wheel_manifest(Path(spec.wheels)) if spec.wheels else None, "install": spec.install,
        "dockerfile": DOCKERFILE, "shim": CONDA_SHIM, "pip_conf": PIP_CONF, "labels": sorted(spec.labels),
    }, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def image_tag(spec: SWEImageSpec, key: str) -> str:
    if spec.tag and ":" in spec.tag.rsplit("/", 1)[-1]:
        return spec.tag
    name = spec.tag or f"sao-swe/{re.sub(r'[^a-z0-9._-]+', '-', _repo_name(spec.repo).lower()).strip('-.') or 'repo'}"
    return f"{name}:{key[:16]}"


def _repo_name(repo: Path) -> str:
    p = Path(repo).expanduser().resolve()
    name = p.name if p.name not in ("repo", ".git") else p.parent.name
    return name.removesuffix(".git").split("+")[-1]


def _cached(client: Any, tag: str, key: str) -> Any | None:
    import docker.errors

    try:
        image = client.images.get(tag)
    except docker.errors.ImageNotFound:
        return None
    return image if (image.labels or {}).get(KEY_LABEL) == key else None


def build_swe_image(spec: SWEImageSpec, *, client: Any = None, timeout_s: float = 3600) -> ImageBuild:
    """Build (or find in the cache) the image of ``spec``; see the module docstring.

    Raises :class:`SandboxStartError` (the base image missing, the commit absent, a wheel that
    cannot be had, the build failing: the message has the build log's tail) and
    :class:`DockerUnavailableError` when no daemon answers.
    """
    import docker.errors

    started = time.monotonic()
    own = client is None
    client = connect(client)
    try:
        try:
            base_id = client.images.get(spec.base_image).id
        except docker.errors.ImageNotFound as exc:
            raise SandboxStartError(f"the base image {spec.base_image} is not present; build it with "
                                    "`sao-sandbox build-base`") from exc
        source = resolve_source(spec.repo, spec.base_commit, branch=spec.branch)
        key = image_key(spec, source, base_id)
        tag = image_tag(spec, key)
        found = _cached(client, tag, key)
        if found is not None:
            return ImageBuild(tag, key, False, time.monotonic() - started, int(found.attrs.get("Size", 0)))
        with tempfile.TemporaryDirectory(prefix="sao-swe-image-") as tmp:
            ctx = Path(tmp)
            install_args = _stage_wheels(spec, ctx / "wheels")
            export_history(source, ctx / "testbed.git")
            (ctx / "activate").write_text(CONDA_SHIM, encoding="utf-8")
            (ctx / "pip.conf").write_text(PIP_CONF, encoding="utf-8")
            pip_req = _pip_pinned(spec.requirements + spec.build_requirements) or PIP_PIN
            pip_wheel = _pip_wheel(ctx / "wheels", pip_req)
            (ctx / "Dockerfile").write_text(DOCKERFILE.format(
                base_image=spec.base_image, wheels=WHEELS, python=spec.python, env=ENV_DIR, pip_wheel=pip_wheel,
                pip_req=shlex.quote(pip_req), install_args=install_args, base_commit=source.base_commit,
                install=spec.install), encoding="utf-8")
            labels = {KEY_LABEL: key, "io.sao.swe-image.base-commit": source.base_commit, **dict(spec.labels)}
            _docker_build(client, ctx, tag, labels, timeout_s)
        image = client.images.get(tag)
        return ImageBuild(tag, key, True, time.monotonic() - started, int(image.attrs.get("Size", 0)))
    finally:
        if own:
            client.close()


def _stage_wheels(spec: SWEImageSpec, dest: Path) -> str:
    """Put every wheel the build needs into ``dest``; return pip's arguments for the venv install."""
    dest.mkdir()
    houses: list[Wheelhouse] = []
    wanted = spec.requirements + spec.build_requirements
    if _pip_pinned(wanted) is None:
        wanted = (*wanted, PIP_PIN)
    if wanted:
        houses.append(fetch_wheels(wanted, python=spec.python, platform=spec.platform))
    if spec.wheels is not None:
        houses.append(Wheelhouse(Path(spec.wheels)))
    for house in houses:
        for whl in house.files():
            target = dest / whl.name
            if not target.exists():
                try:
                    os.link(whl, target)
                except OSError:
                    shutil.copy2(whl, target)
    if spec.requirements:
        (dest / "requirements.txt").write_text("".join(f"{r}\n" for r in spec.requirements), encoding="utf-8")
        return f"-r {WHEELS}/requirements.txt"
    given = sorted(p.name for p in Path(spec.wheels).glob("*.whl")) if spec.wheels else []
    if not given:
        raise SandboxStartError(f"the wheel folder {spec.wheels} holds no wheels")
    return " ".join(shlex.quote(f"{WHEELS}/{n}") for n in given)


def _pip_wheel(folder: Path, pip_req: str) -> str:
    version = pip_req.split("==", 1)[1].strip()
    for whl in folder.glob("pip-*.whl"):
        if whl.name.startswith(f"pip-{version}-"):
            return whl.name
    raise SandboxStartError(f"no wheel of {pip_req} in the wheel folder (the venv is bootstrapped with it)")


def _docker_build(client: Any, ctx: Path, tag: str, labels: dict[str, str], timeout_s: float) -> None:
    """``docker build --network none`` of ``ctx`` with a low CPU share; raise with the log's tail on failure."""
    lines: list[str] = []
    error = None
    try:
        stream = client.api.build(path=str(ctx), tag=tag, labels=labels, network_mode="none", rm=True,
                                  forcerm=True, decode=True, timeout=int(timeout_s),
                                  container_limits={"cpushares": 2})
        for chunk in stream:
            if "stream" in chunk:
                for ln in chunk["stream"].splitlines():
                    if ln.strip():
                        lines.append(ln)
                        log.debug("build %s: %s", tag, ln)
            if "error" in chunk:
                error = chunk["error"].strip()
    except Exception as exc:  # noqa: BLE001 - API or connection error during the build
        error = f"{type(exc).__name__}: {exc}"
    if error is not None:
        tail = "\n".join(lines[-25:])
        raise SandboxStartError(f"docker build of {tag} failed: {error}\n{tail}")
