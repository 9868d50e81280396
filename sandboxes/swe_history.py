"""A repository's history up to one commit, copied out of a local clone for an instance image.

:func:`export_history` makes a fresh bare repository holding exactly the commits reachable from
``base_commit`` (one branch pointing at it, ``HEAD`` on that branch) and the tags among those
commits, by a ``git fetch`` over ``file://``. That fetch packs the objects anew, so nothing of the
source's pack files is shared or hard-linked (a snapshot's ``.promisor`` marker stays behind, as
with ``git clone --no-local``), and no later commit, branch, remote or reflog comes along: the
result needs no ``git gc`` to hide the fix.

Tags: SWE-bench's image script keeps the tags whose commits are older than the base commit and
deletes the rest, so that tools like setuptools_scm compute the version the project had then. We
keep the tags that point into the base commit's history (``git tag --merged``); those are the tags
``git describe`` can see, and none of them names a commit the agent must not see. A source may be
a work tree's clone or a bare git dir (e.g. a fetched snapshot).
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .errors import SandboxStartError

GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "true"}


@dataclass(frozen=True)
class RepoSource:
    """A commit in a local repository, resolved: the git dir, the full hash, the branch name to give it."""

    git_dir: Path
    base_commit: str
    branch: str
    tags: tuple[tuple[str, str], ...]  # (name, object id) of the tags in the base commit's history


def git(*args: str, cwd: Path | None = None, timeout_s: float = 600) -> str:
    """Run git; raise :class:`SandboxStartError` with its stderr when it fails."""
    try:
        proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout_s,
                              env={**os.environ, **GIT_ENV})
    except FileNotFoundError as exc:
        raise SandboxStartError("git is not installed on this machine") from exc
    except subprocess.TimeoutExpired as exc:
        raise SandboxStartError(f"`git {' '.join(args[:3])} ...` took longer than {timeout_s:.0f} s") from exc
    if proc.returncode != 0:
        raise SandboxStartError(f"`git {' '.join(args)}` failed (exit {proc.returncode}): {proc.stderr.strip()[-800:]}")
    return proc.stdout


def resolve_source(repo: str | os.PathLike, base_commit: str, *, branch: str | None = None) -> RepoSource:
    """Check that ``repo`` is a git repository holding ``base_commit``; name the branch (``branch``,
    else the source's current branch, else ``main``) and list the tags in the commit's history."""
    path = Path(repo).expanduser()
    if not path.exists():
        raise SandboxStartError(f"the repository {path} does not exist")
    try:
        git_dir = Path(git("-C", str(path), "rev-parse", "--absolute-git-dir").strip())
    except SandboxStartError as exc:
        raise SandboxStartError(f"{path} is not a git repository (a clone or a git dir): {exc}") from exc
    try:
        full = git("--git-dir", str(git_dir), "rev-parse", "--verify", "--quiet", f"{base_commit}^{{commit}}").strip()
    except SandboxStartError as exc:
        raise SandboxStartError(f"the base commit {base_commit} is not in {path}") from exc
    if branch is None:
        try:
            branch = git("--git-dir", str(git_dir), "symbolic-ref", "--quiet", "--short", "HEAD").strip() or "main"
        except SandboxStartError:
            branch = "main"
    names = git("--git-dir", str(git_dir), "tag", "--merged", full).split()
    tags = []
    if names:
        refs = git("--git-dir", str(git_dir), "show-ref", "--tags", *[f"refs/tags/{n}" for n in names])
        tags = sorted((ref.removeprefix("refs/tags/"), oid) for oid, ref in (ln.split() for ln in refs.splitlines()))
    return RepoSource(git_dir=git_dir, base_commit=full, branch=branch, tags=tuple(tags))


def export_history(source: RepoSource, dest: Path) -> Path:
    """Write a bare repository at ``dest`` with the history up to the base commit and its tags."""
    dest.mkdir(parents=True, exist_ok=False)
    git("init", "-q", "--bare", str(dest))
    gd = ["--git-dir", str(dest)]
    refspecs = [f"{source.base_commit}:refs/heads/{source.branch}",
                *[f"+refs/tags/{name}:refs/tags/{name}" for name, _ in source.tags]]
    # A fetch by object id needs the serving side to allow it (protocol v2 does; v0 needs the option).
    git(*gd, "fetch", "-q", "--no-tags", "--no-write-fetch-head",
        "--upload-pack", "git -c uploadpack.allowAnySHA1InWant=true upload-pack",
        f"file://{source.git_dir}", *refspecs, timeout_s=1800)
    git(*gd, "symbolic-ref", "HEAD", f"refs/heads/{source.branch}")
    head = git(*gd, "rev-parse", "HEAD").strip()
    if head != source.base_commit:
        raise SandboxStartError(f"the exported history has HEAD {head}, not the base commit {source.base_commit}")
    extra = git(*gd, "rev-list", "--all", "--not", source.base_commit).split()
    if extra:  # a tag on a commit outside the history can't happen with --merged; check anyway
        raise SandboxStartError(f"the exported history has commits outside {source.base_commit}'s: {extra[:3]}")
    return dest
