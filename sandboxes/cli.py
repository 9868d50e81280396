"""``sao-sandbox``: housekeeping for Docker sandboxes.

    sao-sandbox gc [--label VALUE]   remove leftover sandbox containers (all, or one label value)
    sao-sandbox build-base [--tag T]  build the local base image (skipped when the tag exists)
    sao-sandbox build-swe-image --repo DIR --base-commit SHA (--requirements FILE | --wheels DIR) ...
                                     build an instance image offline (cached by a key of its inputs);
                                     prints the tag (see `sao-sandbox build-swe-image --help`)

Exit status: 0 on success, 2 when the Docker daemon does not answer, 1 on other failures.
"""

from __future__ import annotations

import argparse
import sys

from .base_image import BASE_IMAGE, ensure_base_image
from .docker import LABEL_KEY, gc
from .errors import DockerUnavailableError, SandboxError
from .swe_image import DEFAULT_INSTALL, SWEImageSpec, build_swe_image
from .swe_wheels import read_requirements, requirement_lines

SWE_IMAGE_HELP = """\
Build a SWE-bench-style instance image without a network: /testbed is DIR's repository checked
out at SHA (HEAD == SHA, the history up to it and the tags in it, no remote), and the venv
/opt/miniconda3/envs/testbed (activated by `source /opt/miniconda3/bin/activate; conda activate
testbed`, as swebench's eval scripts do) has the requirements installed from wheels and the project
installed by --install. Wheels for --python are downloaded once on this host (pip download
--only-binary=:all: --no-deps, cached in $SAO_SWE_WHEELS_DIR or ~/.cache/sao/swe-wheels), so the
requirements file must list every distribution pinned (name==version, as `pip freeze` prints);
--wheels adds a folder of wheels you have (installed whole when no --requirements is given). The
image is built with --network none FROM the base image, whose python3 must be --python. The tag is
NAME:KEY (KEY hashes every input) unless --tag gives NAME:TAG; an image with the same key is not
built again. Prints the tag, the image size, and whether it was built or found.
Example (a private repository):
  sao-sandbox build-swe-image --repo ~/src/myproj --base-commit 1a2b3c4 \\
      --requirements requirements-frozen.txt --test-deps pytest==7.4.0 iniconfig==2.0.0 \\
      pluggy==1.2.0 packaging==23.1 --build-deps setuptools==68.0.0 wheel==0.40.0 --tag myproj-swe
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sao-sandbox", description="Housekeeping for Docker sandboxes.")
    commands = parser.add_subparsers(dest="command", required=True)
    p_gc = commands.add_parser("gc", help=f"remove sandbox containers (label {LABEL_KEY})")
    p_gc.add_argument("--label", default=None,
                      help=f"only containers with {LABEL_KEY}=VALUE (default: every sandbox container, "
                           "including other processes' live ones)")
    p_build = commands.add_parser("build-base", help="build the local sandbox base image without a registry")
    p_build.add_argument("--tag", default=BASE_IMAGE, help=f"image tag (default {BASE_IMAGE})")
    p_swe = commands.add_parser("build-swe-image", help="build a SWE-bench instance image offline from a local "
                                "repository and wheels", description=SWE_IMAGE_HELP,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p_swe.add_argument("--repo", required=True, help="a local clone or git dir holding the base commit")
    p_swe.add_argument("--base-commit", required=True, help="the commit /testbed is checked out at")
    p_swe.add_argument("--requirements", default=None, help="pinned requirements file (name==version a line)")
    p_swe.add_argument("--wheels", default=None, help="a folder of wheels to add (or to install, without "
                       "--requirements)")
    p_swe.add_argument("--test-deps", nargs="*", default=[], metavar="REQ",
                       help="more pinned requirements to install (e.g. pytest==7.4.0 and its dependencies)")
    p_swe.add_argument("--build-deps", nargs="*", default=[], metavar="REQ",
                       help="pinned requirements downloaded but not installed: what --install needs in pip's "
                            "build isolation (e.g. setuptools==68.0.0 wheel==0.40.0 setuptools_scm==7.1.0)")
    p_swe.add_argument("--python", default="3.11", help="the Python version the wheels are for; the base "
                       "image's python3 must be it (default 3.11)")
    p_swe.add_argument("--install", default=DEFAULT_INSTALL, help=f"how the project is installed, run in "
                       f"/testbed with the venv active (default {DEFAULT_INSTALL!r})")
    p_swe.add_argument("--tag", default=None, help="NAME (the key becomes the tag) or NAME:TAG "
                       "(default sao-swe/<repo name>:<key>)")
    p_swe.add_argument("--branch", default=None, help="the branch name HEAD is on in /testbed (default: the "
                       "source's current branch, else main)")
    p_swe.add_argument("--base-image", default=BASE_IMAGE, help=f"the image to build FROM (default {BASE_IMAGE})")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "gc":
            removed = gc(label=args.label)
            scope = f"{LABEL_KEY}={args.label}" if args.label is not None else LABEL_KEY
            print(f"removed {removed} sandbox container{'s' if removed != 1 else ''} ({scope})")
        elif args.command == "build-base":
            print(ensure_base_image(tag=args.tag))
        else:
            return _build_swe_image(args)
    except DockerUnavailableError as exc:
        print(f"sao-sandbox: {exc}", file=sys.stderr)
        return 2
    except SandboxError as exc:
        print(f"sao-sandbox: {exc}", file=sys.stderr)
        return 1
    return 0


def _build_swe_image(args: argparse.Namespace) -> int:
    from pathlib import Path

    reqs = read_requirements(args.requirements) if args.requirements else ()
    spec = SWEImageSpec(
        repo=Path(args.repo), base_commit=args.base_commit, python=args.python,
        requirements=reqs + requirement_lines(args.test_deps), build_requirements=requirement_lines(args.build_deps),
        wheels=Path(args.wheels) if args.wheels else None, install=args.install, tag=args.tag, branch=args.branch,
        base_image=args.base_image)
    result = build_swe_image(spec)
    how = f"built in {result.duration_s:.0f} s" if result.built else "found in the cache"
    print(f"{result.tag}\t{result.size_bytes / 1e6:.0f} MB\t{how}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
