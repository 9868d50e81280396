"""evals/players.py: which player an evaluation gets, and that its clients close when the episodes end
(the runs through sao-eval are in test_eval_reliability.py, test_chat_mode.py and test_routing_client.py)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from sao.agents import OpenAIChatClient
from sao.agents.clients import Endpoint
from sao.agents.loop import opened
from sao.evals.players import Player
from sao.evals.runner import EvalConfig, EvalError


def test_a_scripted_agent_plays_without_a_client_and_serving_yields_no_watch(tmp_path: Path):
    player = Player(EvalConfig("arithmetic", tmp_path, agent="gold"), "arithmetic", [], {})
    assert player.client is None and player.runner is None and player.predictions is None

    async def go():  # type: ignore[no-untyped-def]
        async with player.serving() as watch, opened("arithmetic", {}) as env:
            assert watch is None
            task_id = env.unwrapped.task_ids(1)[0]
            return await player.play(env, task_id, 0, seed=7)

    trajectory = asyncio.run(go())
    assert trajectory.status == "ok" and trajectory.correct and trajectory.seed == 7
    assert player.routing_summary() == {}


def test_a_chat_endpoint_gets_the_text_loop_client_closed_at_the_end(tmp_path: Path):
    cfg = EvalConfig("arithmetic", tmp_path, base_url="http://127.0.0.1:9/v1", endpoint_mode="chat")
    player = Player(cfg, "arithmetic", [Endpoint("http://127.0.0.1:9/v1", "m", None, 4096, mode="chat")], {})
    assert isinstance(player.client, OpenAIChatClient) and player.runner is None
    closed: list[bool] = []
    real_close = player.client.aclose

    async def aclose() -> None:
        closed.append(True)
        await real_close()

    player.client.aclose = aclose  # type: ignore[method-assign]

    async def go() -> None:
        async with player.serving() as watch:
            assert watch is None  # an external endpoint: nothing to restart
            raise RuntimeError("the episodes failed")

    with pytest.raises(RuntimeError):
        asyncio.run(go())
    assert closed == [True]


def test_grade_only_reads_the_predictions_and_refuses_a_bad_file(tmp_path: Path):
    preds = tmp_path / "preds.jsonl"
    preds.write_text(json.dumps({"instance_id": "a", "model_patch": None}) + "\n")
    player = Player(EvalConfig("swe-local", tmp_path, grade_only=str(preds)), "swe-local", [], {})
    assert player.predictions == {"a": ""}
    preds.write_text(json.dumps({"instance_id": "a"}) + "\n")
    with pytest.raises(EvalError, match="'model_patch' is missing"):
        Player(EvalConfig("swe-local", tmp_path, grade_only=str(preds)), "swe-local", [], {})
