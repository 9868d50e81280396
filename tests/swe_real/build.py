"""Build genuine SWE-bench Verified instances offline, from the upstream repositories' history.

    python -m tests.swe_real.build OUT_DIR [--only ID ...] [--data FILE] [--recipes FILE]

writes ``OUT_DIR/instances.jsonl`` (SWE-bench's harness fields, the two test lists as JSON strings
as on the hub), ``OUT_DIR/images.json`` (``{instance_id: image tag}``) and
``OUT_DIR/provenance.json`` (per instance: the commit ``test_patch`` was taken from, the image key,
the counts and the timings). Use them as
``sao-eval swe-bench-verified --data OUT_DIR/instances.jsonl --image-map OUT_DIR/images.json``.

Each recipe in ``recipes.json`` names an instance, its base commit, its SWE-bench ``version`` (the
key of swebench's ``MAP_REPO_VERSION_TO_SPECS``), the upstream commit that fixed the issue, and
an environment (Python version and pinned wheels). For each one:

1. The problem statement and the gold patch are read from the data file (a SWE-bench Verified
   copy with at least ``instance_id, repo, base_commit, problem_statement, patch``; default
   ``../shared/data/swebench_partial/swebench_verified.jsonl`` beside the checkout,
   ``$SAO_SWE_REAL_DATA`` or ``--data`` to change). They are never written into the repository.
2. ``test_patch`` is the fix commit's diff (against its first parent) of its test files (paths
   containing ``test`` or ``e2e``, SWE-bench's rule). The commit's other changes must match the gold
   patch line for line on the gold patch's files, or the build stops: the commit must be the fix.
3. The image is built by :func:`sao.sandboxes.swe_image.build_swe_image` from the repository's
   snapshot (``$SAO_SWE_MIRROR/owner+name``, default ``/work/.mirror``, as the ``fetch`` tool lays
   them out) with the spec's ``install`` command.
4. FAIL_TO_PASS and PASS_TO_PASS as SWE-bench defines them: swebench's own eval script
   (``make_eval_script_list`` with the repo's specs: it activates ``testbed``, re-runs ``install``,
   applies ``test_patch``, runs the test files it touches) runs in a fresh container of the image
   without and then with the gold patch; swebench's parser (``MAP_REPO_TO_PARSER``) reads the logs;
   FAIL_TO_PASS = tests that fail or error (or do not exist) before and pass after, PASS_TO_PASS =
   tests that pass in both (``swebench.harness.grading.test_passed`` / ``test_failed``).

Cached: an image with the same key is not rebuilt, and the lists are kept in
``OUT_DIR/.cache/<instance_id>.json`` under a key of the image, the eval script and the gold
patch, so a second run starts no container. A missing snapshot or data file raises
:class:`MissingInput` (the tests skip on it unless ``SAO_REQUIRE_SWE_REAL=1``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sao.sandboxes import DockerSandbox, SandboxLimits
from sao.sandboxes.swe_history import git
from sao.sandboxes.swe_image import ImageBuild, SWEImageSpec, build_swe_image

log = logging.getLogger("sao.swe_real")

HERE = Path(__file__).resolve().parent
RECIPES = HERE / "recipes.json"
CHECKOUT = HERE.parents[1]
DATA_ENV = "SAO_SWE_REAL_DATA"
MIRROR_ENV = "SAO_SWE_MIRROR"
DEFAULT_MIRROR = Path("/work/.mirror")
DEFAULT_DATA = CHECKOUT.parent / "shared" / "data" / "swebench_partial" / "swebench_verified.jsonl"
IMAGE_PREFIX = "sao-swe-real"
CACHE_VERSION = "1"
TESTBED = "/testbed"
START, END = ">>>>> Start Test Output", ">>>>> End Test Output"


class MissingInput(RuntimeError):
    """A snapshot or the data file is not on this machine."""


class BuildError(RuntimeError):
    """An instance cannot be built as its recipe says (wrong fix commit, tests that do not run, ...)."""


@dataclass(frozen=True)
class Environment:
    name: str
    python: str
    requirements: tuple[str, ...]
    build_requirements: tuple[str, ...]


@dataclass(frozen=True)
class Recipe:
    instance_id: str
    repo: str
    base_commit: str
    version: str
    fix_commit: str
    environment: Environment


@dataclass(frozen=True)
class BuiltInstance:
    """One built row (SWE-bench's harness fields) with its image and what it cost."""

    row: dict[str, Any]
    image: ImageBuild
    fix_commit: str
    eval_s: float  # seconds of the before and after runs (0 when the lists came from the cache)


def load_recipes(path: Path = RECIPES) -> list[Recipe]:
    data = json.loads(path.read_text(encoding="utf-8"))
    envs = {name: Environment(name, e["python"], tuple(e["requirements"]), tuple(e.get("build_requirements", ())))
            for name, e in data["environments"].items()}
    return [Recipe(r["instance_id"], r["repo"], r["base_commit"], r["version"], r["fix_commit"],
                   envs[r["environment"]]) for r in data["instances"]]


def data_path(override: str | os.PathLike | None = None) -> Path:
    return Path(override or os.environ.get(DATA_ENV) or DEFAULT_DATA).expanduser()


def mirror_root() -> Path:
    return Path(os.environ.get(MIRROR_ENV) or DEFAULT_MIRROR).expanduser()


def snapshot(repo: str) -> Path:
    """The git dir of ``repo``'s snapshot: ``$SAO_SWE_MIRROR/owner+name`` (or its ``repo`` folder)."""
    folder = mirror_root() / repo.replace("/", "+")
    for candidate in (folder / "repo", folder):
        if (candidate / "HEAD").exists() or (candidate / ".git").exists():
            return candidate
    raise MissingInput(f"no snapshot of {repo} at {folder} (fetch github:{repo}, or set ${MIRROR_ENV})")


def missing_inputs(repos: Sequence[str], data: Path) -> str | None:
    """What is missing to build instances of ``repos`` from ``data``, said in one message (None: nothing)."""
    absent = [repo for repo in dict.fromkeys(repos) if not _has_snapshot(repo)]
    problems = []
    if absent:
        problems.append(f"no snapshot of {', '.join(absent)} under {mirror_root()}: fetch "
                        f"{' and '.join(f'github:{repo}' for repo in absent)} (the fetch tool lays each out as "
                        f"{mirror_root()}/owner+name/repo), or set ${MIRROR_ENV} to a folder that holds them")
    if not data.exists():
        problems.append(f"the SWE-bench Verified data file {data} is not present (set ${DATA_ENV})")
    return "; ".join(problems) or None


def _has_snapshot(repo: str) -> bool:
    try:
        snapshot(repo)
    except MissingInput:
        return False
    return True


def load_rows(path: Path, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    if not path.exists():
        raise MissingInput(f"the SWE-bench Verified data file {path} is not present (set ${DATA_ENV})")
    rows = {}
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                row = json.loads(line)
                if row.get("instance_id") in ids:
                    rows[row["instance_id"]] = row
    missing = [i for i in ids if i not in rows]
    if missing:
        raise MissingInput(f"{path} has no rows for {', '.join(missing)}")
    return rows


# -- test_patch from the fix commit ----------------------------------------------------------------


def is_test_path(path: str) -> bool:
    """SWE-bench's split of a pull request's files: a path naming a test (or e2e) folder or file."""
    return any(word in path for word in ("test", "tests", "e2e", "testing"))


def _changed_lines(diff: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    current = None
    for line in diff.splitlines():
        m = re.match(r"diff --git a/(\S+) b/", line)
        if m:
            current = out.setdefault(m.group(1), [])
        elif current is not None and line[:1] in "+-" and not line.startswith(("+++ ", "--- ")):
            current.append(line)
    return out


def test_patch_from_commit(git_dir: Path, fix_commit: str, gold_patch: str) -> str:
    """The fix commit's diff of its test files, after checking that its other changes are the gold patch."""
    gd = ["--git-dir", str(git_dir)]
    parent = git(*gd, "rev-parse", f"{fix_commit}^1").strip()
    files = git(*gd, "diff", "--name-only", "--no-renames", parent, fix_commit).split()
    tests = [f for f in files if is_test_path(f)]
    if not tests:
        raise BuildError(f"{fix_commit} changes no test files ({files})")
    gold = _changed_lines(gold_patch)
    theirs = _changed_lines(git(*gd, "diff", "--no-color", "--no-ext-diff", "--no-renames", parent, fix_commit,
                                "--", *gold))
    if gold != {f: theirs.get(f, []) for f in gold}:
        raise BuildError(f"{fix_commit} is not the gold patch's commit: its changes to {sorted(gold)} differ")
    return git(*gd, "diff", "--no-color", "--no-ext-diff", "--no-renames", parent, fix_commit, "--", *tests)


# -- FAIL_TO_PASS / PASS_TO_PASS --------------------------------------------------------------------


def eval_script(row: dict[str, Any]) -> str:
    """swebench's eval script for ``row`` (its repo and version must be in swebench's specs)."""
    from swebench.harness.constants import MAP_REPO_VERSION_TO_SPECS
    from swebench.harness.test_spec.create_scripts import make_eval_script_list

    specs = MAP_REPO_VERSION_TO_SPECS[row["repo"]][row["version"]]
    lines = make_eval_script_list(row, specs, "testbed", TESTBED, row["base_commit"], row["test_patch"])
    return "\n".join(["#!/bin/bash", "set -uxo pipefail", *lines]) + "\n"  # as swebench's TestSpec.eval_script


def run_eval(image: str, row: dict[str, Any], script: str, patch: str | None, *, label: str, client: Any = None,
             timeout_s: float = 1800) -> tuple[dict[str, str], str]:
    """``(status map, log)``: the eval script's test results in a fresh container, after ``patch``."""
    from swebench.harness.log_parsers import MAP_REPO_TO_PARSER

    with DockerSandbox(image, limits=SandboxLimits(), label=label, client=client, workdir=TESTBED,
                       name_prefix="sao-swe-real-") as sb:
        if patch is not None:
            sb.write_file("/tmp/gold.patch", patch)
            res = sb.run("git apply --verbose /tmp/gold.patch", timeout_s=120)
            if not res.ok:
                raise BuildError(f"{row['instance_id']}: the gold patch does not apply: {res.output[-800:]}")
        sb.write_file("/eval.sh", script, mode=0o755)
        res = sb.run("bash /eval.sh > /eval.log 2>&1", timeout_s=timeout_s)
        text = sb.read_file("/eval.log").decode("utf-8", errors="replace")
    if res.timed_out or START not in text or END not in text:
        raise BuildError(f"{row['instance_id']}: the eval script did not run to its end (exit {res.exit_code}, "
                         f"timed out {res.timed_out}):\n{text[-2000:]}")
    section = text.split(START, 1)[1].split(END, 1)[0]
    return MAP_REPO_TO_PARSER[row["repo"]](section, None), text


def test_lists(before: dict[str, str], after: dict[str, str]) -> tuple[list[str], list[str]]:
    """``(FAIL_TO_PASS, PASS_TO_PASS)`` from the status maps without and with the gold patch."""
    from swebench.harness.grading import test_failed, test_passed

    f2p = [t for t in after if test_passed(t, after) and test_failed(t, before)]
    p2p = [t for t in after if test_passed(t, after) and test_passed(t, before)]
    return f2p, p2p


# -- one instance, all instances --------------------------------------------------------------------


def build_instance(recipe: Recipe, source_row: dict[str, Any], out_dir: Path, *, label: str = "sao-swe-real",
                   client: Any = None) -> BuiltInstance:
    from swebench.harness.constants import MAP_REPO_VERSION_TO_SPECS

    iid = recipe.instance_id
    if source_row["repo"] != recipe.repo or source_row["base_commit"] != recipe.base_commit:
        raise BuildError(f"{iid}: the data row says {source_row['repo']}@{source_row['base_commit']}, the recipe "
                         f"{recipe.repo}@{recipe.base_commit}")
    specs = MAP_REPO_VERSION_TO_SPECS.get(recipe.repo, {}).get(recipe.version)
    if specs is None:
        raise BuildError(f"{iid}: swebench's specs do not know {recipe.repo} version {recipe.version}")
    git_dir = snapshot(recipe.repo)
    row = {
        "instance_id": iid, "repo": recipe.repo, "base_commit": recipe.base_commit,
        "problem_statement": source_row["problem_statement"], "patch": source_row["patch"],
        "test_patch": test_patch_from_commit(git_dir, recipe.fix_commit, source_row["patch"]),
        "FAIL_TO_PASS": "[]", "PASS_TO_PASS": "[]", "version": recipe.version,
        "environment_setup_commit": recipe.base_commit,
    }
    env = recipe.environment
    image = build_swe_image(SWEImageSpec(
        repo=git_dir, base_commit=recipe.base_commit, python=env.python, requirements=env.requirements,
        build_requirements=env.build_requirements, install=specs["install"], tag=f"{IMAGE_PREFIX}/{iid.lower()}",
        labels=(("io.sao.swe-real.instance", iid),)), client=client)
    script = eval_script(row)
    key = hashlib.sha256(json.dumps([CACHE_VERSION, image.key, script, row["patch"]]).encode()).hexdigest()
    cache = out_dir / ".cache" / f"{iid}.json"
    cached = json.loads(cache.read_text()) if cache.exists() else {}
    eval_s = 0.0
    if cached.get("key") == key:
        f2p, p2p = cached["FAIL_TO_PASS"], cached["PASS_TO_PASS"]
    else:
        started = time.monotonic()
        before, _ = run_eval(image.tag, row, script, None, label=label, client=client)
        after, after_log = run_eval(image.tag, row, script, row["patch"], label=label, client=client)
        eval_s = time.monotonic() - started
        f2p, p2p = test_lists(before, after)
        if not f2p:
            raise BuildError(f"{iid}: no test fails before the gold patch and passes after it; the log after:\n"
                             f"{after_log[-2000:]}")
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps({"key": key, "FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p, "eval_s": eval_s}))
    row.update(FAIL_TO_PASS=json.dumps(f2p), PASS_TO_PASS=json.dumps(p2p))
    return BuiltInstance(row, image, recipe.fix_commit, eval_s)


def build(out_dir: str | os.PathLike, *, only: Sequence[str] | None = None, data: str | os.PathLike | None = None,
          recipes: Path = RECIPES, label: str = "sao-swe-real", client: Any = None) -> list[BuiltInstance]:
    """Build every recipe (or those in ``only``) and write the three output files; see the module docstring."""
    out = Path(out_dir).expanduser().resolve()
    if out == CHECKOUT or CHECKOUT in out.parents:
        raise BuildError(f"{out} is inside the checkout; the rows hold benchmark text that must not be committed")
    chosen = [r for r in load_recipes(recipes) if not only or r.instance_id in only]
    if only and len(chosen) != len(set(only)):
        raise BuildError(f"unknown instance ids: {sorted(set(only) - {r.instance_id for r in chosen})}")
    missing = missing_inputs([r.repo for r in chosen], data_path(data))
    if missing:  # every missing input is reported, at once, before anything is built
        raise MissingInput(missing)
    rows = load_rows(data_path(data), [r.instance_id for r in chosen])
    out.mkdir(parents=True, exist_ok=True)
    built = []
    for recipe in chosen:
        b = build_instance(recipe, rows[recipe.instance_id], out, label=label, client=client)
        log.info("%s: %s (%s, %.0f s), %d FAIL_TO_PASS, %d PASS_TO_PASS", recipe.instance_id, b.image.tag,
                 "built" if b.image.built else "cached", b.image.duration_s, len(json.loads(b.row["FAIL_TO_PASS"])),
                 len(json.loads(b.row["PASS_TO_PASS"])))
        built.append(b)
    (out / "instances.jsonl").write_text("".join(json.dumps(b.row) + "\n" for b in built), encoding="utf-8")
    (out / "images.json").write_text(json.dumps({b.row["instance_id"]: b.image.tag for b in built}, indent=1) + "\n")
    (out / "provenance.json").write_text(json.dumps({b.row["instance_id"]: {
        "test_patch_commit": b.fix_commit, "image": b.image.tag, "image_key": b.image.key,
        "image_size_bytes": b.image.size_bytes, "image_built_now": b.image.built,
        "image_seconds": round(b.image.duration_s, 2), "eval_seconds": round(b.eval_s, 2),
        "FAIL_TO_PASS": len(json.loads(b.row["FAIL_TO_PASS"])), "PASS_TO_PASS": len(json.loads(b.row["PASS_TO_PASS"])),
    } for b in built}, indent=1) + "\n")
    return built


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.swe_real.build", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", help="where instances.jsonl, images.json and provenance.json go (not the repo)")
    parser.add_argument("--only", nargs="*", default=None, metavar="ID", help="build these instances only")
    parser.add_argument("--data", default=None, help=f"the SWE-bench Verified rows (default ${DATA_ENV} or "
                                                     f"{DEFAULT_DATA})")
    parser.add_argument("--recipes", default=str(RECIPES), help="the recipes file (default: the one beside this)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        build(args.out_dir, only=args.only, data=args.data, recipes=Path(args.recipes))
    except (MissingInput, BuildError) as exc:
        print(f"swe_real: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
