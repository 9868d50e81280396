"""`sao-env`: the registered environments and the conformance check (plug-ins: tests/test_plugins.py)."""

from __future__ import annotations

import pytest

from sao.envs.cli import env_args, listings, main


def test_list_names_every_builtin_with_its_source(capsys):
    assert main(["list"]) == 0
    rows = {line.split()[0]: line.split()[1:3] for line in capsys.readouterr().out.splitlines()}
    assert rows["arithmetic"] == ["built-in", "sao/Arithmetic-v0"]
    assert {r.name for r in listings()} >= {"arithmetic", "beyond-aime", "swe-bench-lite", "swe-local"}


def test_check_passes_a_conforming_env(capsys):
    assert main(["check", "arithmetic", "--env-arg", "difficulty=0.2", "--env-arg", "ops=+-"]) == 0
    assert capsys.readouterr().out == "ok: arithmetic (sao/Arithmetic-v0) keeps the text-environment contract\n"
    assert main(["check", "sao/Arithmetic-v0"]) == 0  # a Gymnasium id too


@pytest.mark.parametrize(("argv", "code", "message"), [
    (["check", "arithmetc"], 2, "error: unknown environment 'arithmetc'. Did you mean 'arithmetic'?"),
    (["check", "arithmetic", "--env-arg", "difficulty"], 2, "error: --env-arg expects KEY=VALUE, got 'difficulty'"),
    (["check", "arithmetic", "--env-arg", "bogus=1"], 1, "error: arithmetic(bogus=1) could not be made: TypeError:"),
])
def test_check_says_what_is_wrong(capsys, argv, code, message):
    assert main(argv) == code
    assert capsys.readouterr().err.startswith(message)


def test_env_args_read_json_else_text():
    assert env_args(["a=0.5", "b=true", 'c=["x"]', "d=+-", "e="]) == {"a": 0.5, "b": True, "c": ["x"], "d": "+-",
                                                                       "e": ""}
