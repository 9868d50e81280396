"""The agent's container: preparing the repository (hiding the later history), the shell that runs
commands in the instance's environment, and taking the agent's diff."""

from __future__ import annotations

import shlex

from sao.sandboxes import DockerSandbox, SandboxError

TESTBED = "/testbed"


class WorkspaceError(SandboxError):
    """The agent's container could not be prepared (history hiding failed or could not be verified)."""


# $1 base commit. Hides every later commit, then verifies; prints the baseline (commit or tree).
_PREPARE = r"""
set -eu
cd /testbed
git config --global --add safe.directory /testbed 2>/dev/null || true
base=$(git rev-parse --verify --quiet "$1^{commit}") || { echo "base commit $1 is not in the repository" >&2; exit 3; }
head=$(git rev-parse --verify --quiet "HEAD^{commit}") || { echo "HEAD does not name a commit" >&2; exit 3; }
if [ "$head" != "$base" ]; then
    # swebench's own image builders end with `git commit --allow-empty -am SWE-bench`: one commit on
    # top of the base commit (holding what the install changed). Accept exactly that, nothing else.
    parents=$(git rev-list --parents -n 1 "$head" | cut -d' ' -f2-)
    subject=$(git log -1 --format=%s "$head")
    [ "$parents" = "$base" ] && [ "$subject" = SWE-bench ] || {
        echo "HEAD is $head, neither the base commit $base nor swebench's one 'SWE-bench' commit on top of it" \
             "(parents: ${parents:-none}, subject: $subject)" >&2; exit 3; }
fi
if [ "$2" = hide ]; then
    branch=$(git symbolic-ref --quiet --short HEAD 2>/dev/null || echo main)
    case $branch in sao/*|"") branch=main ;; esac
    for r in $(git remote); do git remote remove "$r"; done
    git update-ref --no-deref "refs/heads/$branch" "$base"
    git symbolic-ref HEAD "refs/heads/$branch"
    # Keep the tags that point into the base commit's own history (setuptools_scm and `git describe`
    # read them, and they reveal nothing later, as swebench keeps the tags older than the base commit);
    # every other ref goes.
    git for-each-ref --merged "$base" --format='%(refname)' refs/tags > /tmp/.sao-keep
    echo "refs/heads/$branch" >> /tmp/.sao-keep
    git for-each-ref --format='%(refname)' | grep -vxF -f /tmp/.sao-keep | sed 's/^/delete /' | git update-ref --stdin
    rm -f /tmp/.sao-keep
    rm -rf .git/logs .git/refs/original .git/rebase-merge .git/rebase-apply .git/sequencer .git/worktrees
    rm -f .git/ORIG_HEAD .git/FETCH_HEAD .git/MERGE_HEAD .git/CHERRY_PICK_HEAD .git/REVERT_HEAD \
          .git/COMMIT_EDITMSG .git/MERGE_MSG .git/SQUASH_MSG .git/AUTO_MERGE .git/BISECT_LOG .git/BISECT_START \
          .git/BISECT_EXPECTED_REV .git/objects/pack/*.keep .git/objects/pack/*.promisor
    if [ -n "$(git config --get extensions.partialClone || true)" ]; then
        echo "the repository is a partial clone (extensions.partialClone): its missing objects would be" \
             "fetched from the promisor remote; build the image from a full clone (git clone --no-local)" >&2; exit 4
    fi
    if [ -s .git/objects/info/alternates ]; then git repack -a -d -q; rm -f .git/objects/info/alternates; fi
    git -c gc.reflogExpire=now -c gc.reflogExpireUnreachable=now -c gc.rerereResolved=now \
        -c gc.rerereUnresolved=now -c gc.cruftPacks=false gc --prune=now --quiet
    git cat-file --batch-all-objects --batch-check='%(objecttype) %(objectname)' | sed -n 's/^commit //p' \
        | sort > /tmp/.sao-commits
    git rev-list "$base" | sort > /tmp/.sao-ancestors
    extra=$(comm -23 /tmp/.sao-commits /tmp/.sao-ancestors | head -n 3)
    rm -f /tmp/.sao-commits /tmp/.sao-ancestors
    if [ -n "$extra" ]; then
        echo "commits that are not ancestors of the base commit remain after git gc: $extra" >&2
        echo "git gc keeps objects of packs marked .keep or .promisor, of alternates, and of every ref;" \
             "left here: packs [$(ls .git/objects/pack | grep -v '\.\(pack\|idx\|rev\)$' | tr '\n' ' ')]," \
             "alternates [$(cat .git/objects/info/alternates 2>/dev/null | tr '\n' ' ')]," \
             "refs [$(git for-each-ref --format='%(refname)' | tr '\n' ' ')]" >&2
        exit 4
    fi
fi
idx=$(mktemp)
cp .git/index "$idx"
GIT_INDEX_FILE=$idx git add -A
tree=$(GIT_INDEX_FILE=$idx git write-tree)
rm -f "$idx"
if [ "$tree" = "$(git rev-parse "$base^{tree}")" ]; then
    echo "baseline=$base"
else
    git update-ref refs/sao/baseline "$tree"  # keeps the snapshot alive through a `git gc`
    echo "baseline=$tree"
fi
"""

# $1 baseline, $2 output file. The diff of the working tree (new files included) against the baseline.
_DIFF = r"""
set -eu
cd /testbed
idx=$(mktemp)
cp .git/index "$idx" 2>/dev/null || rm -f "$idx"
export GIT_INDEX_FILE="$idx"
git -c core.autocrlf=false -c core.safecrlf=false add -A
git -c core.quotePath=true -c diff.noprefix=false -c diff.mnemonicPrefix=false -c color.ui=never \
    diff --cached --binary --no-color --no-ext-diff --no-textconv --no-renames --src-prefix=a/ --dst-prefix=b/ \
    "$1" > "$2"
rm -f "$idx"
wc -c < "$2"
"""

# Commands run with bash; swebench's images keep the project's Python in the conda env "testbed".
_SHELL_PRELUDE = ("if [ -f /opt/miniconda3/bin/activate ]; then . /opt/miniconda3/bin/activate >/dev/null 2>&1 "
                  "&& conda activate testbed >/dev/null 2>&1; fi\n")
_TOOL_ENV = {"PAGER": "cat", "GIT_PAGER": "cat", "MANPAGER": "cat", "SYSTEMD_PAGER": "", "TERM": "dumb",
             "PIP_PROGRESS_BAR": "off", "PIP_NO_INPUT": "1", "TQDM_DISABLE": "1", "PYTHONDONTWRITEBYTECODE": "1"}


def shell(command: str) -> str:
    """``command`` as a bash script with the instance's environment activated."""
    return f"bash -c {shlex.quote(_SHELL_PRELUDE + command)}"


def prepare_command(base_commit: str, *, hide_history: bool) -> str:
    """The shell command that prepares the repository at /testbed: with ``hide_history``, every route to
    the commits after ``base_commit`` removed (and verified); it prints ``baseline=SHA``."""
    return f"sh -c {shlex.quote(_PREPARE)} prepare {shlex.quote(base_commit)} {'hide' if hide_history else 'keep'}"


def prepare_workspace(sb: DockerSandbox, base_commit: str, *, hide_history: bool) -> str:
    """Hide the history after ``base_commit`` (and verify); return the baseline to diff against."""
    result = sb.run(prepare_command(base_commit, hide_history=hide_history), timeout_s=600)
    baseline = next((ln.split("=", 1)[1] for ln in result.output.splitlines() if ln.startswith("baseline=")), "")
    if result.exit_code != 0 or not baseline:
        raise WorkspaceError(f"cannot prepare the repository in {sb.name} (exit {result.exit_code}): "
                             f"{result.output.strip()[-1500:]}")
    return baseline.strip()


def take_diff(sb: DockerSandbox, baseline: str, *, max_bytes: int) -> tuple[bytes | None, str]:
    """``(diff, problem)``: the agent's diff, or None and why it could not be taken (the agent's doing)."""
    out = "/tmp/.sao-agent.diff"
    result = sb.run(f"sh -c {shlex.quote(_DIFF)} diff {shlex.quote(baseline)} {out}", timeout_s=300)
    if result.exit_code != 0:
        return None, f"diff_failed: `git diff` failed in the agent's repository (exit {result.exit_code}): " \
                     f"{result.output.strip()[-800:]}"
    size = int(result.output.strip().splitlines()[-1]) if result.output.strip() else 0
    if size > max_bytes:
        return None, f"patch_too_large: the diff has {size} bytes, over max_patch_bytes={max_bytes}"
    return (sb.read_file(out) if size else b""), ""



def final_diff(sb: DockerSandbox, baseline: str, max_bytes: int,
               error: str | None) -> tuple[bytes | None, str, str | None]:
    """``(diff, problem, error)`` at an episode's end: :func:`take_diff`'s diff and problem, and ``error``
    (an infrastructure error: then no diff is taken) or the container's failure while taking it."""
    if error is not None:
        return None, "", error
    try:
        return *take_diff(sb, baseline, max_bytes=max_bytes), None
    except SandboxError as exc:
        return None, "", f"the agent's container failed while taking the diff: {exc}"
