"""``sao-eval``'s SWE-bench group: each flag sets its keyword argument of the SWE environment (as
``--env-arg`` would), is refused for another benchmark and together with ``--env-arg`` for the same
argument, and ``--help`` shows the group. No Docker, no engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from sao.envs.swebench.env import SWEBenchEnv
from sao.evals.cli import LIMIT_FLAGS, SWE_FLAGS, build_parser, eval_config, main
from sao.evals.runner import EvalError

# flag and its value on the command line -> the environment's keyword argument and value
CASES = [
    (["--pull-timeout", "90"], "pull_timeout_s", 90.0),
    (["--pull-retries", "2"], "pull_retries", 2),
    (["--platform", "linux/amd64"], "platform", "linux/amd64"),
    (["--no-pull"], "pull", False),
    (["--build-images"], "build", True),
    (["--no-hide-history"], "hide_history", False),
    (["--command-timeout", "30"], "command_timeout_s", 30.0),
    (["--eval-timeout", "600"], "eval_timeout_s", 600.0),
    (["--max-format-errors", "5"], "max_format_errors", 5),
    (["--no-autosubmit"], "autosubmit", False),
]


def env_args(tmp_path: Path, *argv: str) -> dict:
    return eval_config(build_parser().parse_args([*argv, "--concurrency", "1"]), tmp_path / "out").env_args


def test_the_cases_cover_every_flag_and_name_real_keyword_arguments():
    import inspect

    assert {kwarg for _, kwarg, _ in CASES} == {kwarg for kwarg, _ in SWE_FLAGS.values()}
    assert {flags[0] for flags, _, _ in CASES} == {flag for _, flag in SWE_FLAGS.values()}
    assert {kwarg for kwarg, _ in SWE_FLAGS.values()} <= set(inspect.signature(SWEBenchEnv.__init__).parameters)


@pytest.mark.parametrize(("argv", "kwarg", "value"), CASES, ids=[c[0][0] for c in CASES])
def test_each_flag_reaches_the_environments_keyword_argument(tmp_path, argv, kwarg, value):
    assert env_args(tmp_path, "swe-bench-lite", *argv) == {kwarg: value}
    # the same value as --env-arg gives the same keyword arguments
    as_pair = "true" if value is True else "false" if value is False else str(value)
    assert env_args(tmp_path, "swe-bench-lite", "--env-arg", f"{kwarg}={as_pair}") == {kwarg: value}


def test_flags_left_out_set_nothing_and_combine_with_the_others(tmp_path):
    assert env_args(tmp_path, "swe-local") == {}
    got = env_args(tmp_path, "swe-local", "--max-steps", "7", "--build-images", "--pull-timeout", "5",
                   "--env-arg", "observation_chars=4000")
    assert got == {"max_steps": 7, "build": True, "pull_timeout_s": 5.0, "observation_chars": 4000}


@pytest.mark.parametrize(("argv", "kwarg", "value"), CASES, ids=[c[0][0] for c in CASES])
def test_a_swe_flag_is_refused_for_another_benchmark(tmp_path, argv, kwarg, value):
    with pytest.raises(EvalError, match=rf"^{argv[0]}: for the SWE benchmarks only \(.*swe-local.*\); "
                                        r"beyond-aime is not one"):
        env_args(tmp_path, "beyond-aime", *argv)


@pytest.mark.parametrize(("argv", "kwarg", "value"), CASES, ids=[c[0][0] for c in CASES])
def test_a_flag_and_env_arg_for_the_same_argument_are_refused(tmp_path, argv, kwarg, value):
    with pytest.raises(EvalError, match=f"^{argv[0]} and --env-arg {kwarg}=1 both set {kwarg}: give each once"):
        env_args(tmp_path, "swe-local", *argv, "--env-arg", f"{kwarg}=1")


def test_the_older_flags_refuse_a_clashing_env_arg_too(tmp_path):
    with pytest.raises(EvalError, match="--max-steps and --env-arg max_steps=4 both set max_steps"):
        env_args(tmp_path, "swe-local", "--max-steps", "30", "--env-arg", "max_steps=4")
    with pytest.raises(EvalError, match="--image-map and --env-arg images=\"m.json\" both set images"):
        env_args(tmp_path, "swe-local", "--image-map", "x.json", "--env-arg", "images=m.json")
    assert env_args(tmp_path, "swe-local", "--env-arg", "max_steps=4") == {"max_steps": 4}  # --env-arg alone


def test_main_exits_2_with_the_message(tmp_path, capsys):
    assert main(["arithmetic", "--no-hide-history", "--output", str(tmp_path / "a")]) == 2
    assert "error: --no-hide-history: for the SWE benchmarks only" in capsys.readouterr().err
    assert main(["swe-local", "--concurrency", "1", "--eval-timeout", "60", "--env-arg", "eval_timeout_s=90",
                 "--output", str(tmp_path / "b")]) == 2
    assert "error: --eval-timeout and --env-arg eval_timeout_s=90 both set eval_timeout_s" in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_help_shows_the_swe_bench_group():
    text = build_parser().format_help()
    group = text[text.index("\nSWE-bench:\n"):]
    for flag in ("--max-steps", "--image-map", "--grade-only", "--no-autosubmit",
                 *(flag for _, flag in SWE_FLAGS.values()), *(flag for _, _, flag in LIMIT_FLAGS.values())):
        assert f"\n  {flag}" in group, flag
    assert "WEAKENS THE BENCHMARK" in group[group.index("--no-hide-history"):]


# -- the containers' limits: --cpus, --memory-mb, --pids (both containers), --grading-network --------------


def test_limit_flags_become_partial_limits_that_the_environment_overrides_its_defaults_with(tmp_path):
    got = env_args(tmp_path, "swe-bench-lite", "--cpus", "4", "--memory-mb", "8192", "--pids", "2048",
                   "--grading-network")
    assert got == {"limits": {"cpus": 4.0, "memory_mb": 8192, "pids": 2048}, "grading_limits": {"network": True}}
    # the same as --env-arg, which takes JSON
    assert env_args(tmp_path, "swe-bench-lite", "--env-arg", 'limits={"cpus": 4, "memory_mb": 8192, "pids": 2048}',
                    "--env-arg", 'grading_limits={"network": true}') == got
    env = SWEBenchEnv([_instance()], **got)
    assert (env.limits.cpus, env.limits.memory_mb, env.limits.pids, env.limits.network) == (4.0, 8192, 2048, False)
    # the grader's: the agent's limits, with network
    assert (env.grading_limits.cpus, env.grading_limits.memory_mb, env.grading_limits.network) == (4.0, 8192, True)
    assert env.limits.default_timeout_s == env.command_timeout_s  # the fields not named keep their defaults
    plain = SWEBenchEnv([_instance()])
    assert (plain.limits.cpus, plain.limits.memory_mb, plain.limits.network, plain.grading_limits.network) == \
        (2.0, 4096, False, False)


def test_a_bad_limit_is_refused_with_what_is_wrong(tmp_path):
    with pytest.raises(ValueError, match=r"unknown sandbox limit\(s\) \['cores'\]; the limits are \['cpus'"):
        SWEBenchEnv([_instance()], limits={"cores": 4})
    with pytest.raises(ValueError, match="cpus must be > 0"):
        SWEBenchEnv([_instance()], limits={"cpus": 0})
    with pytest.raises(EvalError, match="^--cpus: for the SWE benchmarks only"):
        env_args(tmp_path, "arithmetic", "--cpus", "2")
    with pytest.raises(EvalError, match="^--grading-network: for the SWE benchmarks only"):
        env_args(tmp_path, "arithmetic", "--grading-network")
    with pytest.raises(EvalError, match=r"^--cpus/--memory-mb/--pids and --env-arg limits=\{\"pids\": 9\} both set limits"):
        env_args(tmp_path, "swe-local", "--cpus", "2", "--env-arg", 'limits={"pids": 9}')


def test_a_limit_the_machine_refuses_is_exit_2_before_any_episode(tmp_path, capsys):
    assert main(["swe-local", "--concurrency", "1", "--memory-mb", "8", "--output", str(tmp_path / "o")]) == 2
    assert "memory_mb must be >= 16 (got 8)" in capsys.readouterr().err


def _instance():
    from sao.envs.swebench.instances import SWEInstance

    return SWEInstance(instance_id="o__r-1", repo="o/r", base_commit="0" * 40, patch="", test_patch="",
                       problem_statement="p", version="1.0", fail_to_pass=("t",), pass_to_pass=(),
                       environment_setup_commit="0" * 40)
