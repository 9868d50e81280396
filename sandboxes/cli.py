"""``sao-sandbox``: housekeeping for Docker sandboxes.

    sao-sandbox gc [--label VALUE]   remove leftover sandbox containers (all, or one label value)
    sao-sandbox build-base [--tag T]  build the local base image (skipped when the tag exists)

Exit status: 0 on success, 2 when the Docker daemon does not answer, 1 on other failures.
"""

from __future__ import annotations

import argparse
import sys

from .base_image import BASE_IMAGE, ensure_base_image
from .docker import LABEL_KEY, gc
from .errors import DockerUnavailableError, SandboxError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sao-sandbox", description="Housekeeping for Docker sandboxes.")
    commands = parser.add_subparsers(dest="command", required=True)
    p_gc = commands.add_parser("gc", help=f"remove sandbox containers (label {LABEL_KEY})")
    p_gc.add_argument("--label", default=None,
                      help=f"only containers with {LABEL_KEY}=VALUE (default: every sandbox container, "
                           "including other processes' live ones)")
    p_build = commands.add_parser("build-base", help="build the local sandbox base image without a registry")
    p_build.add_argument("--tag", default=BASE_IMAGE, help=f"image tag (default {BASE_IMAGE})")
    args = parser.parse_args(argv)
    try:
        if args.command == "gc":
            removed = gc(label=args.label)
            scope = f"{LABEL_KEY}={args.label}" if args.label is not None else LABEL_KEY
            print(f"removed {removed} sandbox container{'s' if removed != 1 else ''} ({scope})")
        else:
            print(ensure_base_image(tag=args.tag))
    except DockerUnavailableError as exc:
        print(f"sao-sandbox: {exc}", file=sys.stderr)
        return 2
    except SandboxError as exc:
        print(f"sao-sandbox: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
