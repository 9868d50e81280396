"""Sandboxes where agent-written commands run: Docker, local (bubblewrap) and scripted fakes.

Everything implements the small :class:`Sandbox` protocol (``run``, ``read_file``,
``write_file``, ``list_dir``, ``close``) and is interchangeable; commands return an
:class:`ExecResult` (a timeout is a result, not an exception), resources are bounded by
:class:`SandboxLimits`, and :class:`SandboxPool` hands out fresh sandboxes to concurrent
episodes. The error model is written in :mod:`sao.sandboxes.errors`. :func:`build_swe_image`
builds a SWE-bench-style instance image offline from a local repository and wheels
(``sao-sandbox build-swe-image``).

This package is a leaf: it imports nothing else of ``sao``.
"""

from .base import TIMEOUT_EXIT_CODE, ExecResult, Sandbox, SandboxLimits
from .base_image import BASE_IMAGE, ensure_base_image
from .capacity import container_slots
from .docker import LABEL_KEY, LABEL_VALUE, DockerSandbox, gc
from .errors import (
    DockerUnavailableError,
    SandboxClosedError,
    SandboxError,
    SandboxPathError,
    SandboxStartError,
)
from .fake import FakeSandbox, FakeSandboxFactory
from .local import UNISOLATED_VAR, LocalSandbox, bwrap_usable, require_isolation
from .orphans import list_labelled
from .pool import SandboxPool
from .swe_image import ImageBuild, SWEImageSpec, build_swe_image

__all__ = [
    "BASE_IMAGE", "LABEL_KEY", "container_slots", "LABEL_VALUE", "TIMEOUT_EXIT_CODE", "DockerSandbox", "DockerUnavailableError",
    "ExecResult", "FakeSandbox", "FakeSandboxFactory", "ImageBuild", "LocalSandbox", "Sandbox", "SandboxClosedError",
    "SWEImageSpec", "SandboxError", "SandboxLimits", "SandboxPathError", "SandboxPool", "SandboxStartError",
    "build_swe_image", "bwrap_usable", "ensure_base_image", "gc", "list_labelled", "require_isolation",
    "UNISOLATED_VAR",
]
