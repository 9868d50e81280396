"""``sao-sandbox``: housekeeping for Docker sandboxes.

    sao-sandbox gc [--label VALUE]   remove leftover sandbox containers (all, or one label value)
    sao-sandbox build-base [--tag T]  build the local base image (skipped when the tag exists)
    sao-sandbox build-swe-image --repo DIR --base-commit SHA (--requirements FILE | --wheels DIR) ...
                                     build an instance image offline (cached by a key of its inputs);
                                     prints the tag (see `sao-sandbox build-swe-image --help`)
    sao-sandbox images ROWS [--image-map MAP] [--no-pull] [--build-images] [--platform P] ...
                                     find (pull, build) the image of every SWE-bench row in ROWS, as
                                     `sao-eval --prepare` does; lists each, and each missing one's reasons

Exit status: 0 on success, 2 when the Docker daemon does not answer (and for `images`, when an
image is missing), 1 on other failures.

`images` is the one command here that reads SWE-bench rows: it runs `sao.envs.swebench.image_prep`,
imported when the command runs (the rest of this module, like the package, imports nothing above it).
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
    p_img = commands.add_parser("images", help="find, pull or build every SWE-bench instance's image, as "
                                "`sao-eval --prepare` does", description=IMAGES_HELP)
    p_img.add_argument("rows", metavar="ROWS", help="SWE-bench rows (jsonl, json or parquet, SWE-bench's schema)")
    p_img.add_argument("--image-map", default=None, metavar="MAP",
                       help="JSON file mapping instance_id to a Docker image, the only image tried for it")
    p_img.add_argument("--no-pull", dest="pull", action="store_false", help="pull nothing: check what is present")
    p_img.add_argument("--pull-timeout", type=float, default=30.0, metavar="S",
                       help="give up a pull after S seconds without progress (default 30)")
    p_img.add_argument("--pull-retries", type=int, default=1, metavar="N",
                       help="tries after the first for a stalled or failed pull, none after a definitive registry "
                            "answer (default 1)")
    p_img.add_argument("--build-images", action="store_true",
                       help="build a missing image with swebench's builders (needs the network)")
    p_img.add_argument("--platform", choices=["linux/amd64", "linux/arm64"], default=None,
                       help="pull every image for this platform (default: the host's; linux/amd64 for swebench's "
                            "USE_X86 instances on arm64)")
    return parser


IMAGES_HELP = """\
Find the image of every SWE-bench instance in ROWS as `sao-eval --prepare` does (the image map, the
row's `image`, swebench's names present or pulled a few at a time, and with --build-images swebench's
builders), and print one line per instance: ready (and how) or MISSING with every reason tried.
Exit 0 when every image is present, 2 when any is missing.
"""


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "gc":
            removed = gc(label=args.label)
            scope = f"{LABEL_KEY}={args.label}" if args.label is not None else LABEL_KEY
            print(f"removed {removed} sandbox container{'s' if removed != 1 else ''} ({scope})")
        elif args.command == "build-base":
            print(ensure_base_image(tag=args.tag))
        elif args.command == "images":
            return _images(args)
        else:
            return _build_swe_image(args)
    except DockerUnavailableError as exc:
        print(f"sao-sandbox: {exc}", file=sys.stderr)
        return 2
    except SandboxError as exc:
        print(f"sao-sandbox: {exc}", file=sys.stderr)
        return 1
    return 0


def _images(args: argparse.Namespace) -> int:
    from sao.envs.errors import EnvError
    from sao.envs.swebench.image_prep import prepare_rows

    try:
        prep = prepare_rows(args.rows, images=args.image_map, pull=args.pull, pull_timeout_s=args.pull_timeout,
                            pull_retries=args.pull_retries, build=args.build_images, platform=args.platform)
    except (EnvError, ValueError) as exc:
        print(f"sao-sandbox: {exc}", file=sys.stderr)
        return 2
    print(prep.describe())
    if prep.missing:
        print(f"sao-sandbox: {len(prep.missing)} of {len(prep.ready) + len(prep.missing)} instance images are "
              "missing: name images with --image-map, `docker load` them, let pulls reach the registry, or build "
              "them with --build-images (needs the network)", file=sys.stderr)
        return 2
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
