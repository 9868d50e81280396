"""``sao-eval swe-bench-verified`` as a new user runs it against a hosted model, on the genuine instance
psf__requests-5414 (tests/swe_real builds it; see tests/test_swe_real.py for its skip rule and cache).

The model is a scripted OpenAI-compatible chat endpoint (:class:`~sao.agents.testing.fake_server.FakeServer`,
``chat_only``, so ``--endpoint-mode auto`` picks chat mode as for a hosted API) that lists a
``max_model_len`` of 65,536 in ``/v1/models`` as vLLM does, and plays :func:`realistic_episode`: 40 turns,
one native tool call each, every reply led by about 440 characters of reasoning (the fake server counts a
byte a token, so ``usage.completion_tokens`` adds up to about 25k over the episode), tool outputs of
several thousand characters (``cat`` of real source files, the history, the tests). The fix (the gold
patch's one-line change, an ``editor`` ``str_replace`` read from the row) lands at turn 7, then the agent
checks it, explores on, and submits at turn 40.

Why the fix comes at turn 7: the contract says that an episode cut by ``--max-turns 10`` is graded on its
diff at the cut. With the fix in that diff, the cut episode resolves, which shows the grading really ran
on the diff the cut left (an empty or missing diff cannot resolve); with ``--no-autosubmit`` the same cut
is an empty patch and scores 0.

Each run starts the instance's container and grades once: 7 to 15 seconds a run on 2 cores (about 35 s for
the three), so they are in the default tier.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from sao.agents.store import read_trajectories
from sao.agents.testing.fake_server import FakeServer, Reply
from tests.test_swe_real import ONE, _build, out_dir

SAO_EVAL = str(Path(sys.executable).with_name("sao-eval"))
CONTEXT = 65_536  # what /v1/models reports, as vLLM does for a 64k model
TURNS = 40
FIX_TURN = 7  # 1-based: the turn whose tool call applies the fix
THINKING = 440  # characters of reasoning a reply leads with (a token each on the fake server)

REASONING = (
    "The issue says that requests.get('http://.example.com') raises a bare UnicodeError from the idna codec "
    "instead of the InvalidURL that requests raises for other labels it cannot encode.",
    "prepare_url in requests/models.py parses the URL with urllib3's parse_url, and when the host is not pure "
    "ASCII it calls _get_idna_encoded_host, which turns the idna error into InvalidURL.",
    "For an ASCII host the only check is host.startswith(u'*'); a host that starts with a dot passes it, and "
    "the empty label reaches the standard library's idna codec later, when the connection is made.",
    "The smallest change that matches the maintainers' intent is to reject a leading dot the same way as a "
    "leading star, with the same message, so that callers catch one exception type for invalid labels.",
    "I should keep the change local to prepare_url, not touch the idna handling of non-ASCII hosts, and not "
    "edit the existing tests: hidden tests will check the behaviour, including URLs that must keep working.",
    "Before submitting I want to see the surrounding code paths, the exceptions module and the tests that "
    "cover invalid URLs, and run the relevant tests to make sure nothing else changes.",
)


def thinking(turn: int, step: str) -> str:
    """About :data:`THINKING` characters of reasoning for ``turn``, ending with what the step does."""
    text, i = f"Turn {turn}. ", turn - 1
    while len(text) < THINKING:
        text += REASONING[i % len(REASONING)] + " "
        i += 1
    return f"{text[:THINKING].rsplit(' ', 1)[0]} ... Next: {step}"


EXPLORE = (  # after the fix is checked: reading on, as an agent that is not sure yet would
    "cat requests/exceptions.py", "cat requests/utils.py", "grep -rn '_get_idna_encoded_host' --include=*.py .",
    "sed -n 1,220p tests/test_requests.py", "grep -rn 'startswith' requests/", "sed -n 1,260p HISTORY.md",
    "cat requests/sessions.py", "cat requests/adapters.py", "grep -rn 'InvalidURL' --include=*.py .",
    "git log --stat -n 3", "cat requests/api.py", "python -c 'import idna, urllib3; print(idna.__version__, "
    "urllib3.__version__)'", "cat setup.py", "cat requests/__init__.py", "grep -rn 'def parse_url' -A30 "
    "/opt/miniconda3/envs/testbed/lib/python3*/site-packages/urllib3/util/url.py | head -80",
    "sed -n 1,200p requests/structures.py", "cat requests/compat.py", "git diff --stat",
    "sed -n 330,460p requests/models.py", "grep -n 'test_invalid_url' -A25 tests/test_requests.py",
)


def realistic_steps(gold: str) -> list[tuple[str, dict[str, Any]]]:
    """The episode's 40 tool calls: explore, reproduce, the gold patch's change by ``str_replace`` at
    turn :data:`FIX_TURN`, check, explore on, ``submit`` last."""
    old = "\n".join(line[1:] for line in gold.splitlines() if line.startswith("-") and not line.startswith("---"))
    new = "\n".join(line[1:] for line in gold.splitlines() if line.startswith("+") and not line.startswith("+++"))
    repro = "python -c \"import requests; requests.get('http://.example.com')\" 2>&1 | tail -4"  # the issue's
    steps: list[tuple[str, dict[str, Any]]] = [
        ("bash", {"command": "ls -la && git log --oneline -n 15 && git status"}),
        ("bash", {"command": "grep -rn 'invalid label' --include=*.py ."}),
        ("bash", {"command": "cat requests/models.py"}),
        ("editor", {"command": "view", "path": "requests/models.py", "view_range": [340, 440]}),
        ("bash", {"command": repro}),
        ("bash", {"command": "grep -rn 'idna' requests/ | head -40"}),
        ("editor", {"command": "str_replace", "path": "requests/models.py", "old_str": old, "new_str": new}),
        ("bash", {"command": repro}),
        ("bash", {"command": "git diff"}),
        ("bash", {"command": "python -m pytest -q -p no:cacheprovider tests/test_requests.py -k invalid_url 2>&1 "
                             "| tail -15"}),
    ]
    assert len(steps) >= FIX_TURN and steps[FIX_TURN - 1][1].get("command") == "str_replace"
    while len(steps) < TURNS - 1:
        steps.append(("bash", {"command": EXPLORE[(len(steps) - 10) % len(EXPLORE)]}))
    return [*steps, ("submit", {})]


def realistic_episode(gold: str):
    """The fake server's responder: turn N (the assistant messages so far + 1) answers the Nth step."""
    steps = realistic_steps(gold)

    def respond(request: dict, prompt: str) -> Reply:
        turn = sum(m["role"] == "assistant" for m in request["messages"]) + 1
        name, args = steps[min(turn, len(steps)) - 1]
        call = {"id": f"call_{turn}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
        what = f"{name} {args.get('command', '')}".strip()[:80]
        return Reply(text=thinking(turn, what), tool_calls=(call,))

    return respond


# -- the runs -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def instance(docker_client) -> dict[str, Any]:
    """ROWS, MAP and the row of :data:`ONE` (built, or found in the cache, as test_swe_real.py's default
    tier does; skipped or failed by its rule when the snapshot or the data is missing)."""
    out = out_dir() / "one"
    _build(docker_client, out, only=[ONE])
    (row,) = [json.loads(line) for line in (out / "instances.jsonl").read_text().splitlines() if line.strip()]
    assert row["instance_id"] == ONE
    return {"rows": out / "instances.jsonl", "map": out / "images.json", "row": row}


def sao_eval(instance: dict[str, Any], out: Path, *flags: str, terminal: bool = False) -> dict[str, Any]:
    """``sao-eval swe-bench-verified --data ROWS --image-map MAP --base-url URL --model NAME`` (and ``flags``)
    against the scripted endpoint; what it wrote, its stderr and its wall time. ``terminal``: rich is told
    that stderr is an interactive terminal (``TTY_COMPATIBLE``, ``TTY_INTERACTIVE``, and a ``TERM`` other
    than CI's ``dumb``), so the live display is drawn into it as on a user's screen."""
    tty = {"TTY_COMPATIBLE": "1", "TTY_INTERACTIVE": "1", "COLUMNS": "160", "TERM": "xterm-256color"} if terminal else {}
    with FakeServer(responder=realistic_episode(instance["row"]["patch"]), chat_only=True, model="org/hosted-64k",
                    max_model_len=CONTEXT) as server:
        start = time.monotonic()
        proc = subprocess.run([SAO_EVAL, "swe-bench-verified", "--data", str(instance["rows"]), "--image-map",
                               str(instance["map"]), "--base-url", server.base_url, "--model", "org/hosted-64k",
                               *flags, "--output", str(out)], capture_output=True, text=True, timeout=900,
                              env=os.environ | tty)
        wall = time.monotonic() - start
        requests = list(server.requests)
    assert proc.returncode == 0, proc.stderr[-4000:]
    (t,) = read_trajectories(out / "trajectories.jsonl")
    return {"t": t, "summary": json.loads((out / "summary.json").read_text()), "stderr": proc.stderr,
            "preds": json.loads((out / "preds.json").read_text()),
            "report": json.loads((out / "report.json").read_text()),
            "traj": json.loads((out / "trajs" / f"{ONE}.traj.json").read_text()), "requests": requests, "wall_s": wall}


def changed_lines(patch: str) -> list[str]:
    return [line for line in patch.splitlines() if line[:1] in "+-" and line[:3] not in ("+++", "---")]


@pytest.mark.docker
@pytest.mark.part("sao-eval", "docker", "swebench")
def test_a_40_turn_episode_with_no_budget_flags_resolves_uncut(instance, tmp_path):
    with FakeServer(chat_only=True, max_model_len=CONTEXT, model="m") as probe:  # the endpoint as sao reads it
        from sao.agents.clients.endpoint import open_endpoint

        with open_endpoint("m", base_url=probe.base_url, mode="auto") as endpoint:
            assert (endpoint.mode, endpoint.max_model_len) == ("chat", CONTEXT)
    run = sao_eval(instance, tmp_path / "out", terminal=True)
    t, summary = run["t"], run["summary"]
    # the live status line of the one worker, redrawn while it ran: instance, steps so far, elapsed time
    status = [(int(n), m * 60 + s) for n, m, s in
              (tuple(map(int, g)) for g in re.findall(rf"{ONE}  step (\d+)  (\d+):(\d\d)  \((?:starting|model|env)\)",
                                                         run["stderr"]))]
    assert len(status) >= 3 and status == sorted(status), status[:50]  # steps and time only grow
    assert status[-1][0] >= TURNS // 2 and status[-1][1] >= 1, status[-5:]
    assert summary["pass@k"]["1"] == 1.0 and summary["resolved"] == 1 and summary["mode"] == "text"
    assert summary["n_truncated"] == 0 and summary["exit_status"] == {"submitted": 1}, summary
    assert summary["budgets"]["max_turns"] == 300 and summary["budgets"]["max_tokens"] is None, summary["budgets"]
    assert "were cut by a limit" not in " ".join(run["stderr"].split())  # no cut-warning
    assert t.info["exit_status"] == "submitted" and t.correct and not t.truncated and t.terminated
    assert len(t.turns) == TURNS and t.info["report"]["status"] == "resolved"
    assert summary["tokens_generated"] >= 20_000, summary["tokens_generated"]  # about 25k, from usage
    assert sum(turn.completion_tokens for turn in t.turns) == summary["tokens_generated"]
    assert all("max_tokens" not in r and "max_completion_tokens" not in r for r in run["requests"])  # no cap sent
    tool_outputs = [len(m.get("content") or "") for m in t.messages if m["role"] == "tool"]
    assert sum(n >= 5000 for n in tool_outputs) >= 5, tool_outputs  # long outputs (cat of real sources)
    # the fake server counts a byte a token and checks no context; at ~4 characters a token (an estimate, not
    # a check of a real tokenizer) the last request's transcript fits the 64k the endpoint reports
    assert t.turns[-1].prompt_tokens / 4 < CONTEXT, t.turns[-1].prompt_tokens
    assert changed_lines(t.info["patch"]) == changed_lines(instance["row"]["patch"])  # the gold change
    assert run["preds"][ONE]["model_patch"] == t.info["patch"] and run["preds"][ONE]["exit_status"] == "submitted"
    assert run["report"]["resolved_ids"] == [ONE] and run["traj"]["exit_status"] == "submitted"
    print(f"\nno budget flags: {run['wall_s']:.1f}s, {len(t.turns)} turns, {summary['tokens_generated']} completion "
          f"tokens, {sum(tool_outputs)} characters of tool output")


@pytest.mark.docker
@pytest.mark.part("sao-eval", "docker", "swebench")
def test_max_turns_10_grades_the_diff_at_the_cut(instance, tmp_path):
    run = sao_eval(instance, tmp_path / "out", "--max-turns", "10")
    t, summary = run["t"], run["summary"]
    assert len(t.turns) == 10 and t.truncated and t.terminated  # cut, then graded: the reward is final
    assert t.info["exit_status"] == t.info["truncated_by"] == "max_turns"
    assert changed_lines(t.info["patch"]) == changed_lines(instance["row"]["patch"])  # the diff at the cut
    assert t.info["report"]["status"] == "resolved" and t.correct and t.reward == 1.0  # its tests ran on it
    assert summary["exit_status"] == {"max_turns": 1} and summary["n_truncated"] == 1 and summary["resolved"] == 1
    assert run["preds"][ONE] == {"instance_id": ONE, "model_name_or_path": "org/hosted-64k",
                                 "model_patch": t.info["patch"], "exit_status": "max_turns"}
    assert run["report"]["resolved_ids"] == [ONE] and run["traj"]["exit_status"] == "max_turns"
    warning = " ".join(run["stderr"].split())
    assert "1 of 1 episodes (100%) were cut by a limit" in warning and "--max-turns" in warning, warning[-2000:]
    print(f"\n--max-turns 10: {run['wall_s']:.1f}s")


@pytest.mark.docker
@pytest.mark.part("sao-eval", "docker", "swebench")
def test_max_turns_10_without_autosubmit_predicts_an_empty_patch(instance, tmp_path):
    run = sao_eval(instance, tmp_path / "out", "--max-turns", "10", "--no-autosubmit")
    t, summary = run["t"], run["summary"]
    assert len(t.turns) == 10 and t.info["exit_status"] == "max_turns" and t.reward == 0.0 and not t.correct
    assert t.info["patch"] == "" and t.info["report"]["status"] == "empty_patch"
    assert changed_lines(t.info["unsubmitted_patch"]) == changed_lines(instance["row"]["patch"])  # kept, not graded
    assert summary["autosubmit"] is False and summary["resolved"] == 0 and summary["pass@k"]["1"] == 0.0
    assert run["preds"][ONE]["model_patch"] == "" and run["preds"][ONE]["exit_status"] == "max_turns"
    assert run["report"]["empty_patch_ids"] == [ONE]
    assert "--no-autosubmit" in " ".join(run["stderr"].split())
    print(f"\n--max-turns 10 --no-autosubmit: {run['wall_s']:.1f}s")
