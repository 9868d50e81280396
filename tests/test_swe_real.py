"""Genuine SWE-bench Verified instances, rebuilt offline (tests/swe_real), graded by the project's harness.

The builder's pieces (history export, requirement lists, the F2P/P2P rule, test_patch extraction)
are tested on small git repositories made here, without Docker. The rest needs a Docker daemon
(skipped with a reason without one, unless ``SAO_REQUIRE_DOCKER=1``), the snapshots of pydata/xarray
and psf/requests (``$SAO_SWE_MIRROR/owner+name``, default /work/.mirror, where the ``fetch`` tool puts
them) and the Verified rows (../shared/data); a missing snapshot or data file skips with a message
that names every one missing and what to fetch, unless ``SAO_REQUIRE_SWE_REAL=1`` makes it a failure. The instances
are built into ``$SAO_SWE_REAL_DIR`` (default ~/.cache/sao/swe-real) and cached there and by image
tag: the first build takes a few minutes (the images, then the before/after test runs), later ones
about a second. Grading runs each instance's tests twice (gold, tests-only patch): about 5 minutes
on 2 cores, most of it pydata__xarray-6744's 1,670 rolling tests.

Tiers (tests/tiers.py): the default tier builds and grades one instance (:data:`ONE`, psf/requests:
gold resolves, an empty patch resolves none); every instance, and the checks on their images and
histories, are in the long tier.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path

import pytest

from sao.sandboxes import LABEL_KEY, DockerSandbox, SandboxStartError, gc, list_labelled
from sao.sandboxes.swe_history import export_history, resolve_source
from sao.sandboxes.swe_image import SWEImageSpec, image_tag
from sao.sandboxes.swe_wheels import requirement_lines
from tests.swe_real import build as swe_real

LABEL = f"pytest-swe-real-{uuid.uuid4().hex[:10]}"
REQUIRE_ENV = "SAO_REQUIRE_SWE_REAL"
ONE = "psf__requests-5414"  # the default tier's instance: a small image, its tests take seconds
OUT_ENV = "SAO_SWE_REAL_DIR"


# -- the builder's pieces, on small repositories ------------------------------------------------------


def sh(*args: str, cwd: Path) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    return subprocess.run(args, cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def upstream(tmp_path) -> dict[str, str]:
    """A repository with a tagged release, the base commit, a fix commit (code + tests), a later tag and
    a side branch: what a fetched snapshot looks like."""
    repo = tmp_path / "up"
    repo.mkdir()
    sh("git", "init", "-q", "-b", "main", cwd=repo)
    (repo / "pkg").mkdir()
    (repo / "tests").mkdir()
    (repo / "pkg" / "core.py").write_text("def f():\n    return 1\n")
    (repo / "tests" / "test_core.py").write_text("from pkg.core import f\n\n\ndef test_f():\n    assert f() == 1\n")
    sh("git", "add", "-A", cwd=repo)
    sh("git", "commit", "-q", "-m", "first", cwd=repo)
    sh("git", "tag", "-a", "v1.0", "-m", "release", cwd=repo)
    (repo / "README").write_text("readme\n")
    sh("git", "add", "-A", cwd=repo)
    sh("git", "commit", "-q", "-m", "base", cwd=repo)
    base = sh("git", "rev-parse", "HEAD", cwd=repo)
    (repo / "pkg" / "core.py").write_text("def f():\n    return 2\n")
    (repo / "tests" / "test_core.py").write_text("from pkg.core import f\n\n\ndef test_f():\n    assert f() == 2\n")
    sh("git", "commit", "-q", "-am", "fix (#2)", cwd=repo)
    fix = sh("git", "rev-parse", "HEAD", cwd=repo)
    sh("git", "tag", "v2.0", cwd=repo)
    sh("git", "checkout", "-q", "-b", "side", base, cwd=repo)
    sh("git", "commit", "-q", "--allow-empty", "-m", "side work", cwd=repo)
    sh("git", "checkout", "-q", "main", cwd=repo)
    gold = sh("git", "diff", base, fix, "--", "pkg/core.py", cwd=repo) + "\n"
    return {"path": str(repo), "base": base, "fix": fix, "gold": gold}


def test_exported_history_ends_at_the_base_commit_with_its_tags(upstream, tmp_path):
    source = resolve_source(upstream["path"], upstream["base"][:8])
    assert source.base_commit == upstream["base"] and source.branch == "main"
    assert [name for name, _ in source.tags] == ["v1.0"]  # v2.0 tags the fix: not in the base's history
    dest = export_history(source, tmp_path / "out.git")
    assert sh("git", "--git-dir", str(dest), "rev-parse", "HEAD", cwd=tmp_path) == upstream["base"]
    refs = sh("git", "--git-dir", str(dest), "for-each-ref", "--format=%(refname)", cwd=tmp_path).split()
    assert refs == ["refs/heads/main", "refs/tags/v1.0"]
    commits = sh("git", "--git-dir", str(dest), "cat-file", "--batch-all-objects", "--batch-check=%(objecttype)",
                 cwd=tmp_path).split().count("commit")
    assert commits == 2  # first and base: neither the fix nor the side branch came along
    assert sh("git", "--git-dir", str(dest), "describe", "--tags", cwd=tmp_path).startswith("v1.0-1-g")
    assert not (dest / "objects" / "info" / "alternates").exists()


def test_resolve_source_says_what_is_wrong(upstream, tmp_path):
    with pytest.raises(SandboxStartError, match="not in"):
        resolve_source(upstream["path"], "0" * 40)
    with pytest.raises(SandboxStartError, match="not a git repository"):
        resolve_source(tmp_path, "HEAD")
    with pytest.raises(SandboxStartError, match="does not exist"):
        resolve_source(tmp_path / "nowhere", "HEAD")


def test_requirement_lists_must_be_pinned_and_plain():
    assert requirement_lines(["numpy==1.23.5  # comment", "", "# only a comment", "numpy==1.23.5", "x @ file:///w"]) \
        == ("numpy==1.23.5", "x @ file:///w")
    with pytest.raises(SandboxStartError, match="not pinned"):
        requirement_lines(["numpy>=1.20"])
    with pytest.raises(SandboxStartError, match="options are not supported"):
        requirement_lines(["-r other.txt"])
    with pytest.raises(SandboxStartError, match="requirements .* or a folder of wheels"):
        SWEImageSpec(repo=Path("."), base_commit="HEAD")


def test_image_tag_is_the_name_and_the_key_unless_a_tag_is_given():
    spec = SWEImageSpec(repo=Path("/work/.mirror/pydata+xarray/repo"), base_commit="x", requirements=("a==1",))
    assert image_tag(spec, "ab" * 32) == "sao-swe/xarray:" + "ab" * 8
    named = SWEImageSpec(repo=Path("."), base_commit="x", requirements=("a==1",), tag="localhost:5000/me/proj")
    assert image_tag(named, "cd" * 32) == "localhost:5000/me/proj:" + "cd" * 8  # a registry port is not a tag
    fixed = SWEImageSpec(repo=Path("."), base_commit="x", requirements=("a==1",), tag="me/proj:v1")
    assert image_tag(fixed, "cd" * 32) == "me/proj:v1"


def test_test_patch_is_the_fix_commits_test_diff(upstream):
    git_dir = Path(upstream["path"]) / ".git"
    patch = swe_real.test_patch_from_commit(git_dir, upstream["fix"], upstream["gold"])
    assert patch.startswith("diff --git a/tests/test_core.py b/tests/test_core.py")
    assert "pkg/core.py" not in patch and "+    assert f() == 2" in patch
    wrong_gold = upstream["gold"].replace("+    return 2", "+    return 3")
    with pytest.raises(swe_real.BuildError, match="is not the gold patch's commit"):
        swe_real.test_patch_from_commit(git_dir, upstream["fix"], wrong_gold)


def test_fail_to_pass_and_pass_to_pass_follow_swebench():
    # before: a fails, b passes, c errors, d is absent (it cannot be collected), e skips, f passes
    before = {"a": "FAILED", "b": "PASSED", "c": "ERROR", "e": "SKIPPED", "f": "PASSED"}
    # after: all pass but f (broken by the fix: in neither list) and e (still skipped: in neither)
    after = {"a": "PASSED", "b": "PASSED", "c": "PASSED", "d": "PASSED", "e": "SKIPPED", "f": "FAILED"}
    assert swe_real.test_lists(before, after) == (["a", "c", "d"], ["b"])


def test_missing_snapshots_are_named_with_what_to_fetch(tmp_path, monkeypatch):
    monkeypatch.setenv("SAO_SWE_MIRROR", str(tmp_path / "mirror"))
    (tmp_path / "mirror" / "psf+requests").mkdir(parents=True)  # a folder without a git dir is no snapshot
    with pytest.raises(swe_real.MissingInput) as exc:
        swe_real.build(tmp_path / "out", data=tmp_path / "rows.jsonl")
    message = str(exc.value)
    assert "fetch github:pydata/xarray and github:psf/requests" in message, message  # each once, all at once
    assert str(tmp_path / "rows.jsonl") in message and not (tmp_path / "out").exists()  # nothing built


def test_is_test_path_is_swebenchs_rule():
    assert swe_real.is_test_path("xarray/tests/test_rolling.py") and swe_real.is_test_path("tests/conftest.py")
    assert not swe_real.is_test_path("xarray/core/rolling.py") and not swe_real.is_test_path("doc/whats-new.rst")


# -- the genuine instances ------------------------------------------------------------------------------


def out_dir() -> Path:
    if os.environ.get(OUT_ENV):
        return Path(os.environ[OUT_ENV]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache).expanduser() / "sao" / "swe-real"


@pytest.fixture(scope="module")
def client(docker_client):
    yield docker_client
    left = list_labelled(docker_client, f"{LABEL_KEY}={LABEL}")
    gc(label=LABEL, client=docker_client)
    assert not left, f"containers left behind: {[c.name for c in left]}"


def _build(client, out: Path, only: list[str] | None = None):  # type: ignore[no-untyped-def]
    from sao.sandboxes import ensure_base_image

    ensure_base_image(client)
    try:
        return swe_real.build(out, only=only, label=LABEL, client=client)
    except swe_real.MissingInput as exc:
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"the genuine SWE-bench instances are required here ({REQUIRE_ENV}=1): {exc}")
        pytest.skip(f"{exc}; {REQUIRE_ENV}=1 makes this a failure")


def _instances(out: Path) -> list:
    from sao.envs.swebench import load_image_map, load_instances

    found = load_instances(out / "instances.jsonl")
    images = load_image_map(out / "images.json")
    assert sorted(images) == sorted(i.instance_id for i in found)
    return [(inst, images[inst.instance_id]) for inst in found]


@pytest.fixture(scope="module")
def built(client):
    return _build(client, out_dir())


@pytest.fixture(scope="module")
def instances(built):
    return _instances(out_dir())


@pytest.mark.docker
@pytest.mark.part("swebench")
def test_one_genuine_instance_gold_resolves_and_an_empty_patch_does_not(client):
    """The default tier's genuine instance (its own output folder, so that the long tier's full build and
    this one never write each other's files): swebench's eval script and log parser, in the project's
    grading container, on the real upstream code and tests."""
    out = out_dir() / "one"
    _build(client, out, only=[ONE])
    [(inst, image)] = _instances(out)
    assert inst.instance_id == ONE and inst.fail_to_pass and inst.pass_to_pass
    gold = grade(inst, inst.patch, image)
    assert gold.error is None, (gold.error, gold.log[-3000:])
    assert gold.resolved and gold.report["status"] == "resolved", gold.report.get("tests_status")
    assert sorted(gold.report["tests_status"]["FAIL_TO_PASS"]["success"]) == sorted(inst.fail_to_pass)
    empty = grade(inst, "", image)
    assert not empty.resolved and empty.error is None and empty.report["status"] == "empty_patch"


@pytest.mark.docker
@pytest.mark.long
@pytest.mark.part("swebench")
def test_the_instances_are_genuine_and_complete(built, instances):
    repos = {inst.repo for inst, _ in instances}
    assert len(instances) >= 3 and len(repos) >= 2 and "pydata/xarray" in repos  # xarray uses setuptools_scm
    provenance = json.loads((out_dir() / "provenance.json").read_text())
    for inst, image in instances:
        assert inst.fail_to_pass and inst.pass_to_pass and inst.known_to_swebench, inst.instance_id
        assert not set(inst.fail_to_pass) & set(inst.pass_to_pass)
        assert provenance[inst.instance_id]["image"] == image
        recipe = next(r for r in swe_real.load_recipes() if r.instance_id == inst.instance_id)
        assert provenance[inst.instance_id]["test_patch_commit"] == recipe.fix_commit
        assert inst.test_patch.startswith("diff --git") and "test" in inst.test_patch.split("\n", 1)[0]


@pytest.mark.docker
@pytest.mark.long
@pytest.mark.part("swebench")
def test_a_second_build_is_a_no_op(built, client):
    again = swe_real.build(out_dir(), label=LABEL, client=client)
    assert [b.image.tag for b in again] == [b.image.tag for b in built]
    assert not any(b.image.built for b in again) and all(b.eval_s == 0 for b in again)
    assert sum(b.image.duration_s for b in again) < 30


@pytest.mark.docker
@pytest.mark.long
@pytest.mark.part("swebench")
def test_the_images_hold_the_history_up_to_the_base_commit(instances, client):
    for inst, image in instances:
        with DockerSandbox(image, label=LABEL, client=client, workdir="/testbed") as sb:
            res = sb.run(". /opt/miniconda3/bin/activate && conda activate testbed && set -u && "
                         "git rev-parse HEAD && git remote | wc -l && git rev-list --all --not HEAD | wc -l && "
                         "git status --porcelain --untracked-files=no | wc -l && "
                         "printenv SETUPTOOLS_SCM_PRETEND_VERSION || echo no-pretend")
            assert res.ok, res.output
            head, remotes, later, dirty, pretend = res.output.split()
            assert (head, remotes, later, dirty, pretend) == (inst.base_commit, "0", "0", "0", "no-pretend")
            if inst.repo == "pydata/xarray":  # setuptools_scm computed the version from the tags in the history
                tag = sb.run("git describe --tags --abbrev=0").output.strip()
                version = sb.run(". /opt/miniconda3/bin/activate && conda activate testbed && "
                                 "python -c 'import xarray; print(xarray.__version__)'").output.strip()
                year, month = tag.lstrip("v").split(".")[:2]
                assert version.startswith(f"{year}.{int(month)}."), (tag, version)


def grade(inst, patch: str, image: str):
    from sao.envs.swebench import grade_patch

    return grade_patch(inst, patch.encode(), image, label=LABEL, timeout_s=900, log_chars=10**7)


@pytest.fixture(scope="module")
def gold(instances):
    return {inst.instance_id: (inst, grade(inst, inst.patch, image)) for inst, image in instances}


@pytest.mark.docker
@pytest.mark.long
@pytest.mark.part("swebench")
@pytest.mark.slow
def test_gold_resolves_every_instance(gold):
    for iid, (_, r) in gold.items():
        assert r.error is None, (iid, r.error, r.log[-3000:])
        assert r.resolved and r.report["status"] == "resolved", (iid, r.report.get("tests_status"), r.log[-3000:])


@pytest.mark.docker
@pytest.mark.long
@pytest.mark.part("swebench")
@pytest.mark.slow
def test_grading_installs_the_version_setuptools_scm_computes_in_the_image(gold, instances, client):
    # swebench's eval script re-runs `pip install -e .`; setuptools_scm then reads the version from the
    # tags in /testbed's history, which must still be there in the grading container (swebench keeps the
    # tags older than the base commit). Without them it falls back to 0.1.devN.
    import re

    versions = {}
    for inst, image in instances:
        if inst.repo != "pydata/xarray":
            continue
        with DockerSandbox(image, label=LABEL, client=client, workdir="/testbed") as sb:
            built = sb.run(". /opt/miniconda3/bin/activate && conda activate testbed && "
                           "python -c 'import xarray; print(xarray.__version__)'").output.strip()
        graded = re.findall(r"Successfully installed xarray-(\S+)", gold[inst.instance_id][1].log)
        versions[inst.instance_id] = (built.split("+")[0], graded[-1].split("+")[0] if graded else None)
    assert versions and all(b == g for b, g in versions.values()), f"(in the image, at grading): {versions}"


@pytest.mark.docker
@pytest.mark.long
@pytest.mark.part("swebench")
def test_an_empty_patch_resolves_none(instances):
    for inst, image in instances:
        r = grade(inst, "", image)
        assert not r.resolved and r.error is None and r.report["status"] == "empty_patch"


@pytest.mark.docker
@pytest.mark.long
@pytest.mark.part("swebench")
@pytest.mark.slow
def test_a_patch_that_only_edits_the_tests_resolves_none(instances):
    # The upstream test changes themselves, sent as the fix: the grader resets those files and applies
    # test_patch, so the FAIL_TO_PASS tests still fail on the unfixed code.
    for inst, image in instances:
        r = grade(inst, inst.test_patch, image)
        assert r.error is None, (inst.instance_id, r.error, r.log[-3000:])
        assert not r.resolved and r.report["status"] == "unresolved", inst.instance_id
        assert r.report["patch_successfully_applied"]
        assert sorted(r.report["tests_status"]["FAIL_TO_PASS"]["failure"]) == sorted(inst.fail_to_pass)
