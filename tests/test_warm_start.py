"""The warm start from demonstrations (``algo=sft``), with scripted parts: the demonstrator's episodes are the
agent loop's own tokens, a tool call and the answer in separate turns, rewarded 1, on training problems only;
the cross-entropy counts action tokens only; the stop rule; a whole run with a tiny policy that stops on
patience and hands its best model over. The real vLLM + SmolLM2 run is tests/test_warm_start_vllm.py."""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from sao.agents import ByteTokenizer, ChatRenderer, EpisodeRunner, LoopConfig, OpenAICompletionClient
from sao.agents.clients.scripted import ScriptedClient
from sao.agents.testing.fake_server import FakeServer, Reply
from sao.envs.arithmetic import in_test_split
from sao.rl.algos import SFT, make_algorithm
from sao.rl.config import ConfigError, validate
from sao.rl.learner import Learner, collate
from sao.rl.learner.learner import token_logprobs
from sao.rl.objectives import cross_entropy_loss
from sao.rl.prompts.tasks import TaskStream
from sao.rl.training.build import heldout_eval, learner_config, make_learner
from sao.rl.training.early_stop import CurvePoint, EarlyStop, Patience
from sao.rl.training.heldout import distinct_tasks
from sao.rl.training.trainer import Trainer
from sao.rl.warm_start import DemonstrationSource, arithmetic_tool
from sao.rl.weights.sync import WeightSync
from test_train import FAST, FakeEngine, composed, lines, tiny_policy

TOOL_ENV = {"seed": 0, "difficulty": 1.0, "ops": "*", "max_digits": 3, "tools": "python", "split": "train"}


def renderer_for(tools):  # type: ignore[no-untyped-def]
    return ChatRenderer(ByteTokenizer(), tools)


def runner(env_kwargs: dict = TOOL_ENV) -> EpisodeRunner:
    return EpisodeRunner("arithmetic", renderer_for, LoopConfig(max_turns=3, max_tokens=192, max_model_len=1024,
                                                                temperature=0.0), env_kwargs)


def play(client, task_ids, env_kwargs: dict = TOOL_ENV):  # type: ignore[no-untyped-def]
    async def all_():  # type: ignore[no-untyped-def]
        return await asyncio.gather(*(runner(env_kwargs)(client, task_id=t) for t in task_ids))
    return asyncio.run(all_())


# --------------------------------------------------------------------------- the demonstrator


def test_a_demonstration_is_the_loops_own_tokens_with_the_call_and_the_answer_in_separate_turns() -> None:
    """The scripted client and a model server answering the same text give the same episode, token for token:
    the loop rendered the prompt and bridged the tool's output itself; the environment ran the tool and
    graded the answer read off its output."""
    ids = TaskStream("arithmetic", TOOL_ENV, 0).take(3)
    scripted = play(ScriptedClient(ByteTokenizer(), arithmetic_tool), [r.task_id for r in ids])
    with FakeServer(responder=lambda request, prompt: Reply(text=arithmetic_tool(prompt), logprob=0.0)) as server:
        served = play(OpenAICompletionClient(server.base_url, "fake", timeout_s=10, retry=FAST), [r.task_id for r in ids])
    for a, b in zip(scripted, served, strict=True):
        assert (a.token_ids, a.action_mask, a.logprobs) == (b.token_ids, b.action_mask, b.logprobs)
        assert a.status == "ok" and a.reward == 1.0 and a.info["correct"] and len(a.turns) == 2
        call, answer = [m for m in a.messages if m["role"] == "assistant"]
        code = json.loads(call["tool_calls"][0]["function"]["arguments"])["code"]
        x, y = a.messages[0]["content"].split("?")[0].removeprefix("What is ").split(" * ")
        assert code == f"print({x} * {y})" and "\\boxed" not in call["content"]
        assert "tool_calls" not in answer and answer["content"] == f"The answer is \\boxed{{{int(x) * int(y)}}}."
        tool = next(m for m in a.messages if m["role"] == "tool")
        assert tool["content"].strip() == str(int(x) * int(y))  # the sandbox really ran it
        # the tool's output lies between the two turns' action tokens, masked out
        first, second = a.turns
        between = a.action_mask[first.prompt_len + first.completion_len:second.prompt_len]
        assert between and set(between) == {0} and str(int(x) * int(y)).encode() in bytes(
            t for t in a.token_ids[first.prompt_len + first.completion_len:second.prompt_len] if t < 256)


def test_the_demonstrator_answers_from_the_tools_output_not_from_the_reference() -> None:
    prompt = ("<|im_start|>system\n<tool_call>\n{...}\n</tool_call><|im_end|>\n<|im_start|>user\nWhat is 12 * 34?"
              "<|im_end|>\n<|im_start|>assistant\n")
    assert '"print(12 * 34)"' in arithmetic_tool(prompt)  # the instructions' own </tool_call> is not a call
    after = prompt + '<tool_call>\n{}\n</tool_call><|im_end|>\n<|im_start|>tool\n999\n<|im_end|>\n<|im_start|>assistant\n'
    assert arithmetic_tool(after) == "The answer is \\boxed{999}."
    assert arithmetic_tool(after.replace("999", "Traceback")) == "The tool printed no number."


def test_demonstrations_hold_no_heldout_problem_and_only_solved_episodes_are_trained_on() -> None:
    """1-digit products: 90 problems, so a stream that ignored the split would draw held-out ones at once."""
    train = {**TOOL_ENV, "max_digits": 1}
    heldout = {**train, "split": "test"}
    held_problems = {task_problem(t, heldout) for t in distinct_tasks("arithmetic", heldout, 1000)}
    assert len(held_problems) >= 10
    recorded = []
    source = DemonstrationSource(runner(train), ScriptedClient(ByteTokenizer(), arithmetic_tool),
                                 TaskStream("arithmetic", train, 0))
    source.on_trajectory = recorded.append
    batches = [asyncio.run(source.next_batch(12, v)) for v in (0, 1, 2)]
    demos = [t for b in batches for t in b.trajectories]
    assert len(demos) == 36 and all(t.reward == 1.0 and t.status == "ok" for t in demos)
    assert {t.episode_id for t in recorded} >= {t.episode_id for t in demos}
    problems = {t.messages[0]["content"].split("\n")[0] for t in recorded}
    assert not problems & held_problems and not any(in_test_split(p) for p in problems)
    assert all(t.task_id.endswith("-train") for t in recorded)
    m = batches[0].metrics
    assert m["demo/tool_calls_mean"] == m["rollout/tool_calls_mean"] == 1.0 and m["rollout/turns_mean"] == 2.0


def task_problem(task_id: str, kwargs: dict) -> str:
    from sao.envs import make

    env = make("arithmetic", **kwargs)
    try:
        return env.unwrapped.tasks.get(task_id).problem
    finally:
        env.close()


def test_a_demonstrator_that_fails_every_task_stops_the_run_with_the_cause() -> None:
    from sao.rl.errors import TrainError

    source = DemonstrationSource(runner(), ScriptedClient(ByteTokenizer(), lambda prompt: "\\boxed{0}"),
                                 TaskStream("arithmetic", TOOL_ENV, 0))
    with pytest.raises(TrainError, match="solved 0 of"):
        asyncio.run(source.next_batch(2, 0))


# --------------------------------------------------------------------------- the loss


def test_cross_entropy_counts_action_tokens_only() -> None:
    # logp = [0, -1, -2, -3, -4], action tokens at 1 and 3: loss = (1 + 3) / 2 = 2.0; the prompt (0),
    # the tool's output (2) and padding (4) count neither in the sum nor in N
    logp = torch.tensor([[0.0, -1.0, -2.0, -3.0, -4.0]], requires_grad=True)
    mask = torch.tensor([[0, 1, 0, 1, 0]])
    loss, metrics = cross_entropy_loss(logp, mask)
    assert loss.item() == pytest.approx(2.0) and metrics["sft/nll"] == pytest.approx(2.0)
    loss.backward()
    assert logp.grad.tolist() == [[0.0, -0.5, 0.0, -0.5, 0.0]]  # d/dlogp of -(l1 + l3) / 2
    # micro-batching: the full batch's normalizer (4 action tokens) over two halves sums to the whole
    a, _ = cross_entropy_loss(logp.detach()[:, :3], mask[:, :3], normalizer=4.0)
    assert a.item() == pytest.approx(0.25)  # -(-1) / 4


def test_sfts_policy_step_is_the_mean_nll_of_the_demonstrated_action_tokens() -> None:
    ids = TaskStream("arithmetic", TOOL_ENV, 0).take(2)
    demos = play(ScriptedClient(ByteTokenizer(), arithmetic_tool), [r.task_id for r in ids])
    batch = collate(demos, 257)
    policy = tiny_policy()
    with torch.no_grad():
        logp = token_logprobs(policy, batch.input_ids, batch.attention_mask)
    act = batch.action_mask.bool()
    expected = float(-logp[act].mean())
    learner = Learner(policy, learner_config(composed("algo=sft", "optim.token_budget=null")))
    metrics = SFT().update(learner, batch)
    assert metrics["loss/policy"] == pytest.approx(expected, rel=1e-4)
    assert metrics["policy/action_tokens"] == int(act.sum()) < int(batch.attention_mask.sum())


# --------------------------------------------------------------------------- the stop rule


def test_patience_stops_after_that_many_evaluations_without_a_new_best() -> None:
    rule = Patience(3)
    seen = [rule.observe(CurvePoint(s, a, a, a)) for s, a in enumerate([0.0, 0.1, 0.3, 0.3, 0.2, 0.25])]
    # new bests at 0.0, 0.1, 0.3; the second 0.3 is not a rise (waited 1), then 0.2 (2), 0.25 (3): stop
    assert seen == [True, True, True, False, False, False] and rule.stop
    s = rule.summary()
    assert (s["best_step"], s["best_accuracy"], s["in_band"], len(s["curve"])) == (2, 0.3, True, 6)
    low = Patience(1)
    low.observe(CurvePoint(0, 0.05, 0, 0.1))
    assert not low.stop and low.summary()["in_band"] is False
    # a curve that has not risen above its first evaluation has not stopped rising: no count, no stop
    flat = Patience(2)
    assert [flat.observe(CurvePoint(s, a, a, a)) for s, a in enumerate([0.0, 0.0, 0.0, 0.0])] == [True] + [False] * 3
    assert not flat.stop and flat.waited == 0 and not flat.risen
    assert flat.observe(CurvePoint(4, 0.3, 0.3, 0.3)) and flat.risen  # the rise; then 2 without a new best: stop
    assert [flat.observe(CurvePoint(s, 0.2, 0.2, 0.2)) for s in (5, 6)] == [False, False] and flat.stop
    assert flat.summary()["best_step"] == 4
    with pytest.raises(ValueError):
        Patience(0)


def test_sft_configs_check_their_parts() -> None:
    cfg = composed("algo=sft", "env=arithmetic-tool", "eval.every=2", "eval.patience=2")
    validate(cfg)
    assert (cfg.algo.name, cfg.algo.loss, cfg.env.max_turns, cfg.env.kwargs["tools"]) == ("sft", "ce", 3, "python")
    assert cfg.env.kwargs["split"] == "train" and cfg.env.heldout_kwargs == {"split": "test"}
    assert isinstance(make_algorithm(cfg.algo), SFT)
    with pytest.raises(ConfigError, match="eval.patience"):
        validate(composed("algo=sft", "eval.every=0", "eval.patience=2"))
    with pytest.raises(ConfigError, match="rollout=sync"):
        validate(composed("algo=sft", "rollout=async"))
    with pytest.raises(ConfigError, match="cross-entropy"):
        composed("algo=sft", "algo.loss=dis")


# --------------------------------------------------------------------------- a whole run, and the hand-over


def sft_trainer(tmp_path: Path, server: FakeServer, patience: int, max_steps: int) -> Trainer:
    cfg = composed("algo=sft", "env=arithmetic-tool", f"max_steps={max_steps}", "batch_size=2", "checkpoint_every=1",
                   "optim.lr=1e-3", "eval.every=1", f"eval.patience={patience}", "eval.problems=4",
                   "engine.probe=false", "logger=[]", "logger.console=false")
    cfg = replace(cfg, output_dir=str(tmp_path))
    validate(cfg)
    learner = Learner(tiny_policy(), learner_config(cfg))
    engine = FakeEngine()
    source = DemonstrationSource(runner(cfg.env.kwargs), ScriptedClient(ByteTokenizer(), arithmetic_tool),
                                 TaskStream("arithmetic", cfg.env.kwargs, cfg.seed))
    client = OpenAICompletionClient(server.base_url, "fake", timeout_s=10, retry=FAST)
    return Trainer(cfg, tmp_path, learner=learner, algo=make_algorithm(cfg.algo), source=source,
                   weight_sync=WeightSync(engine, tmp_path / "weights", model_name="fake"),  # type: ignore[arg-type]
                   pad_id=257, heldout=heldout_eval(cfg, "arithmetic", client, renderer_for, tmp_path),
                   early_stop=EarlyStop(patience, tmp_path, tmp_path / "no-tokenizer"))


def test_an_sft_run_that_never_rises_runs_its_budget_keeps_its_best_model_and_hands_it_over(tmp_path: Path) -> None:
    """The engine's held-out answers never improve (always wrong): the curve never rises above its first
    evaluation, so patience 2 never counts and the run goes to its budget, 3 steps; the best evaluation is
    step 0's, whose policy (the untrained one) is in best_model, which sao-train's model loading
    (model.name=PATH) takes as it is."""
    from sao.agents.models import ensure_model

    with FakeServer(responder=lambda request, prompt: Reply(text="\\boxed{-1}")) as server:
        trainer = sft_trainer(tmp_path, server, patience=2, max_steps=3)
        initial = {k: v.clone() for k, v in trainer.learner.policy.state_dict().items()}
        asyncio.run(trainer.run())
    rows = lines(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2, 3] and trainer.state.step == 3
    assert all(math.isfinite(r["loss/policy"]) and r["sft/nll"] > 0 for r in rows[1:])
    assert rows[2]["sft/nll"] < rows[1]["sft/nll"]  # it learns the demonstrations
    curve = json.loads((tmp_path / "curve.json").read_text())
    assert [p["step"] for p in curve["curve"]] == [0, 1, 2, 3] and not curve["stopped"] and curve["best_step"] == 0
    assert curve["in_band"] is False and curve["best_accuracy"] == 0.0
    demos = lines(tmp_path / "trajectories.jsonl")
    assert len(demos) == 6 and all(d["reward"] == 1.0 and len(d["turns"]) == 2 for d in demos)  # 3 steps x 2
    best = tmp_path / "best_model"
    assert ensure_model(str(best)) == str(best.absolute())
    cfg = composed("algo=sao", f"model.name={best}")
    handed = make_learner(cfg, ensure_model(cfg.model.name), uses_critic=True)
    for name, tensor in handed.policy.state_dict().items():
        assert torch.equal(tensor, initial[name]), name
    assert handed.value_model is not None  # RL's critic starts from the warm-started weights too


def test_the_best_model_is_the_policy_of_the_best_evaluation(tmp_path: Path) -> None:
    """The engine answers right during step 1's evaluation only: the curve is 0, 1, 0, the best is step 1's,
    best_model holds the policy as it was then, and patience 1 stops the run after step 2."""
    from transformers import AutoModelForCausalLM

    seen: dict = {"step": -1}

    def responder(request, prompt):  # type: ignore[no-untyped-def]
        return Reply(text=arithmetic_tool(prompt) if seen["step"] == 1 else "\\boxed{-1}")

    with FakeServer(responder=responder) as server:
        trainer = sft_trainer(tmp_path, server, patience=1, max_steps=4)
        heldout = trainer.heldout
        evaluate = heldout.run

        async def run(step: int):  # type: ignore[no-untyped-def]
            seen["step"] = step
            if step == 1:
                seen["policy"] = {k: v.clone() for k, v in trainer.learner.policy.state_dict().items()}
            return await evaluate(step)

        heldout.run = run  # type: ignore[method-assign]
        asyncio.run(trainer.run())
    curve = json.loads((tmp_path / "curve.json").read_text())
    assert [p["accuracy"] for p in curve["curve"]] == [0.0, 1.0, 0.0]
    assert (curve["best_step"], curve["stopped"], curve["in_band"]) == (1, True, False)
    best = AutoModelForCausalLM.from_pretrained(tmp_path / "best_model", dtype=torch.float32).state_dict()
    assert all(torch.equal(best[k], v) for k, v in seen["policy"].items() if k in best)
    assert not all(torch.equal(best[k], v) for k, v in trainer.learner.policy.state_dict().items() if k in best)


def test_a_resumed_sft_run_replays_its_curve(tmp_path: Path) -> None:
    """Right during step 1's evaluation only (the rise), then wrong: the resumed run replays 0, 1 from
    eval.jsonl, so 2 evaluations without a new best stop it at step 3 with step 1 the best. Without the
    replay it would never have seen a rise, and would run to step 5."""
    seen = {"step": -1}

    def responder(request, prompt):  # type: ignore[no-untyped-def]
        return Reply(text=arithmetic_tool(prompt) if seen["step"] == 1 else "\\boxed{-1}")

    def observed(trainer: Trainer) -> Trainer:
        evaluate = trainer.heldout.run

        async def run(step: int):  # type: ignore[no-untyped-def]
            seen["step"] = step
            return await evaluate(step)

        trainer.heldout.run = run  # type: ignore[method-assign]
        return trainer

    with FakeServer(responder=responder) as server:
        asyncio.run(observed(sft_trainer(tmp_path, server, patience=2, max_steps=1)).run())
        trainer = observed(sft_trainer(tmp_path, server, patience=2, max_steps=5))
        trainer.cfg = replace(trainer.cfg, resume=True)
        asyncio.run(trainer.run())
    curve = json.loads((tmp_path / "curve.json").read_text())
    assert [p["accuracy"] for p in curve["curve"]] == [0.0, 1.0, 0.0, 0.0]
    assert curve["stopped"] and curve["best_step"] == 1
