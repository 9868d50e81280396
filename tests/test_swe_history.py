"""History hiding on real git in a real container (sao.envs.swebench.workspace.prepare_workspace).

One repository per test, made inside a container of the base image: a base commit with older
tags, later commits (a fix, a later tag, a remote-tracking branch), so the rules are checked one
by one: the tags in the base commit's own history stay (setuptools_scm needs them), everything
later goes, swebench's own ``SWE-bench`` commit on top of the base is accepted and anything else
on top is refused, and a pack marked ``.promisor`` cannot keep a later commit alive.
"""

from __future__ import annotations

import uuid

import pytest

from sao.envs.swebench import WorkspaceError, prepare_workspace
from sao.sandboxes import DockerSandbox, ensure_base_image, gc

LABEL = f"pytest-{uuid.uuid4().hex[:10]}"

pytestmark = pytest.mark.docker

# v0.1 on the first commit, base (v0.2 on it as an annotated tag), then the fix (v0.3) and a branch
_REPO = r"""
set -e
rm -rf /testbed && mkdir /testbed && cd /testbed
git init -q -b main . && git config user.email t@t && git config user.name t
echo 1 > a.txt && git add a.txt && git commit -qm one && git tag v0.1
echo 2 > a.txt && git commit -qam base && git tag -a v0.2 -m "release 0.2"
base=$(git rev-parse HEAD)
echo fix > a.txt && git commit -qam fix && git tag v0.3
git update-ref refs/remotes/origin/main HEAD
git reset -q --hard "$base"
echo "$base"
"""


@pytest.fixture(scope="module")
def client(docker_client):
    yield docker_client
    gc(label=LABEL, client=docker_client)


@pytest.fixture()
def sb(client):
    with DockerSandbox(ensure_base_image(client), label=LABEL, client=client) as sandbox:
        yield sandbox


def make_repo(sb: DockerSandbox, extra: str = "") -> str:
    res = sb.run(f"bash -c {_quote(_REPO + extra)}")
    assert res.ok, res.output
    return res.output.split()[-1] if not extra else res.output.split()[0]


def _quote(script: str) -> str:
    import shlex

    return shlex.quote(script)


def git(sb: DockerSandbox, args: str) -> str:
    res = sb.run(f"cd /testbed && git {args}")
    assert res.ok, res.output
    return res.output.strip()


def test_tags_in_the_base_history_stay_and_everything_later_goes(sb):
    base = make_repo(sb)
    assert prepare_workspace(sb, base, hide_history=True) == base
    assert git(sb, "tag").split() == ["v0.1", "v0.2"]
    assert git(sb, "describe --tags") == "v0.2"  # what setuptools_scm computes the version from
    assert git(sb, "rev-list --all").split() == git(sb, f"rev-list {base}").split()
    assert git(sb, "for-each-ref --format='%(refname)'").split() == ["refs/heads/main", "refs/tags/v0.1",
                                                                  "refs/tags/v0.2"]
    assert "fix" not in git(sb, "log --all --format=%s").split()


def test_swebenchs_own_commit_on_top_of_the_base_is_accepted(sb):
    # as swebench's repo script ends: `git commit --allow-empty -am SWE-bench`, with an install artifact
    base = make_repo(sb, 'echo built > a.txt && git commit -q --allow-empty -am SWE-bench\n')
    baseline = prepare_workspace(sb, base, hide_history=True)
    assert baseline != base  # the working tree differs from the base commit's: the snapshot is the baseline
    assert git(sb, "rev-parse HEAD") == base
    assert git(sb, "show --format=%s -s HEAD") == "base"
    assert sb.run("cat /testbed/a.txt").output.strip() == "built"
    assert git(sb, "rev-list --all").split() == git(sb, f"rev-list {base}").split()


def test_any_other_commit_on_top_of_the_base_is_refused(sb):
    base = make_repo(sb, 'echo x > b.txt && git add b.txt && git commit -qm "not swebench"\n')
    with pytest.raises(WorkspaceError, match="neither the base commit"):
        prepare_workspace(sb, base, hide_history=True)


def test_a_promisor_pack_does_not_keep_a_later_commit(sb):
    base = make_repo(sb)
    # pack everything (the fix included) and mark the pack as a promisor pack, as a plain local clone
    # of a partial-clone snapshot leaves it
    res = sb.run("cd /testbed && git repack -a -d -q && for p in .git/objects/pack/*.pack; do "
                 "touch ${p%.pack}.promisor; done && ls .git/objects/pack")
    assert res.ok and ".promisor" in res.output, res.output
    prepare_workspace(sb, base, hide_history=True)
    assert git(sb, "rev-list --all").split() == git(sb, f"rev-list {base}").split()
    objects = git(sb, "cat-file --batch-all-objects --batch-check='%(objecttype)'").split()
    assert objects.count("commit") == 2
