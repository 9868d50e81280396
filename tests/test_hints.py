"""sao.hints.did_you_mean: the one "did you mean" of every error message, in its two forms."""

from __future__ import annotations

import ast
from pathlib import Path

from sao.hints import did_you_mean


def test_the_two_forms_and_nothing_when_no_name_is_close():
    assert did_you_mean("arithmetc", ["arithmetic", "beyond-aime"]) == " Did you mean 'arithmetic'?"
    assert did_you_mean("token-men", ("token-mean", "seq-mean-token-mean"), clause=True) == "; did you mean 'token-mean'?"
    assert did_you_mean("zzz", ["arithmetic"]) == "" and did_you_mean("zzz", [], clause=True) == ""


def test_known_may_be_any_iterable_of_names_and_the_cutoff_is_difflibs():
    known = {"smollm2-135m": 1, "qwen3-0.6b": 2}  # a registry's keys
    assert did_you_mean("smollm2", known, clause=True) == "; did you mean 'smollm2-135m'?"  # ratio 0.74
    assert did_you_mean("smollm2", known, cutoff=0.8, clause=True) == ""
    assert did_you_mean("grpo", (n for n in ["ppo", "grpo_dis"])) == " Did you mean 'grpo_dis'?"  # 0.67 > 0.6 > 0.57


def test_it_is_a_leaf_that_every_package_may_import():
    tree = ast.parse(Path(__file__).resolve().parents[1].joinpath("hints", "__init__.py").read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names} | \
        {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported == {"__future__", "difflib", "collections.abc"}
