"""swebench's official harness (``run_evaluation`` 4.1.0, unchanged) and the project's grader agree
(:mod:`sao.envs.swebench.official`, ``benchmarks/swe_parity.py``).

Default tier, no Docker: the wrapper's one replacement (swebench's raw GitHub reads served by
``git show`` from a snapshot, a git repository made here) and the tag bookkeeping (a scripted Docker
client). Long tier: the parity on the genuine psf__requests-5414 (tests/test_swe_real.py's build and
skip rules), all three predictions, through the benchmark script as a user runs it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import docker.errors
import pytest

from sao.envs.swebench.official import (
    HarnessInputError,
    HarnessTags,
    SnapshotReads,
    harness_image_name,
    harness_main,
)
from tests.test_swe_real import ONE, _build, client, out_dir, sh  # noqa: F401 - client: the module's fixture

ROOT = Path(__file__).resolve().parents[1]
RAW = "https://raw.githubusercontent.com"


# -- the raw GitHub reads, from a snapshot ------------------------------------------------------------


@pytest.fixture
def mirror(tmp_path) -> dict[str, str]:
    """A mirror folder holding one snapshot, ``owner/name``, with a conda environment file and a
    requirements file that includes another (``-r``), at one commit."""
    repo = tmp_path / "mirror" / "owner+name"
    (repo / "ci").mkdir(parents=True)
    sh("git", "init", "-q", "-b", "main", cwd=repo)
    (repo / "ci" / "environment.yml").write_text(f"name: upstream\ndependencies:\n  - numpy  # {tmp_path.name}\n")
    (repo / "requirements.txt").write_text("-r requirements-test.txt\n-e .\nattrs==23.1\n")
    (repo / "requirements-test.txt").write_text(f"pytest==7.4  # {tmp_path.name}\n")
    sh("git", "add", "-A", cwd=repo)
    sh("git", "commit", "-q", "-m", "env", cwd=repo)
    return {"root": str(tmp_path / "mirror"), "commit": sh("git", "rev-parse", "HEAD", cwd=repo)}


def test_raw_reads_are_served_by_git_show(mirror):
    reads = SnapshotReads(Path(mirror["root"]))
    got = reads.get(f"{RAW}/owner/name/{mirror['commit']}/ci/environment.yml", headers={"User-Agent": "x"})
    assert got.status_code == 200 and got.text.startswith("name: upstream\n")
    absent = reads.get(f"{RAW}/owner/name/{mirror['commit']}/environment.yml")
    assert absent.status_code == 404  # as GitHub answers: the harness then tries its next candidate path
    assert reads.served == [f"owner/name@{mirror['commit']}:ci/environment.yml"]
    assert reads.missing == [f"owner/name@{mirror['commit']}:environment.yml"]


def test_swebenchs_own_readers_get_the_snapshots_files(mirror, monkeypatch):
    import swebench.harness.test_spec.python as tsp

    monkeypatch.setattr(tsp, "requests", SnapshotReads(Path(mirror["root"])))
    monkeypatch.setitem(tsp.MAP_REPO_TO_ENV_YML_PATHS, "owner/name", ["environment.yml", "ci/environment.yml"])
    monkeypatch.setitem(tsp.MAP_REPO_TO_REQS_PATHS, "owner/name", ["requirements.txt"])
    yml = tsp.get_environment_yml_by_commit.__wrapped__("owner/name", mirror["commit"], "testbed")
    assert yml.startswith("name: testbed\ndependencies:")  # the second candidate path, renamed by swebench
    reqs = tsp.get_requirements_by_commit.__wrapped__("owner/name", mirror["commit"])
    assert reqs.split("\n")[:1] == [f"pytest==7.4  # {Path(mirror['root']).parent.name}"]  # the -r file, read too
    assert "attrs==23.1" in reqs and "-e ." not in reqs


def test_a_missing_snapshot_or_commit_says_what_to_fetch(mirror, tmp_path):
    reads = SnapshotReads(Path(mirror["root"]))
    with pytest.raises(HarnessInputError, match=r"there is none at .*other\+repo: fetch github:other/repo"):
        reads.get(f"{RAW}/other/repo/{mirror['commit']}/environment.yml")
    with pytest.raises(HarnessInputError, match="lacks commit 0{40} .*fetch github:owner/name again"):
        reads.get(f"{RAW}/owner/name/{'0' * 40}/environment.yml")
    with pytest.raises(HarnessInputError, match="only raw.githubusercontent.com"):
        reads.get("https://pypi.org/simple/numpy/")


def test_the_wrapper_replaces_the_read_and_names_the_paths_it_missed(mirror, tmp_path, monkeypatch):
    # the wrapper as the subprocess runs it, on a stand-in for run_evaluation that builds what a
    # TestSpec of the repository reads: once where the file is, once where no candidate path holds it
    import swebench.harness.test_spec.python as tsp

    monkeypatch.setattr(tsp, "requests", tsp.requests)  # restored after the test
    monkeypatch.setattr(sys, "argv", sys.argv)
    monkeypatch.setitem(tsp.MAP_REPO_TO_ENV_YML_PATHS, "owner/name", ["ci/environment.yml"])
    monkeypatch.setitem(tsp.MAP_REPO_TO_REQS_PATHS, "owner/name", ["requirements/dev.txt", "reqs.txt"])
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "fake_run_evaluation.py").write_text(
        "import sys\n"
        "import swebench.harness.test_spec.python as tsp\n"
        "out, what = sys.argv[1], sys.argv[2]\n"
        "reader = tsp.get_environment_yml_by_commit if what == 'yml' else tsp.get_requirements_by_commit\n"
        "args = ('owner/name', sys.argv[3], 'testbed') if what == 'yml' else ('owner/name', sys.argv[3])\n"
        "open(out, 'w').write(reader.__wrapped__(*args))\n")
    harness_main([str(tmp_path / "yml.txt"), "yml", mirror["commit"]], Path(mirror["root"]), "fake_run_evaluation")
    assert (tmp_path / "yml.txt").read_text().startswith("name: testbed\n")
    with pytest.raises(HarnessInputError, match=r"Could not find requirements.txt.*not in the snapshot under .*: "
                                                r"owner/name@\w+:requirements/dev.txt, owner/name@\w+:reqs.txt"):
        harness_main([str(tmp_path / "r.txt"), "reqs", mirror["commit"]], Path(mirror["root"]), "fake_run_evaluation")


# -- the image names, added and removed ---------------------------------------------------------------


class FakeImage:
    def __init__(self, images: FakeImages, image_id: str):
        self.images, self.id = images, image_id

    def tag(self, repository: str, tag: str) -> bool:
        self.images.names[f"{repository}:{tag}"] = self.id
        self.images.calls.append(("tag", f"{repository}:{tag}"))
        return True


class FakeImages:
    """A scripted ``client.images``: names -> image ids; ``calls`` records tag and remove."""

    def __init__(self, names: dict[str, str]):
        self.names = dict(names)
        self.calls: list[tuple[str, str]] = []

    def get(self, name: str) -> FakeImage:
        if name not in self.names:
            raise docker.errors.ImageNotFound(name)
        return FakeImage(self, self.names[name])

    def remove(self, name: str, noprune: bool = False) -> None:
        assert noprune  # an untag: never the image
        self.calls.append(("remove", name))
        del self.names[name]


class FakeClient:
    def __init__(self, names: dict[str, str]):
        self.images = FakeImages(names)


A, B = "pydata__xarray-6599", "psf__requests-5414"


def test_tags_added_for_the_run_are_removed_after_it_and_no_other():
    theirs = harness_image_name(B)
    assert theirs == "swebench/sweb.eval.x86_64.psf_1776_requests-5414:latest" or "arm64" in theirs
    client = FakeClient({"ours/a:1": "sha:a", "ours/b:1": "sha:b", theirs: "sha:b"})  # B's name exists already
    with HarnessTags(client, {A: "ours/a:1", B: "ours/b:1"}) as tags:
        assert tags.added == [harness_image_name(A)]
        assert client.images.names[harness_image_name(A)] == "sha:a"
    assert client.images.calls == [("tag", harness_image_name(A)), ("remove", harness_image_name(A))]
    assert client.images.names == {"ours/a:1": "sha:a", "ours/b:1": "sha:b", theirs: "sha:b"}


def test_tags_are_removed_when_the_run_fails_and_a_repointed_tag_is_left():
    client = FakeClient({"ours/a:1": "sha:a", "ours/b:1": "sha:b"})
    with pytest.raises(RuntimeError, match="the harness failed"):
        with HarnessTags(client, {A: "ours/a:1", B: "ours/b:1"}):
            client.images.names[harness_image_name(B)] = "sha:other"  # someone re-tagged it meanwhile
            raise RuntimeError("the harness failed")
    assert client.images.names == {"ours/a:1": "sha:a", "ours/b:1": "sha:b", harness_image_name(B): "sha:other"}


def test_a_missing_image_or_a_name_taken_by_another_image_is_refused_and_undone():
    client = FakeClient({"ours/a:1": "sha:a"})
    with pytest.raises(HarnessInputError, match="ours/b:1, is not present locally"):
        with HarnessTags(client, {A: "ours/a:1", B: "ours/b:1"}):
            pass
    assert client.images.names == {"ours/a:1": "sha:a"}  # A's tag, added first, was taken back
    client = FakeClient({"ours/a:1": "sha:a", harness_image_name(A): "sha:theirs"})
    with pytest.raises(HarnessInputError, match="is present and is not ours/a:1"):
        with HarnessTags(client, {A: "ours/a:1"}):
            pass
    assert client.images.names == {"ours/a:1": "sha:a", harness_image_name(A): "sha:theirs"}


# -- the parity on a genuine instance -----------------------------------------------------------------


@pytest.mark.docker
@pytest.mark.long
@pytest.mark.slow
@pytest.mark.part("swebench", "sao-eval", "docker")
def test_the_official_harness_and_ours_agree_on_a_genuine_instance(client, tmp_path):  # noqa: F811
    out = out_dir() / "one"
    _build(client, out, only=[ONE])
    name = harness_image_name(ONE)
    before = {t for i in client.images.list() for t in i.tags if t.startswith("swebench/")}
    proc = subprocess.run([sys.executable, "benchmarks/swe_parity.py", "--instances", ONE, "--rows",
                           str(out / "instances.jsonl"), "--image-map", str(out / "images.json"), "--json",
                           str(tmp_path / "parity.json")], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    result = json.loads((tmp_path / "parity.json").read_text())
    assert [(r["prediction"], r["harness"], r["ours"], r["agree"]) for r in result["table"]] == [
        ("gold", "resolved", "resolved", True), ("empty", "empty", "empty", True),
        ("test-only", "unresolved", "unresolved", True)]
    assert result["gold_preds_accepted"] and result["keys"]["missing_from_ours"] == []
    assert set(result["keys"]["harness"]) >= {"resolved_ids", "error_ids", "schema_version"}
    assert result["tags_added"] == ([] if name in before else [name])
    after = {t for i in client.images.list() for t in i.tags if t.startswith("swebench/")}
    assert after == before, f"tags left behind: {after - before}"
    assert not [c.name for c in client.containers.list(all=True) if c.name.startswith(f"sweb.eval.{ONE}.")]
