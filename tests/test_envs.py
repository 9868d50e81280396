"""The environment API: registry, Gymnasium contract (check_env over every env), math envs, datasets."""

from __future__ import annotations

import functools
import json
import os

import gymnasium as gym
import pytest

import sao.envs as E
from sao.envs.arithmetic import ArithmeticTasks, make_task
from sao.envs.capabilities import prediction_grader, scripted_policies
from sao.envs.datasets import load_rows
from tests.conftest import SHARED_DATA, shared_file

# Data-backed environments get the local copies when present; otherwise they would go to the hub.
LOCAL_DATA = {"beyond-aime": "beyond_aime.jsonl", "imo-answerbench": "answerbench_v2.csv"}


# SWE environments need Docker. The hub-backed ones have no complete local copy (../shared/data
# has prompts and gold patches only), so their factory and class are checked on the local SWE
# tasks, which have the same schema; loading from the hub itself is not tested offline.
SWE_ENVS = {"swe-local", "swe-bench-verified", "swe-bench-lite", "swe-bench"}
SWE_LABEL = f"pytest-envs-{os.getpid()}"


@functools.lru_cache(maxsize=1)
def _swe_local_tasks() -> str:
    from sao.envs.swebench import build_local_tasks
    from sao.sandboxes import DockerUnavailableError

    try:
        return str(build_local_tasks(label=SWE_LABEL))
    except DockerUnavailableError as exc:
        if os.environ.get("SAO_REQUIRE_DOCKER") == "1":
            pytest.fail(f"a Docker daemon is required here (SAO_REQUIRE_DOCKER=1): {exc}")
        pytest.skip(f"the SWE environments need Docker: {exc}")


def _env_kwargs(name: str) -> dict:
    if name in LOCAL_DATA:
        return {"data": str(shared_file(LOCAL_DATA[name]))}
    if name in SWE_ENVS:
        return {"data": _swe_local_tasks(), "label": SWE_LABEL}
    return {}


@pytest.mark.parametrize("name", sorted(E.entries()))
def test_every_registered_env_conforms(name):
    E.check_env(E.make(name, **_env_kwargs(name)))


def test_gymnasium_ids_and_short_names():
    ids = {e.name: e.gym_id for e in E.entries().values()}
    assert ids["beyond-aime"] == "sao/BeyondAIME-v0"
    assert ids["imo-answerbench"] == "sao/IMO-AnswerBench-v0"
    assert ids["arithmetic"] == "sao/Arithmetic-v0"
    env = gym.make("sao/Arithmetic-v0", disable_env_checker=True)
    assert env.spec.id == "sao/Arithmetic-v0"
    assert E.resolve("sao/BeyondAIME-v0").name == "beyond-aime"


def test_unknown_env_suggests_closest():
    with pytest.raises(E.UnknownEnvError, match="Did you mean 'beyond-aime'"):
        E.resolve("beyond-aim")


def test_check_env_reports_violations():
    class Broken(E.TextEnv):
        def task_ids(self, limit=None):
            return ["a"]

        def _begin(self, task_id):
            return [{"role": "user", "content": "hi"}], {"task_id": "a"}

        def _respond(self, action):  # ends without `correct`, and the base class catches that
            return [], 0.0, True, False, {"answer": None, "error": None}

    with pytest.raises(E.EnvConformanceError) as err:
        E.check_env(Broken())
    text = str(err.value)
    assert "unknown task_id did not raise" in text
    assert "correct" in text


def test_reset_selects_task_and_step_grades():
    env = E.make("arithmetic")
    obs, info = env.reset(options={"task_id": "mul-d2-s0-i5"})
    task = make_task("mul", 2, 0, 5)
    assert info["task_id"] == "mul-d2-s0-i5" and task.problem in obs[-1]["content"]
    obs, reward, terminated, truncated, info = env.step(f"so the result is \\boxed{{{task.answer}}}")
    assert (obs, reward, terminated, truncated) == ([], 1.0, True, False)
    assert info["correct"] is True and info["answer"] == task.answer and info["error"] is None
    with pytest.raises(RuntimeError):
        env.step("again")


def test_feedback_turns_make_a_multi_turn_episode():
    env = E.make("arithmetic", feedback_turns=1)
    env.reset(options={"task_id": "add-d1-s0-i0"})
    gold = make_task("add", 1, 0, 0).answer
    obs, reward, terminated, _, _ = env.step("no idea")
    assert not terminated and reward == 0.0 and "could not find a final answer" in obs[0]["content"]
    obs, reward, terminated, _, info = env.step(f"\\boxed{{{gold}}}")
    assert terminated and reward == 1.0 and info["attempts"] == 2


def test_capabilities_are_found_on_the_env_class():
    # Math: gold answers the reference (graded 1.0), empty answers nothing; a given answer is graded
    # (an external agent's: test_external_grading.py).
    env = E.make("arithmetic")
    policies = scripted_policies(env)
    assert policies is not None and prediction_grader(env) is not None
    obs, info = env.reset(options={"task_id": "add-d1-s0-i0"})
    _, reward, terminated, _, _ = env.step(policies(env.unwrapped, "gold", "add-d1-s0-i0")(obs, info))
    assert terminated and reward == 1.0
    assert policies(env.unwrapped, "empty", "add-d1-s0-i0")(obs, info)["content"] == ""
    with pytest.raises(ValueError, match="'gold' and 'empty'"):
        policies(env.unwrapped, "golden", "add-d1-s0-i0")
    # SWE: both, declared on the class (the instances need Docker; see test_swebench_env/test_eval_swe).
    from sao.envs.swebench import SWEBenchEnv, grade_prediction
    from sao.envs.swe_policies import baseline_policy

    assert SWEBenchEnv.scripted_policies is baseline_policy and SWEBenchEnv.prediction_grader is grade_prediction
    # An environment that declares nothing offers nothing.
    assert scripted_policies(gym.make("CartPole-v1")) is None and prediction_grader(gym.make("CartPole-v1")) is None


def test_malformed_action_is_an_error_not_a_reward():
    env = E.make("arithmetic")
    env.reset(seed=1)
    with pytest.raises(ValueError, match="assistant message"):
        env.step({"role": "user", "content": "\\boxed{1}"})


def test_arithmetic_is_seeded_and_difficulty_moves_digits():
    # The same seed lists the same tasks; a task id rebuilds the same problem.
    assert ArithmeticTasks(seed=3).ids(20) == ArithmeticTasks(seed=3).ids(20)
    assert ArithmeticTasks(seed=3).ids(20) != ArithmeticTasks(seed=4).ids(20)
    t = ArithmeticTasks().get("div-d3-s0-i9")
    a, b = (int(x) for x in t.problem.removeprefix("What is ").removesuffix("?").split(" / "))
    assert a == b * int(t.answer) and 100 <= b <= 999
    # difficulty 0 -> 1 digit; 1 -> max_digits; 0.5 with max 3 -> level 2 exactly.
    for difficulty, digits in ((0.0, {1}), (1.0, {3}), (0.5, {2})):
        ids = ArithmeticTasks(seed=0, difficulty=difficulty, max_digits=3).ids(50)
        assert {int(i.split("-")[1][1:]) for i in ids} == digits
    # level 1.5: a mix of 1 and 2 digits
    mixed = {int(i.split("-")[1][1:]) for i in ArithmeticTasks(difficulty=0.25, max_digits=3).ids(200)}
    assert mixed == {1, 2}
    with pytest.raises(ValueError):
        ArithmeticTasks(ops="+^")
    only_add = ArithmeticTasks(ops="+").ids(10)
    assert all(i.startswith("add-") for i in only_add)


def test_datasets_load_and_count():
    aime = E.make("beyond-aime", data=str(shared_file("beyond_aime.jsonl")))
    assert len(aime.unwrapped.task_ids()) == 100
    imo = E.make("imo-answerbench", data=str(shared_file("answerbench_v2.csv")))
    ids = imo.unwrapped.task_ids()
    assert len(ids) == 400 and ids[0] == "imo-bench-algebra-001"


@pytest.mark.parametrize("suffix", ["jsonl", "json", "csv", "parquet"])
def test_missing_field_names_file_row_and_field(tmp_path, suffix):
    import pandas as pd

    rows = [{"problem": "1+1?", "answer": "2"}, {"problem": "2+2?", "answer": "4"}, {"problem": "3+3?", "answer": ""}]
    path = tmp_path / f"bad.{suffix}"
    frame = pd.DataFrame(rows)
    if suffix == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows[:2]) + json.dumps({"problem": "3+3?"}) + "\n")
    elif suffix == "json":
        path.write_text(json.dumps(rows))
    elif suffix == "csv":
        frame.to_csv(path, index=False)
    else:
        frame.to_parquet(path)
    with pytest.raises(E.DatasetError) as err:
        E.make("beyond-aime", data=str(path))
    message = str(err.value)
    assert str(path) in message and "row 3" in message and "'answer'" in message


def test_bad_json_line_and_missing_file(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"problem": "a", "answer": "1"}\n{not json\n')
    with pytest.raises(E.DatasetError, match="line 2 is not valid JSON"):
        load_rows(path)
    with pytest.raises(E.DatasetError, match="no such file"):
        load_rows(tmp_path / "nope.csv")


def test_imo_v2_rows_are_read_verbatim():
    rows = load_rows(shared_file("answerbench_v2.csv"))
    assert len(rows) == 400
    assert rows[1]["Short Answer"] == "$\\left\\lfloor \\log_{2}a\\right\\rfloor +1$."
    assert SHARED_DATA.exists()


# -- check_env: seeded determinism and return values (issue 14, item 3) ----------------------------


class _Tasks(E.TextEnv):
    """Ten tasks; the first observation names the task, drawn by `draw()` when none is asked for."""

    def task_ids(self, limit=None):
        return [f"t{i}" for i in range(10)][:limit]

    def draw(self) -> int:
        return int(self.np_random.integers(10))

    def _begin(self, task_id):
        if task_id is None:
            task_id = f"t{self.draw()}"
        if task_id not in self.task_ids():
            raise KeyError(task_id)
        return [{"role": "user", "content": f"task {task_id}"}], {"task_id": task_id}

    def _respond(self, action):
        return [], 1.0, True, False, {"correct": True, "answer": "x", "error": None}


class _GlobalRandom(_Tasks):
    def draw(self):  # Python's global generator: ignores the seed
        import random

        return random.randrange(10)


class _GlobalNumpy(_Tasks):
    def draw(self):  # numpy's global generator: ignores the seed
        import numpy as np

        return int(np.random.randint(10))


class _NeverSeeded(_Tasks):
    def reset(self, *, seed=None, options=None):  # forgets super().reset(seed=seed): np_random keeps drawing
        obs, info = self._begin((options or {}).get("task_id"))
        self._done = False
        return obs, info


class _OwnGenerator(_Tasks):
    def _begin(self, task_id):  # a generator of its own, never seeded (caught unless all its draws repeat)
        import random

        obs, info = super()._begin(task_id)
        return [{"role": "user", "content": f"{obs[0]['content']} {random.SystemRandom().random()}"}], info


@pytest.mark.parametrize("broken", [_GlobalRandom, _GlobalNumpy, _NeverSeeded, _OwnGenerator])
def test_a_reset_that_ignores_its_seed_fails_every_time(broken):
    for _ in range(60):  # the old check (two resets) let such an env through about 1 time in 10
        with pytest.raises(E.EnvConformanceError, match=r"reset\(seed=\d\)"):
            E.check_env(broken())


def test_the_seed_check_passes_a_seeded_env_and_restores_the_global_generators():
    import random

    import numpy as np

    random.seed(123)
    np.random.seed(123)
    expected = random.random(), np.random.random()
    random.seed(123)
    np.random.seed(123)
    for _ in range(20):
        E.check_env(_Tasks())
    assert (random.random(), np.random.random()) == expected


def _rewarding(reward):
    class Rewarding(_Tasks):
        def _respond(self, action):
            return [], reward, True, False, {"correct": True, "answer": "x", "error": None}

    return Rewarding()


@pytest.mark.parametrize("reward", ["1", True, None, float("nan"), [1.0]])
def test_a_reward_must_be_a_real_number(reward):
    # TextEnv.step converts with float(): "1" and True would pass unseen without the check of _respond
    with pytest.raises(E.EnvConformanceError, match="reward must be"):
        E.check_env(_rewarding(reward))


@pytest.mark.parametrize("reward", [1, 0.5, -2, "numpy"])
def test_real_rewards_pass(reward):
    import numpy as np

    E.check_env(_rewarding(np.float32(0.5) if reward == "numpy" else reward))


class _Raw(gym.Env):
    """A plain gymnasium.Env (no TextEnv): what it returns reaches the checker unchanged."""

    observation_space = E.MessagesSpace()
    action_space = E.AssistantMessageSpace()
    tools = ()

    def task_ids(self, limit=None):
        return ["a", "b"][:limit]

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        task = (options or {}).get("task_id") or "ab"[int(self.np_random.integers(2))]
        if task not in ("a", "b"):
            raise KeyError(task)
        return [{"role": "user", "content": f"task {task}"}], {"task_id": task}

    def step(self, action):
        E.core.as_action(action)
        return [], 1.0, True, False, {"correct": True, "answer": None, "error": None}


def test_a_plain_env_that_keeps_the_contract_passes():
    E.check_env(_Raw())


def test_step_must_return_a_5_tuple_and_reset_a_2_tuple():
    class OldStep(_Raw):
        def step(self, action):  # gym's old API: (obs, reward, done, info)
            E.core.as_action(action)
            return [], 1.0, True, {}

    class ObsOnlyReset(_Raw):
        def reset(self, *, seed=None, options=None):
            return super().reset(seed=seed, options=options)[0]

    with pytest.raises(E.EnvConformanceError, match=r"step must return a 5-tuple \(observation, reward, terminated, "
                                                    r"truncated, info\), got a tuple of 4"):
        E.check_env(OldStep())
    with pytest.raises(E.EnvConformanceError, match=r"reset must return a 2-tuple \(observation, info\), got list"):
        E.check_env(ObsOnlyReset())

    class ShortRespond(_Tasks):
        def _respond(self, action):
            return [], 1.0, True, {"correct": True, "answer": "x", "error": None}

    with pytest.raises(E.EnvConformanceError, match=r"_respond must return a 5-tuple .* got a tuple of 4"):
        E.check_env(ShortRespond())


def test_check_episode_is_the_short_form():
    from sao.envs.checker import check_episode

    check_episode(E.make("arithmetic"))
    with pytest.raises(E.EnvConformanceError, match="reward must be a real number"):
        check_episode(_rewarding("1"), task_id="t3")

    class Endless(_Tasks):  # no step limit: check_env wants one, the short form leaves it to the agent loop
        def _respond(self, action):
            return [{"role": "user", "content": "go on"}], 0.0, False, False, {}

    check_episode(Endless())
    with pytest.raises(E.EnvConformanceError, match="no episode end within 8 steps"):
        E.check_env(Endless())
