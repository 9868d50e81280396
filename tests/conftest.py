"""Shared fixtures. Tests that need the real vLLM use the session-wide ``vllm_endpoint``.

Real-part tests skip with a reason when their part is missing, unless CI makes them mandatory:
``SAO_REQUIRE_VLLM=1`` turns a missing vLLM or model into a failure.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.parts import PartsTable

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


def pytest_addoption(parser):  # type: ignore[no-untyped-def]
    from tests.tiers import add_options

    add_options(parser)


def pytest_configure(config):  # type: ignore[no-untyped-def]
    """Under xdist, this worker computes on its own share of the cores (tests/workers.py); the controller
    names the run up front, so that its summary can find the workers' timeline."""
    from tests.workers import pin_this_worker

    pin_this_worker()
    if (not os.environ.get("PYTEST_XDIST_WORKER") and config.pluginmanager.hasplugin("xdist")
            and config.getoption("numprocesses", None) and not config.getoption("testrunuid", None)):
        import uuid

        config.option.testrunuid = uuid.uuid4().hex


def pytest_sessionfinish(session):  # type: ignore[no-untyped-def]
    """A worker records its timeline; the controller (or a run without xdist) fails the run under
    ``SAO_REQUIRE_PARTS=1`` when a real part did not pass (tests/parts.py); every part must, unless the
    run is the long tier alone."""
    from tests.parts import required
    from tests.workers import record_finish

    record_finish()
    if not os.environ.get("PYTEST_XDIST_WORKER") and os.environ.get("SAO_TEST_DURATIONS"):
        # each test's setup, call and teardown, for scripts/balance-long-tier; added to what the file
        # holds (scripts/test's second call, the alone tests, adds to the first's)
        import json

        from tests.tiers import base_id

        out = Path(os.environ["SAO_TEST_DURATIONS"])
        known = json.loads(out.read_text()) if out.exists() else {}
        known.update({base_id(k): round(v, 2) for k, v in _DURATIONS.items()})
        out.write_text(json.dumps(dict(sorted(known.items())), indent=0))
    if not os.environ.get("PYTEST_XDIST_WORKER") and required() and session.config.getoption("alone") != "only":
        problems = _PARTS.missing(every_part=session.config.getoption("tier") != "long")
        if problems:
            session.config.stash[_PARTS_FAILED] = problems
            if session.exitstatus == 0:
                session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_runtest_logreport(report):  # type: ignore[no-untyped-def]
    _PARTS.add(report)
    _DURATIONS[report.nodeid] = _DURATIONS.get(report.nodeid, 0.0) + report.duration
    if report.when == "call" and "long" in report.keywords:
        _LONG_RAN.append(report.nodeid)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups (its --dist loadgroup)
def pytest_collection_modifyitems(config, items):  # type: ignore[no-untyped-def]
    from tests.parts import mark_items
    from tests.tiers import select
    from tests.workers import assign_groups

    select(config, items)  # the tier (tests/tiers.py)
    assign_groups(items)
    mark_items(items)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)  # outside pytest-timeout's clock: waiting is not running
def pytest_runtest_protocol(item, nextitem):  # type: ignore[no-untyped-def]
    """A test that starts engines or trains the real model runs alone among such tests (tests/workers.py)."""
    from tests.workers import count_test, machine_lock, needs_the_machine

    count_test()
    if needs_the_machine(item):
        with machine_lock():
            yield
    else:
        yield


@pytest.hookimpl(trylast=True)  # after xdist has put the groups into the node ids
def pytest_collection_finish(session):  # type: ignore[no-untyped-def]
    from tests.workers import check_grouped, keep_alone_tests_alone

    check_grouped(session.config, session.items)
    keep_alone_tests_alone(session.items)  # the items left after -k and -m


@pytest.fixture(autouse=True)
def _give_memory_back(request):  # type: ignore[no-untyped-def]
    """After a test that trains or serves the real model, free what it left and hand the freed heap
    back to the OS: glibc keeps it otherwise, and this process's RSS adds up over the real-model
    tests until a later one that starts its own engines runs out of the machine's 24 GiB."""
    import time

    started = time.monotonic()
    yield
    heavy = request.node.get_closest_marker("vllm") or request.node.get_closest_marker("slow")
    if heavy or time.monotonic() - started > 2.0:  # quick tests allocate little; skip the collection
        import ctypes
        import gc

        gc.collect()
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):  # not glibc
            pass


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op thread for a module of tiny-model tests: on a shared machine with few cores, OpenMP
    worker threads waiting on each other made single steps up to 30x slower."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def shared_file(name: str) -> Path:
    path = SHARED_DATA / name
    if not path.exists():
        pytest.skip(f"{path} is not present (benchmark copies live in ../shared/data)")
    return path


def _require(what: str, why: str) -> None:
    """Skip, or fail when CI made the real part mandatory."""
    if os.environ.get("SAO_REQUIRE_VLLM") == "1":
        pytest.fail(f"{what} is required here (SAO_REQUIRE_VLLM=1) but {why}")
    pytest.skip(f"{what}: {why}")


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The prepared SmolLM2-135M-Instruct checkpoint (`sao-model prepare smollm2-135m`)."""
    from sao.agents.models.prepare import resolve_model

    try:
        return Path(resolve_model("smollm2-135m"))
    except Exception as exc:  # noqa: BLE001
        _require("the bundled model", f"it is not prepared ({exc}); run `sao-model prepare smollm2-135m`")


ENGINE_DTYPE = "float32"  # what sao-train's engines serve by default (conf/model/smollm2.yaml)


@pytest.fixture(scope="session")
def engine_model_dir(smollm2_dir, tmp_path_factory) -> Path:
    """The bundled model exported as sao-train's engines serve it: untied head, the default engine dtype
    (sao.rl.weights.sync.export_engine_model). Tests reload it to put the shared engine back."""
    import torch
    from transformers import AutoModelForCausalLM

    from sao.rl.weights.sync import export_engine_model

    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    return export_engine_model(model, Path(smollm2_dir), tmp_path_factory.mktemp("engine") / "model",
                               dtype=getattr(torch, ENGINE_DTYPE))


@pytest.fixture(scope="session")
def vllm_server(engine_model_dir, tmp_path_factory):
    """One real vLLM server with the bundled model for the whole session (start-up is 60-90 s on 2 cores),
    served as sao-train serves it (untied head, the default engine dtype), and on the token route too."""
    try:
        import vllm  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        _require("vLLM", f"it does not import ({exc})")
    import psutil

    from sao.agents.engine.server import VLLMServer, VLLMServerConfig

    log = tmp_path_factory.mktemp("vllm") / "server.log"
    config = VLLMServerConfig(model=str(engine_model_dir), served_model_name="smollm2-135m", max_model_len=2048,
                              kv_cache_gib=1, log_path=log, dtype=ENGINE_DTYPE, token_route=True)
    with VLLMServer(config) as server:
        root = psutil.Process(server.pid)
        tree = [root, *root.children(recursive=True)]
        yield server

    def running(p: psutil.Process) -> bool:
        try:
            return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    alive = [p.pid for p in tree if running(p)]
    assert not alive, f"vLLM processes survived stop(): {alive}"


@pytest.fixture(scope="session")
def docker_client():
    """A client of the real Docker daemon; skips without one, unless ``SAO_REQUIRE_DOCKER=1`` (CI) fails."""
    try:
        import docker

        client = docker.from_env()
        client.ping()
    except Exception as exc:  # noqa: BLE001
        if os.environ.get("SAO_REQUIRE_DOCKER") == "1":
            pytest.fail(f"a Docker daemon is required here (SAO_REQUIRE_DOCKER=1) but none answers: {exc}")
        pytest.skip(f"no Docker daemon answers ({exc}); start one with `bash scripts/setup-docker` "
                    "or set SAO_REQUIRE_DOCKER=1 to make this a failure")
    yield client
    client.close()


def engine_call(server, fn):  # type: ignore[no-untyped-def]
    """Run ``await fn(EngineClient)`` against ``server`` from synchronous test code."""
    import asyncio

    from sao.agents.engine.control import EngineClient

    async def go():  # type: ignore[no-untyped-def]
        async with EngineClient(server.root_url) as client:
            return await fn(client)

    return asyncio.run(go())


def engine_probe(server) -> list[float]:  # type: ignore[no-untyped-def]
    """The engine's log-probs on WeightSync's fixed probe sequence."""
    from sao.rl.weights.sync import WeightSync

    async def go(client):  # type: ignore[no-untyped-def]
        return await WeightSync(client, Path("unused"), model_name=server.model_name).engine_logprobs()

    return engine_call(server, go)


@pytest.fixture
def restore_engine(vllm_server, engine_model_dir):  # type: ignore[no-untyped-def]
    """The shared server, with the prepared weights (and the version label) put back afterwards, even
    on failure, and a check that the engine's log-probs are the ones it had before."""
    label = engine_call(vllm_server, lambda c: c.weight_version())
    before = engine_probe(vllm_server)
    yield vllm_server

    async def restore(client):  # type: ignore[no-untyped-def]
        await client.pause(mode="keep")
        try:
            await client.reload_weights(Path(engine_model_dir).resolve(), timeout_s=300)
            await client.reset_prefix_cache()
            if label is not None:
                await client.set_weight_version(label)
        finally:
            await client.resume()

    engine_call(vllm_server, restore)
    after = engine_probe(vllm_server)
    assert max(abs(a - b) for a, b in zip(before, after, strict=True)) < 1e-3, "original weights not restored"


BAD_INPUT_TABLE = "test_bad_inputs.py::test_bad_input["
_PARTS = PartsTable()  # every report, for the real parts' table
_PARTS_FAILED = pytest.StashKey[list]()
_LONG_RAN: list[str] = []
_DURATIONS: dict[str, float] = {}  # node id -> seconds (SAO_TEST_DURATIONS)


def pytest_terminal_summary(terminalreporter):  # type: ignore[no-untyped-def]
    """Issue 14 (R2): the number of kinds of bad input that the table in ``test_bad_inputs.py`` ran."""
    outcomes: dict[str, str] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            nodeid = getattr(report, "nodeid", "")
            if BAD_INPUT_TABLE in nodeid and getattr(report, "when", None) in ("setup", "call"):
                kind = nodeid.split(BAD_INPUT_TABLE, 1)[1].rstrip("]")
                if getattr(report, "when", None) == "call" or kind not in outcomes:
                    outcomes[kind] = "xfailed" if hasattr(report, "wasxfail") else report.outcome
    from tests.workers import timeline

    for line in timeline(terminalreporter.config.getoption("testrunuid", None)):
        terminalreporter.write_line(line)
    from tests.tiers import summary

    for line in [*summary(terminalreporter.config, _LONG_RAN), *_PARTS.lines()]:
        terminalreporter.write_line(line)
    for problem in terminalreporter.config.stash.get(_PARTS_FAILED, []):
        terminalreporter.write_line(f"real parts: FAILED (SAO_REQUIRE_PARTS=1): {problem}", red=True)
    if outcomes:
        counts = ", ".join(f"{sum(o == name for o in outcomes.values())} {name}"
                           for name in ("passed", "failed", "xfailed", "skipped") if name in outcomes.values())
        terminalreporter.write_line(f"bad-input table: {len(outcomes)} kinds ({counts})")
