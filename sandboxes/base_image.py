"""The local sandbox base image, built without an image registry.

``scripts/build-base-image`` debootstraps a minimal Debian bookworm (``python3``, ``git``,
``patch``, ``python3-pytest``) from the mirror apt uses on this machine and ``docker import``\\s
it as :data:`BASE_IMAGE`. It is cached by tag (nothing is done when the tag exists) and
serialised by a lock file, so concurrent builders wait for one build. It needs root,
``debootstrap``, the ``docker`` CLI and a running daemon; it takes about a minute and a quarter
on two cores and yields an image of about 210 MB.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

from .docker import connect
from .errors import SandboxStartError

BASE_IMAGE = "sao-base:bookworm-v1"
"""Tag of the base image. Bump the version when the package list or the build changes."""

SCRIPT_ENV = "SAO_BUILD_BASE_IMAGE_SCRIPT"


def build_script() -> Path:
    """The build script: ``$SAO_BUILD_BASE_IMAGE_SCRIPT`` or ``scripts/build-base-image`` of the checkout."""
    override = os.environ.get(SCRIPT_ENV)
    path = Path(override) if override else Path(__file__).resolve().parents[1] / "scripts" / "build-base-image"
    if not path.is_file():
        raise SandboxStartError(f"the base-image build script is not at {path}; run from a source checkout "
                                f"of sao or set {SCRIPT_ENV}")
    return path


def ensure_base_image(client: Any = None, *, tag: str = BASE_IMAGE, timeout_s: float = 1800) -> str:
    """Return ``tag``, building the image first when the daemon does not have it.

    Raises :class:`~sao.sandboxes.errors.DockerUnavailableError` when no daemon answers and
    :class:`~sao.sandboxes.errors.SandboxStartError` when the build fails (its output is in the
    message's tail).
    """
    import docker.errors

    own = client is None
    client = connect(client)
    try:
        try:
            client.images.get(tag)
            return tag
        except docker.errors.ImageNotFound:
            pass
        script = build_script()
        try:
            proc = subprocess.run(["bash", str(script), tag], capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired as exc:
            raise SandboxStartError(f"building {tag} took longer than {timeout_s:.0f} s") from exc
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-20:])
            raise SandboxStartError(f"building {tag} with {script} failed (exit {proc.returncode}):\n{tail}")
        client.images.get(tag)  # raises if the script lied
        return tag
    finally:
        if own:
            client.close()
