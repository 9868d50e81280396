"""The SWE-bench environment against a real Docker daemon, the local SWE tasks and swebench's grading.

Skipped with a reason when no daemon answers, unless ``SAO_REQUIRE_DOCKER=1`` (CI) makes that a
failure. The local tasks (sao.envs.swebench.local_tasks) are built on first use into the
swe-local cache folder (about 11 s on 2 cores; ``SAO_SWE_LOCAL_DIR`` moves it) and are cached
afterwards. Every container made here carries the label ``io.sao.sandbox=<this module's value>``;
the module checks at the end that none is left.
"""

from __future__ import annotations

import json
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import sao.envs as E
from sao.envs.swe_policies import empty_policy, gold_policy, play, scripted_policy, tool_call
from sao.envs.swebench import (
    HARNESS_FIELDS,
    InstanceImageError,
    SWEBenchEnv,
    eval_script,
    grade_patch,
    grade_report,
    instances_from_rows,
    load_instances,
    local_tasks,
    local_tasks_dir,
    swe_local,
    swebench_image_names,
)
from sao.sandboxes import LABEL_KEY, gc, list_labelled
from tests.conftest import shared_file

LABEL = f"pytest-swe-{uuid.uuid4().hex[:10]}"


# -- fixtures ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def client(docker_client):
    c = docker_client
    yield c
    left = containers(c)
    gc(label=LABEL, client=c)
    assert not left, f"containers left behind: {[x.name for x in left]}"


def containers(client) -> list:
    return list_labelled(client, f"{LABEL_KEY}={LABEL}")


@pytest.fixture(scope="module")
def tasks_file(client) -> Path:
    return local_tasks.build(local_tasks_dir(), label=LABEL, client=client)


@pytest.fixture(scope="module")
def rows(tasks_file) -> dict[str, dict]:
    return {r["instance_id"]: r for r in map(json.loads, tasks_file.read_text().splitlines())}


def make_env(tasks_file, **kwargs) -> SWEBenchEnv:
    kwargs.setdefault("label", LABEL)
    return swe_local(data=str(tasks_file), **kwargs)


def task(rows, name: str) -> dict:
    return rows[f"sao-local__{name}-1"]


def step_call(env, name: str, arguments: dict | str | None = None):
    """One turn with one tool call; ``arguments`` as a string is passed through raw."""
    call = tool_call(name, arguments if isinstance(arguments, dict) else None)
    if isinstance(arguments, str):
        call["function"]["arguments"] = arguments
    return env.step({"role": "assistant", "content": "", "tool_calls": [call]})


# -- loading (no Docker) ------------------------------------------------------------------------------


@pytest.mark.parametrize("name,env_name", [("swebench_verified.jsonl", "swe-bench-verified"),
                                           ("swebench_lite.jsonl", "swe-bench-lite")])
def test_partial_copy_names_file_row_and_every_missing_field(name, env_name):
    path = shared_file(f"swebench_partial/{name}")
    with pytest.raises(E.DatasetError) as err:
        E.make(env_name, data=str(path))
    message = str(err.value)
    assert str(path) in message and "row 1" in message
    for field in ("test_patch", "FAIL_TO_PASS", "PASS_TO_PASS", "version", "environment_setup_commit"):
        assert repr(field) in message
    for present in ("instance_id", "problem_statement", "base_commit"):
        assert f"missing {present!r}" not in message and f", {present!r}" not in message


def _row(**over):
    row = {f: "x" for f in HARNESS_FIELDS}
    row.update(instance_id="o__r-1", repo="someone/unknown", FAIL_TO_PASS='["t::a"]', PASS_TO_PASS="[]",
               test_cmd="pytest -rA", log_parser="parse_log_pytest")
    row.update(over)
    return {k: v for k, v in row.items() if v is not None}


def test_rows_for_repos_swebench_does_not_know_need_test_cmd_and_parser():
    inst = instances_from_rows([_row()], source="mem")[0]
    assert inst.fail_to_pass == ("t::a",) and inst.pass_to_pass == () and not inst.known_to_swebench
    with pytest.raises(E.DatasetError, match=r"row 1 .*'test_cmd', 'log_parser'"):
        instances_from_rows([_row(test_cmd=None, log_parser=None)], source="mem")
    with pytest.raises(E.DatasetError, match="Did you mean 'parse_log_pytest'"):
        instances_from_rows([_row(log_parser="parse_log_pytes")], source="mem")
    with pytest.raises(E.DatasetError, match="row 2 .*duplicate"):
        instances_from_rows([_row(), _row()], source="mem")
    with pytest.raises(E.DatasetError, match="FAIL_TO_PASS is empty"):
        instances_from_rows([_row(FAIL_TO_PASS=[])], source="mem")
    # A repository swebench knows needs neither field.
    known = instances_from_rows([_row(repo="django/django", version="3.0", test_cmd=None, log_parser=None)],
                                source="mem")[0]
    assert known.known_to_swebench


def test_known_repos_are_graded_with_swebench_script_and_parser_offline():
    test_patch = ("diff --git a/tests/queries/tests.py b/tests/queries/tests.py\n--- a/tests/queries/tests.py\n"
                  "+++ b/tests/queries/tests.py\n@@ -1,2 +1,3 @@\n a\n+b\n c\n")
    inst = instances_from_rows([_row(repo="django/django", version="3.0", test_cmd=None, log_parser=None,
                                     base_commit="abc123", test_patch=test_patch,
                                     FAIL_TO_PASS='["test_b (queries.tests.T)"]',
                                     PASS_TO_PASS='["test_a (queries.tests.T)"]')], source="mem")[0]
    script, spec, parser = eval_script(inst)  # make_test_spec would fetch requirements from GitHub
    assert "conda activate testbed" in script and "git checkout abc123 tests/queries/tests.py" in script
    assert "./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 queries.tests" in script
    assert parser.__name__ == "parse_log_django"
    log = ("+ : '>>>>> Start Test Output'\ntest_b (queries.tests.T) ... ok\ntest_a (queries.tests.T) ... ok\n"
           "+ : '>>>>> End Test Output'\n")
    assert grade_report(inst, log, spec, parser)[0] is True
    failing = log.replace("test_a (queries.tests.T) ... ok", "test_a (queries.tests.T) ... FAIL")
    resolved, report = grade_report(inst, failing, spec, parser)
    assert not resolved and report["tests_status"]["PASS_TO_PASS"]["failure"] == ["test_a (queries.tests.T)"]


def test_registry_and_swebench_image_names():
    ids = {e.name: e.gym_id for e in E.entries().values()}
    assert ids["swe-bench-verified"] == "sao/SWEBench-Verified-v0"
    assert ids["swe-bench-lite"] == "sao/SWEBench-Lite-v0"
    assert ids["swe-bench"] == "sao/SWEBench-Full-v0"
    assert ids["swe-local"] == "sao/SWELocal-v0"
    local, remote = swebench_image_names("django__django-11099", "x86_64")
    assert local == "sweb.eval.x86_64.django__django-11099:latest"
    assert remote == "swebench/sweb.eval.x86_64.django_1776_django-11099:latest"


# -- grading through the environment ---------------------------------------------------------------


@pytest.mark.docker
def test_gold_patches_resolve_every_task(tasks_file, rows, client):
    assert len(rows) >= 5

    def run(instance_id):
        env = make_env(tasks_file)
        try:
            return play(env, gold_policy(rows[instance_id]), task_id=instance_id)
        finally:
            env.close()

    # Each episode has its own env, Docker client and containers, so they can run side by side.
    with ThreadPoolExecutor(max_workers=3) as pool:
        infos = dict(zip(rows, pool.map(run, rows), strict=True))
    for instance_id, info in infos.items():
        assert info["correct"] is True, (instance_id, info["report"], info["grading_log"][-1500:])
        assert info["reward"] == 1.0 and info["terminated"] and not info["truncated"]
        assert info["error"] is None and info["exit_status"] == "submitted"
        assert info["image_source"] == "row-image"
        assert info["report"]["status"] == "resolved" and info["report"]["resolution_status"] == "RESOLVED_FULL"
        assert info["answer"] == info["patch"] and "diff --git" in info["patch"]
        assert info["patch"] == rows[instance_id]["patch"]  # the diff taken back is exactly the gold patch
    assert not containers(client)


@pytest.mark.docker
def test_empty_patch_is_unresolved_without_error(tasks_file, rows):
    with make_env(tasks_file) as env:
        info = play(env, empty_policy(), task_id=task(rows, "lrucache")["instance_id"])
    assert info["correct"] is False and info["reward"] == 0.0 and info["error"] is None
    assert info["answer"] is None and info["report"]["status"] == "empty_patch"


@pytest.mark.docker
@pytest.mark.parametrize("name", ["intervals", "semver"])  # test_patch edits a test file / creates one
def test_editing_only_the_tests_is_unresolved(tasks_file, rows, name):
    row = task(rows, name)
    fake_tests = "".join(f"def {t.split('::')[1].split('[')[0]}():\n    assert True\n\n\n"
                         for t in row["FAIL_TO_PASS"])
    test_file = row["FAIL_TO_PASS"][0].split("::")[0]
    policy = scripted_policy([("editor", {"command": "create", "path": test_file, "file_text": fake_tests}),
                              ("bash", {"command": "python3 -m pytest -q -p no:cacheprovider tests"})])
    with make_env(tasks_file) as env:
        info = play(env, policy, task_id=row["instance_id"])
    report = info["report"]
    assert test_file in info["patch"] and info["error"] is None and info["correct"] is False
    assert report["patch_successfully_applied"] and report["status"] == "unresolved"
    assert sorted(report["tests_status"]["FAIL_TO_PASS"]["failure"]) == sorted(row["FAIL_TO_PASS"])


@pytest.mark.docker
def test_breaking_a_pass_to_pass_test_is_unresolved(tasks_file, rows):
    row = task(rows, "intervals")
    raise_line = 'raise ValueError(f"interval ({start}, {end}) ends before it starts")'
    policy = scripted_policy([
        ("editor", {"command": "create", "path": "/tmp/fix.patch", "file_text": row["patch"]}),
        ("bash", {"command": "git apply /tmp/fix.patch"}),
        ("editor", {"command": "str_replace", "path": "intervals/core.py", "old_str": raise_line, "new_str": "pass"}),
    ])
    with make_env(tasks_file) as env:
        info = play(env, policy, task_id=row["instance_id"])
    tests = info["report"]["tests_status"]
    assert info["correct"] is False and info["error"] is None
    assert sorted(tests["FAIL_TO_PASS"]["success"]) == sorted(row["FAIL_TO_PASS"])
    assert tests["PASS_TO_PASS"]["failure"] == ["tests/test_intervals.py::test_reversed_interval_raises"]
    assert info["report"]["resolution_status"] == "RESOLVED_NO"


@pytest.mark.docker
def test_a_diff_that_does_not_apply_is_the_agents_failure(tasks_file, rows):
    inst = next(i for i in load_instances(tasks_file) if i.instance_id == task(rows, "csvline")["instance_id"])
    bad = b"diff --git a/csvline/parser.py b/csvline/parser.py\n--- a/csvline/parser.py\n+++ b/csvline/parser.py\n" \
          b"@@ -1,2 +1,2 @@\n-no such line\n+x\n context that is not there\n"
    result = grade_patch(inst, bad, inst.image, label=LABEL, timeout_s=120)
    assert result.error is None and not result.resolved
    assert result.report["status"] == "patch_failed" and not result.report["patch_successfully_applied"]
    assert "git apply" in result.report["apply_output"] and "patch --batch" in result.report["apply_output"]


@pytest.fixture(scope="module")
def image_without_pytest(tasks_file, rows, client) -> str:
    """The intervals task's image with pytest removed: its test command cannot run at all."""
    import io

    base = task(rows, "intervals")["image"]
    tag = f"sao-test-nopytest:{base.rsplit(':', 1)[-1]}"
    dockerfile = (f"FROM {base}\nRUN rm -rf /usr/lib/python3/dist-packages/pytest "
                  "/usr/lib/python3/dist-packages/_pytest /usr/bin/pytest* /usr/bin/py.test*\n")
    client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True, forcerm=True, pull=False,
                        network_mode="none")
    yield tag
    client.images.remove(tag, force=True)


@pytest.mark.docker
def test_a_test_command_that_cannot_run_is_an_eval_error_not_unresolved(tasks_file, rows, image_without_pytest):
    row = task(rows, "intervals")
    inst = next(i for i in load_instances(tasks_file) if i.instance_id == row["instance_id"])
    result = grade_patch(inst, row["patch"].encode(), image_without_pytest, label=LABEL, timeout_s=120)
    assert not result.resolved and result.error is None
    assert result.report["status"] == "eval_error", result.report
    assert "none of the" in result.eval_error and "No module named pytest" in result.log
    # the episode says so too, in its own field, and the reward is no verdict (correct False, error None)
    with make_env(tasks_file, images={row["instance_id"]: image_without_pytest}) as env:
        info = play(env, gold_policy(row), task_id=row["instance_id"])
    assert info["report"]["status"] == "eval_error" and info["eval_error"] and info["error"] is None


@pytest.mark.docker
def test_a_diff_that_breaks_the_test_run_is_unresolved_with_the_reason(tasks_file, rows):
    row = task(rows, "intervals")
    inst = next(i for i in load_instances(tasks_file) if i.instance_id == row["instance_id"])
    # a conftest.py that raises: pytest collects nothing, though the code under test is untouched
    broken = ("diff --git a/conftest.py b/conftest.py\nnew file mode 100644\n--- /dev/null\n+++ b/conftest.py\n"
              "@@ -0,0 +1 @@\n+raise ImportError('broken by the diff')\n")
    result = grade_patch(inst, broken.encode(), inst.image, label=LABEL, timeout_s=120)
    assert result.report["patch_successfully_applied"], result.report
    assert result.report["status"] == "unresolved" and result.eval_error is None and result.error is None
    assert "the diff broke the test run" in result.report["detail"]


def test_the_kept_log_is_its_head_and_its_tail():
    from sao.envs.swebench.grading import clip_log

    text = "INSTALL ERROR\n" + "x" * 50_000 + "\nverdicts"
    kept = clip_log(text, 1000)
    assert kept.startswith("INSTALL ERROR") and kept.endswith("verdicts") and "characters omitted" in kept
    assert len(kept) < 1100 and clip_log("short", 1000) == "short"


# -- reward integrity -------------------------------------------------------------------------------


@pytest.mark.docker
def test_the_agent_cannot_see_later_history_the_tests_or_the_network(tasks_file, rows):
    row = task(rows, "intervals")
    hidden_test = row["FAIL_TO_PASS"][0].split("::")[1]
    with make_env(tasks_file) as env:
        env.reset(options={"task_id": row["instance_id"]})
        obs = step_call(env, "bash", {"command": "git log --all --format=%H; echo refs:; git for-each-ref; "
                                                 "git stash list; git reflog --all | wc -l"})[0]
        out = obs[0]["content"]
        assert out.startswith("[exit code 0]")
        commits = out.split("refs:")[0].split()[3:]
        assert commits == [row["base_commit"]], out
        assert out.split("refs:")[1].split() == [row["base_commit"], "commit", "refs/heads/main", "0"], out
        obs = step_call(env, "bash", {"command": f"git cat-file -e {row['fix_commit']} || echo MISSING"})[0]
        assert obs[0]["content"].split() == ["[exit", "code", "0]", "MISSING"], obs[0]["content"]
        search = (f"grep -rl --exclude-dir=proc --exclude-dir=sys {hidden_test} / --exclude-dir=usr 2>/dev/null; "
                  "find / -xdev \\( -name '*.patch' -o -name '*.diff' \\) -not -path '/proc/*' 2>/dev/null; "
                  "cat .git/COMMIT_EDITMSG .git/ORIG_HEAD .git/FETCH_HEAD 2>/dev/null; "
                  "grep -v -e '^#' -e ' refs/heads/main$' .git/packed-refs; "
                  "git cat-file --batch-all-objects --batch-check='%(objecttype)' | grep -c '^commit'")
        obs = step_call(env, "bash", {"command": search})[0]
        assert obs[0]["content"].split() == ["[exit", "code", "0]", "1"], obs[0]["content"]
        obs = step_call(env, "bash", {"command": "ls /sys/class/net"})[0]
        assert obs[0]["content"].split() == ["[exit", "code", "0]", "lo"]
    # The check is meaningful: without history hiding the fix commit is there.
    with make_env(tasks_file, hide_history=False) as env:
        env.reset(options={"task_id": row["instance_id"]})
        obs = step_call(env, "bash", {"command": f"git cat-file -e {row['fix_commit']} && git tag"})[0]
        assert obs[0]["content"].split() == ["[exit", "code", "0]", "v0.2.0"]


@pytest.mark.docker
@pytest.mark.part("docker")
def test_limits_given_as_mappings_reach_the_agents_and_the_graders_containers(tasks_file, rows):
    """sao-eval's --cpus/--memory-mb/--pids and --grading-network, as the environment gets them: the agent's
    container has the limits, and the grader's has network only when asked (a diff whose code fails to
    import without a network interface besides loopback resolves with it, not without)."""
    row = task(rows, "intervals")
    needs_network = ("bash", {"command": "printf 'import os\\nassert os.listdir(\"/sys/class/net\") != [\"lo\"], "
                                         "\"no network\"\\n' >> intervals/__init__.py"})
    calls = [*gold_policy(row).calls, needs_network]
    verdicts = {}
    for network in (False, True):
        with make_env(tasks_file, limits={"cpus": 1, "memory_mb": 512, "pids": 300},
                      grading_limits={"network": network}) as env:
            env.reset(options={"task_id": row["instance_id"]})
            (agents,) = containers(env._docker())  # what the daemon holds for the agent's container
            host = agents.attrs["HostConfig"]
            assert (host["NanoCpus"], host["Memory"], host["PidsLimit"], host["NetworkMode"]) == \
                (10**9, 512 * 2**20, 300, "none"), host
            info = play(env, scripted_policy(calls), task_id=row["instance_id"])
        verdicts[network] = (info["report"]["status"], info["error"])
    assert verdicts == {False: ("unresolved", None), True: ("resolved", None)}, verdicts


FUTURE_PEEKING_INIT = """\
import os
import subprocess

_repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _git(*args):
    return subprocess.run(["git", *args], cwd=_repo, capture_output=True, text=True)


def _from_the_future(path):
    for commit in _git("rev-list", "--all").stdout.split():
        shown = _git("show", f"{commit}:{path}")
        if shown.returncode == 0 and "<=" in shown.stdout:
            return shown.stdout
    return None


_source = _from_the_future("intervals/core.py")
if _source:
    exec(compile(_source, "core.py", "exec"), globals())
else:
    from .core import merge, total_length
"""


@pytest.mark.docker
def test_code_that_reads_later_commits_at_grading_time_gains_nothing(tasks_file, rows):
    # A known SWE-bench exploit: the agent's code, run by the tests, reads the fix from the image's
    # later history. The grading container hides that history too, so this is not resolved...
    row = task(rows, "intervals")
    policy = scripted_policy([("editor", {"command": "create", "path": "intervals/__init__.py",
                                          "file_text": FUTURE_PEEKING_INIT})])
    with make_env(tasks_file) as env:
        info = play(env, policy, task_id=row["instance_id"])
    assert info["correct"] is False and info["error"] is None and info["report"]["status"] == "unresolved"
    # ... while the same diff is resolved when the grader keeps the history: the exploit is real.
    inst = next(i for i in load_instances(tasks_file) if i.instance_id == row["instance_id"])
    leaky = grade_patch(inst, info["patch"].encode(), inst.image, label=LABEL, timeout_s=120, hide_history=False)
    assert leaky.resolved and leaky.error is None


@pytest.mark.docker
def test_a_missing_image_lists_every_source_it_tried(tasks_file, rows, client):
    row = dict(task(rows, "roman"), image="sao-no-such-image/roman:v0")
    inst = instances_from_rows([row], source="mem")
    env = SWEBenchEnv(inst, label=LABEL, build=True, pull_timeout_s=20)
    with pytest.raises(InstanceImageError) as err:
        env.reset(options={"task_id": row["instance_id"]})
    message = str(err.value)
    for part in ("images-arg: the `images` map has no entry", "row-image: sao-no-such-image/roman:v0 is not present",
                 "pull sao-no-such-image/roman:v0 failed", "swebench/sweb.eval.", "swebench-build: swebench's specs"):
        assert part in message, message
    assert isinstance(err.value, E.TaskError)
    # The `images` argument comes first.
    env = SWEBenchEnv(inst, label=LABEL, images={row["instance_id"]: task(rows, "roman")["image"]})
    _, info = env.reset(options={"task_id": row["instance_id"]})
    assert info["image_source"] == "images-arg"
    env.close()
    assert not containers(client)


# -- tools and episode ends ---------------------------------------------------------------------------


@pytest.mark.docker
def test_malformed_calls_and_tool_errors_become_observations(tasks_file, rows):
    row = task(rows, "csvline")
    with make_env(tasks_file, max_format_errors=20) as env:  # three bad turns in a row would end the episode
        env.reset(options={"task_id": row["instance_id"]})
        obs, _, term, trunc, _ = env.step({"role": "assistant", "content": "",
                                           "invalid_tool_calls": ["Expecting value: line 1 column 1 (char 0)"]})
        assert obs[0]["role"] == "user" and "could not be parsed" in obs[0]["content"] and not (term or trunc)
        checks = [
            (("python", {"code": "1"}), "unknown tool 'python'"),
            (("bash", "{not json"), "not valid JSON"),
            (("bash", {"cmd": "ls"}), "missing required argument(s) ['command']"),
            (("editor", {"command": "view", "path": "nope.py"}), "no such file"),
            (("editor", {"command": "str_replace", "path": "csvline/parser.py", "old_str": "zzz", "new_str": "y"}),
             "does not occur"),
            (("editor", {"command": "str_replace", "path": "csvline/parser.py", "old_str": "field", "new_str": "y"}),
             "times in"),
            (("editor", {"command": "create", "path": "/testbed/tests", "file_text": "x"}), "is a directory"),
            # Docker refuses to write over its bind-mounted /etc/hostname: a sandbox error, still an observation.
            (("editor", {"command": "create", "path": "/etc/hostname", "file_text": "x"}), "Error: sandbox"),
            (("editor", {"command": "view", "path": "csvline/parser.py", "view_range": [3, 1]}),
             "invalid `view_range`"),
        ]
        for (name, args), expected in checks:
            obs, _, term, trunc, _ = step_call(env, name, args)
            assert obs[0]["role"] == "tool" and obs[0]["tool_call_id"] == "call_0"
            assert expected in obs[0]["content"], (name, args, obs[0]["content"])
            assert not (term or trunc)
        obs, _, term, trunc, _ = env.step({"role": "assistant", "content": "I think it is fixed."})
        assert "no tool call" in obs[0]["content"] and not (term or trunc)
        obs, reward, term, trunc, info = step_call(env, "submit")
        assert term and not trunc and reward == 0.0 and info["error"] is None and info["answer"] is None


@pytest.mark.docker
def test_replies_without_tool_calls_end_the_episode(tasks_file, rows):
    with make_env(tasks_file, max_format_errors=2) as env:
        env.reset(options={"task_id": task(rows, "semver")["instance_id"]})
        assert env.step("thinking...")[2:4] == (False, False)
        obs, reward, term, trunc, info = env.step("still thinking")
        assert term and not trunc and info["exit_status"] == "format_errors" and info["correct"] is False


@pytest.mark.docker
def test_long_output_is_truncated_and_slow_commands_time_out(tasks_file, rows):
    with make_env(tasks_file, command_timeout_s=2, observation_chars=2000) as env:
        env.reset(options={"task_id": task(rows, "roman")["instance_id"]})
        text = step_call(env, "bash", {"command": "python3 -c \"print('x' * 100000)\""})[0][0]["content"]
        assert "[... observation truncated:" in text and len(text) < 2200
        text = step_call(env, "bash", {"command": "sleep 30"})[0][0]["content"]
        assert text.startswith("[exit code 124]") and "timed out after 2 s" in text


@pytest.mark.docker
def test_step_limit_ends_and_grades_the_diff(tasks_file, rows):
    row = task(rows, "paginate")
    policy = scripted_policy([
        ("editor", {"command": "create", "path": "/tmp/fix.patch", "file_text": row["patch"]}),
        ("bash", {"command": "git apply /tmp/fix.patch"}),
        ("bash", {"command": "git status --short"}),
    ])
    with make_env(tasks_file, max_steps=3) as env:
        info = play(env, policy, task_id=row["instance_id"])
    # graded: the reward is final (terminated, not bootstrapped), and the step limit cut it (truncated)
    assert info["truncated"] and info["terminated"] and info["exit_status"] == "max_steps"
    assert info["correct"] is True and info["reward"] == 1.0 and info["error"] is None


@pytest.mark.docker
def test_swe_local_defaults_to_the_built_tasks(tasks_file):
    # Without `data` the factory runs the builder (cached) into local_tasks_dir(), as tasks_file was.
    with swe_local(label=LABEL) as env:
        assert env.task_ids() == [f"sao-local__{t.name}-1" for t in local_tasks.TASKS]
        assert len(env.task_ids()) >= 5


@pytest.mark.docker
def test_check_env_passes_on_swe_local(tasks_file, client):
    E.check_env(E.make("swe-local", data=str(tasks_file), label=LABEL))
    assert not containers(client)


def test_swe_bench_episodes_default_to_the_papers_300_turns(tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps(_row()) + "\n")
    assert E.make("swe-bench-verified", data=str(data)).unwrapped.max_steps == 300
    assert E.make("swe-bench-verified", data=str(data), max_steps=20).unwrapped.max_steps == 20
