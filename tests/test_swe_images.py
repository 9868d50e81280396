"""Instance images at scale (sao.envs.swebench.pulls, image_prep; sao.evals.swe_images): pull retries,
platforms, preparing every image before a run, the record of what a run pulled, --clean-images, and
the disk figures. A scripted Docker client for the decisions; the real daemon for the contract of
``--prepare`` on missing images (no registry is reachable here, so the pulls fail for real) and for
one cleanup that really removes a throwaway tag."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import docker.errors
import pytest

from sao.envs.swebench import SWEBenchEnv, instances_from_rows
from sao.envs.swebench import env as swe_env_module
from sao.envs.swebench.image_prep import (
    ImagePreparation,
    clean_images,
    prepare_images,
    protected_images,
    to_remove,
)
from sao.envs.swebench.images import ImageResolver, InstanceImageError, ResolvedImage, instance_platform
from sao.envs.swebench.pulls import definitive, pull_image
from sao.evals.swe_images import IMAGES, ImagesMissing, RunImages
from sao.sandboxes import SandboxStartError
from tests.conftest import shared_file

SAO_EVAL = str(Path(sys.executable).with_name("sao-eval"))
SAO_SANDBOX = str(Path(sys.executable).with_name("sao-sandbox"))


# -- a scripted Docker client -----------------------------------------------------------------------


class ScriptedClient:
    """``images.get`` finds the names in ``present``; ``api.pull`` plays the next script of ``pulls`` (a
    list of events; ``"stall"`` blocks for ``stall_s``; ``"done"`` makes the image present); ``df`` says
    ``LayersSize``; ``images.remove`` removes from ``present`` (``refuse``: name -> error to raise)."""

    def __init__(self, present=(), pulls=(), stall_s=5.0, layers=1000, refuse=None):
        self.present, self.pulls, self.stall_s, self.layers = set(present), list(pulls), stall_s, layers
        self.refuse = dict(refuse or {})
        self.pull_calls: list[dict[str, Any]] = []
        self.removed: list[str] = []
        self.api = SimpleNamespace(pull=self._pull)
        self.images = SimpleNamespace(get=self._get, remove=self._remove)

    def _get(self, name):
        if name not in self.present:
            raise docker.errors.ImageNotFound(f"No such image: {name}")
        return SimpleNamespace(id=name)

    def _pull(self, repository, tag=None, stream=False, decode=False, platform=None):
        self.pull_calls.append({"name": f"{repository}:{tag}", "platform": platform})
        script = self.pulls.pop(0) if self.pulls else [{"error": "manifest unknown"}]
        for event in script:
            if event == "stall":
                time.sleep(self.stall_s)
            elif event == "done":
                self.present.add(f"{repository}:{tag}")
            else:
                yield event

    def _remove(self, name):
        if name in self.refuse:
            raise self.refuse[name]
        if name not in self.present:
            raise docker.errors.ImageNotFound(f"No such image: {name}")
        self.present.discard(name)
        self.removed.append(name)

    def df(self):
        return {"LayersSize": self.layers}


def row(instance_id="psf__requests-1142", **over):
    base = {"instance_id": instance_id, "repo": "psf/requests", "base_commit": "a" * 40, "problem_statement": "p",
            "patch": "diff", "test_patch": "diff", "FAIL_TO_PASS": '["t"]', "PASS_TO_PASS": "[]", "version": "2.0",
            "environment_setup_commit": "a" * 40, "test_cmd": "pytest -rA", "log_parser": "parse_log_pytest"}
    return {**base, **over}


def instance(instance_id="psf__requests-1142", **over):
    return instances_from_rows([row(instance_id, **over)], source="test")[0]


PROGRESS = {"status": "Downloading", "progressDetail": {"current": 1, "total": 2}}


# -- pull retries --------------------------------------------------------------------------------------


def test_a_stalled_pull_is_tried_again_and_the_second_try_succeeds():
    client = ScriptedClient(pulls=[[PROGRESS, "stall"], [PROGRESS, "done"]], stall_s=3.0)
    started = time.monotonic()
    result = pull_image(client, "org/img:v1", timeout_s=0.3, pause_s=0.0)
    # the first try is given up 0.3 s after its last event, not after the 3 s stall
    assert result.ok and result.tries == 2 and time.monotonic() - started < 2.0
    assert [c["name"] for c in client.pull_calls] == ["org/img:v1", "org/img:v1"]


def test_a_pull_that_stalls_every_time_fails_after_the_retries_with_each_reason():
    client = ScriptedClient(pulls=[["stall"], ["stall"], ["stall"]], stall_s=2.0)
    result = pull_image(client, "org/img:v1", timeout_s=0.2, retries=2, pause_s=0.0)
    assert not result.ok and result.tries == 3 and not result.definitive
    assert result.reason == "; then ".join(["no progress for 0.2 s"] * 3)
    assert len(client.pull_calls) == 3
    assert not pull_image(ScriptedClient(pulls=[["stall"]], stall_s=1.0), "o/i:v", timeout_s=0.2, retries=0,
                          pause_s=0.0).tries > 1  # retries=0: one try


@pytest.mark.parametrize("error", ["manifest for swebench/x:latest not found: manifest unknown: manifest unknown",
                                   "pull access denied for x, repository does not exist or may require 'docker login'",
                                   "unauthorized: authentication required"])
def test_a_definitive_registry_answer_is_not_retried(error):
    client = ScriptedClient(pulls=[[{"error": error}], [PROGRESS, "done"]])
    result = pull_image(client, "org/img:v1", timeout_s=5, pause_s=0.0)
    assert not result.ok and result.definitive and result.tries == 1 and len(client.pull_calls) == 1


def test_a_transient_error_is_retried():
    dns = 'Get "https://registry-1.docker.io/v2/": dial tcp: lookup registry-1.docker.io: no such host'
    assert not definitive(dns)
    client = ScriptedClient(pulls=[[{"error": dns}], [PROGRESS, "done"]])
    assert pull_image(client, "org/img:v1", timeout_s=5, pause_s=0.0).tries == 2


def test_the_resolver_retries_a_stalled_pull_and_reports_a_definitive_one():
    inst = instance()
    stalled = ScriptedClient(pulls=[["stall"], [PROGRESS, "done"]], stall_s=2.0)
    got = ImageResolver(stalled, pull_timeout_s=0.2).resolve(inst)
    assert got.pulled and got.source == "swebench-name" and len(stalled.pull_calls) == 2
    refused = ScriptedClient()  # every pull: manifest unknown
    with pytest.raises(InstanceImageError) as err:
        ImageResolver(refused, pull_timeout_s=5).resolve(inst)
    assert len(refused.pull_calls) == 1  # one try per name, none again
    assert "not retried, the registry's answer is final" in str(err.value)


# -- platforms --------------------------------------------------------------------------------------


def use_x86_instance() -> str:
    from swebench.harness.constants import USE_X86

    return sorted(USE_X86)[0]


def test_on_arm64_use_x86_instances_are_pulled_and_run_as_amd64(monkeypatch):
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    x86 = use_x86_instance()
    assert instance_platform(x86) == ("x86_64", "linux/amd64")
    assert instance_platform("psf__requests-1142") == ("arm64", None)  # not listed: the host's own
    assert instance_platform("psf__requests-1142", "linux/amd64") == ("x86_64", "linux/amd64")  # --platform decides
    client = ScriptedClient(pulls=[[PROGRESS, "done"], [PROGRESS, "done"]])
    resolver = ImageResolver(client)
    got = resolver.resolve(instance(x86, repo=x86.rsplit("-", 1)[0].replace("__", "/")))
    assert got.platform == "linux/amd64" and ".x86_64." in got.name
    assert client.pull_calls[-1] == {"name": got.name, "platform": "linux/amd64"}
    other = resolver.resolve(instance())
    assert other.platform is None and ".arm64." in other.name and client.pull_calls[-1]["platform"] is None


def test_on_x86_64_nothing_asks_for_a_platform(monkeypatch):
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    assert instance_platform(use_x86_instance()) == ("x86_64", None)


def test_the_platform_reaches_the_agents_container(monkeypatch):
    monkeypatch.setattr(platform, "machine", lambda: "arm64")
    seen: dict[str, Any] = {}

    def sandbox(image, **kwargs):
        seen.update(kwargs, image=image)
        raise SandboxStartError("recorded")

    monkeypatch.setattr(swe_env_module, "DockerSandbox", sandbox)
    client = ScriptedClient(pulls=[[PROGRESS, "done"]])
    env = SWEBenchEnv([instance()], docker_client=client, platform="linux/amd64")
    with pytest.raises(SandboxStartError):
        env.reset(options={"task_id": "psf__requests-1142"})
    assert seen["platform"] == "linux/amd64" and ".x86_64." in seen["image"]


def test_a_bad_platform_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match=r"'linux/amd46' is not one of \['linux/amd64', 'linux/arm64'\]. "
                                         r"Did you mean 'linux/amd64'\?"):
        SWEBenchEnv([instance()], docker_client=ScriptedClient(), platform="linux/amd46")
    with pytest.raises(ValueError, match="pull_retries must be >= 0"):
        SWEBenchEnv([instance()], docker_client=ScriptedClient(), pull_retries=-1)


# -- preparing every image ----------------------------------------------------------------------------


def test_prepare_lists_every_missing_instance_with_its_attempts_and_keeps_the_others():
    insts = [instance(f"psf__requests-{n}") for n in (1, 2, 3, 4)]
    in_flight, peak, lock = [0], [0], threading.Lock()

    def resolve(inst):
        with lock:
            in_flight[0] += 1
            peak[0] = max(peak[0], in_flight[0])
        time.sleep(0.05)
        with lock:
            in_flight[0] -= 1
        if inst.instance_id.endswith(("-2", "-4")):
            raise InstanceImageError("no image", ("row-image: none", f"pull {inst.instance_id} failed"))
        return ResolvedImage(f"img-{inst.instance_id}", "swebench-name", pulled=True)

    prep = prepare_images(resolve, insts, workers=2)
    assert list(prep.ready) == ["psf__requests-1", "psf__requests-3"]
    assert prep.missing == {"psf__requests-2": ("row-image: none", "pull psf__requests-2 failed"),
                            "psf__requests-4": ("row-image: none", "pull psf__requests-4 failed")}
    assert peak[0] == 2  # a few at a time
    assert "MISSING  psf__requests-2:\n    row-image: none\n    pull psf__requests-2 failed" in prep.describe()
    assert prep.owned() == {"img-psf__requests-1": "psf__requests-1", "img-psf__requests-3": "psf__requests-3"}


# -- what a run owns, and cleaning it ------------------------------------------------------------------


def test_cleaning_removes_only_what_the_run_pulled_and_never_a_mapped_image():
    names, kept = to_remove(["a:1", "b:1", "mapped:1", "a:1"], protected_images({"x": "mapped:1"}))
    assert names == ["a:1", "b:1"] and kept == {"mapped:1": "named in the image map"}
    # a map entry without a tag protects the name Docker gives it (":latest") too
    assert to_remove(["m:latest"], protected_images({"x": "m"})) == ([], {"m:latest": "named in the image map"})
    busy = docker.errors.APIError("conflict: image is being used by running container")
    client = ScriptedClient(present={"a:1", "mapped:1", "genuine:1", "busy:1"}, refuse={"busy:1": busy})
    report = clean_images(client, ["a:1", "b:1", "mapped:1", "busy:1"], protected_images({"x": "mapped:1"}))
    assert report.removed == ["a:1"] and report.gone == ["b:1"] and list(report.failed) == ["busy:1"]
    assert client.present == {"mapped:1", "genuine:1", "busy:1"}  # the genuine image was never named


class FakeKeeper:
    """An InstanceImages whose preparation is scripted and whose cleanup goes to a scripted client."""

    def __init__(self, prep: ImagePreparation, client: ScriptedClient, image_map=None):
        self.prep, self.client, self.image_map = prep, client, image_map or {}

    def prepare(self, task_ids):
        return self.prep

    def disk_bytes(self):
        return self.client.layers

    def clean(self, owned_images):
        return clean_images(self.client, owned_images, protected_images(self.image_map))


def test_the_record_of_pulled_images_survives_a_resume_and_drives_the_cleanup(tmp_path):
    client = ScriptedClient(present={"pulled:1", "built:1", "ep:1", "was-there:1", "mapped:1"}, layers=500)
    prep = ImagePreparation(ready={"i1": ResolvedImage("pulled:1", "swebench-name", pulled=True),
                                   "i2": ResolvedImage("built:1", "swebench-build"),
                                   "i3": ResolvedImage("was-there:1", "swebench-name")})
    RunImages(tmp_path, FakeKeeper(prep, client)).prepare(["i1", "i2", "i3"])
    assert set(json.loads((tmp_path / IMAGES).read_text())["owned"]) == {"pulled:1", "built:1"}
    # a later invocation (--resume): the file is read back; an episode that pulled its image is added, one
    # whose image was there is not, and the mapped image is recorded but kept
    episodes = [SimpleNamespace(task_id="i4", info={"image": "ep:1", "image_source": "row-image", "image_pulled": True}),
                SimpleNamespace(task_id="i3", info={"image": "was-there:1", "image_source": "swebench-name",
                                                    "image_pulled": False}),
                SimpleNamespace(task_id="i5", info={"image": "mapped:1", "image_source": "images-arg",
                                                    "image_pulled": True}),
                SimpleNamespace(task_id="i6", info={"error": "no image"})]
    client.layers = 900
    resumed = RunImages(tmp_path, FakeKeeper(prep, client, image_map={"i5": "mapped:1"}))
    client.layers = 200
    figures = resumed.finish(episodes, clean=True)
    assert sorted(client.removed) == ["built:1", "ep:1", "pulled:1"]
    assert client.present == {"was-there:1", "mapped:1"}
    assert figures["images_disk_start_bytes"] == 900 and figures["images_disk_end_bytes"] == 200
    assert figures["images_cleaned"]["kept"] == {"mapped:1": "named in the image map"}
    # without --clean-images nothing is removed, and the figures are there all the same
    assert set(RunImages(tmp_path, FakeKeeper(prep, client)).finish([], clean=False)) == \
        {"images_disk_start_bytes", "images_disk_end_bytes", "images_disk_measure"}


def test_prepare_with_a_missing_image_raises_the_listing_and_records_what_it_pulled(tmp_path):
    prep = ImagePreparation(ready={"i1": ResolvedImage("pulled:1", "swebench-name", pulled=True)},
                            missing={"i2": ("pull x failed (no progress for 30 s)",)})
    with pytest.raises(ImagesMissing, match=r"(?s)1 of 2 instance images are missing; nothing was started:\n"
                                            r"MISSING  i2:\n    pull x failed.*--image-map.*--build-images"):
        RunImages(tmp_path, FakeKeeper(prep, ScriptedClient())).prepare(["i1", "i2"])
    assert list(json.loads((tmp_path / IMAGES).read_text())["owned"]) == ["pulled:1"]


def test_prepare_and_clean_images_are_refused_for_other_benchmarks(tmp_path):
    from sao.evals.runner import EvalConfig, EvalError

    with pytest.raises(EvalError, match="--prepare: for the SWE benchmarks only"):
        EvalConfig("arithmetic", tmp_path, agent="gold", prepare=True)
    with pytest.raises(EvalError, match="--clean-images: for the SWE benchmarks only"):
        EvalConfig("arithmetic", tmp_path, agent="gold", clean_images=True)


# -- the real daemon ----------------------------------------------------------------------------------


def genuine_rows(tmp_path: Path, n: int = 3) -> tuple[Path, list[str]]:
    """``n`` SWE-bench Verified rows from the local partial copy (real ids, repositories, commits, problem
    statements), of different repositories, completed with the harness fields the copy lacks."""
    from swebench.harness.constants import MAP_REPO_VERSION_TO_SPECS

    rows, repos = [], set()
    for r in map(json.loads, shared_file("swebench_partial/swebench_verified.jsonl").read_text().splitlines()):
        if r["repo"] not in repos and len(rows) < n:
            repos.add(r["repo"])
            rows.append({**r, "version": sorted(MAP_REPO_VERSION_TO_SPECS[r["repo"]])[-1], "test_patch": r["patch"],
                         "FAIL_TO_PASS": '["t"]', "PASS_TO_PASS": "[]", "environment_setup_commit": r["base_commit"]})
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path, [r["instance_id"] for r in rows]


@pytest.mark.docker
@pytest.mark.part("sao-eval", "docker")
def test_prepare_on_missing_images_exits_2_listing_each_before_any_engine_starts(docker_client, tmp_path):
    from sao.envs.swebench import swebench_image_names

    rows, ids = genuine_rows(tmp_path)
    for iid in ids:
        for name in swebench_image_names(iid):
            with pytest.raises(docker.errors.ImageNotFound):  # the contract is about images that are absent
                docker_client.images.get(name)
    out = tmp_path / "out"
    started = time.monotonic()
    # the model plays (a local vLLM would start for it): --prepare must stop the run before that
    proc = subprocess.run([SAO_EVAL, "swe-bench-verified", "--data", str(rows), "--prepare", "--pull-timeout", "10",
                           "--output", str(out)], capture_output=True, text=True, timeout=120)
    elapsed = time.monotonic() - started
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert elapsed < 60, elapsed
    print(f"--prepare on {len(ids)} missing images: exit 2 in {elapsed:.1f} s")
    assert "3 of 3 instance images are missing; nothing was started" in proc.stderr
    for iid in ids:
        assert f"MISSING  {iid}:" in proc.stderr and f"pull swebench/{swebench_image_names(iid)[1].split('/')[1]}" \
            in proc.stderr
    assert "--image-map" in proc.stderr and "--build-images" in proc.stderr
    assert not (out / "vllm.log").exists() and not (out / "trajectories.jsonl").exists()
    # sao-sandbox images runs the same code
    proc = subprocess.run([SAO_SANDBOX, "images", str(rows), "--pull-timeout", "10"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and all(f"MISSING  {iid}:" in proc.stdout for iid in ids), proc.stderr[-2000:]


class TaggingClient:
    """The real daemon, whose ``api.pull`` stands in for a registry: it tags ``sources[name]`` as ``name``
    (what a pull leaves behind), with one progress event."""

    def __init__(self, client, sources: dict[str, str]):
        self._client, self.sources = client, sources
        self.api = SimpleNamespace(pull=self._pull)

    def __getattr__(self, name):
        return getattr(self._client, name)

    def _pull(self, repository, tag=None, stream=False, decode=False, platform=None):
        name = f"{repository}:{tag}"
        if name not in self.sources:
            yield {"error": f"manifest for {name} not found: manifest unknown"}
            return
        yield PROGRESS
        self._client.images.get(self.sources[name]).tag(repository, tag)


@pytest.mark.docker
def test_clean_images_removes_the_image_the_run_pulled_and_keeps_the_mapped_one(docker_client, tmp_path):
    from sao.envs.swebench.image_prep import EnvImages
    from sao.sandboxes.base_image import BASE_IMAGE

    base = docker_client.images.get(BASE_IMAGE)  # the throwaway tags are new names of the base image
    run = uuid.uuid4().hex[:10]
    pulled, mapped = f"sao-test-pulled/a:{run}", f"sao-test-mapped/b:{run}"
    client = TaggingClient(docker_client, {pulled: BASE_IMAGE, mapped: BASE_IMAGE})
    insts = [instance("psf__requests-1", image=pulled), instance("psf__requests-2")]
    try:
        env = SWEBenchEnv(insts, docker_client=client, images={"psf__requests-2": mapped})
        images = RunImages(tmp_path, EnvImages(env))
        prep = images.prepare(["psf__requests-1", "psf__requests-2"])  # both really "pulled" (tagged)
        assert {i: (r.name, r.source, r.pulled) for i, r in prep.ready.items()} == {
            "psf__requests-1": (pulled, "row-image", True), "psf__requests-2": (mapped, "images-arg", True)}
        figures = RunImages(tmp_path, EnvImages(env)).finish([], clean=True)  # as a --resume would
        assert figures["images_cleaned"] == {"removed": [pulled], "gone": [], "kept": {mapped: "named in the image map"},
                                             "failed": {}}
        with pytest.raises(docker.errors.ImageNotFound):
            docker_client.images.get(pulled)
        assert docker_client.images.get(mapped).id == base.id == docker_client.images.get(BASE_IMAGE).id
        assert isinstance(figures["images_disk_start_bytes"], int) and figures["images_disk_end_bytes"] > 0
    finally:
        for name in (pulled, mapped):
            try:
                docker_client.images.remove(name)  # a tag of the base image: only the name goes
            except docker.errors.ImageNotFound:
                pass
    assert docker_client.images.get(BASE_IMAGE).id == base.id
