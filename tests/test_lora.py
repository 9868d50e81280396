"""LoRA (``model.lora``, sao.rl.learner.lora) on a tiny random Llama (hidden 32, 2 layers, vocab 64, tied
embeddings): the merged weights the engine gets, what trains, the checkpoint round trip, the seams
the learner uses; and one real ``sao-train model.lora.rank=8`` run on the session's vLLM."""

from __future__ import annotations

import copy
import json
import math
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from sao.agents.records import Trajectory
from sao.rl.algos import make_algorithm
from sao.rl.config import ConfigError, LoraConfig, ModelConfig, ReinforceMeanConfig, SAOConfig, TrainConfig, validate
from sao.rl.learner.batch import collate
from sao.rl.learner.learner import Learner, LearnerConfig, token_logprobs
from sao.rl.learner.lora import merged_state_dict, unwrap, wrap_policy, wrap_value
from sao.rl.learner.value_model import ValueModel, attention_param_names, backbone_of
from sao.rl.training.checkpoint import Checkpointer, TrainState
from sao.rl.weights.sync import WEIGHTS_FILE, WeightSync, save_checkpoint

from transformers import LlamaForCausalLM

from tests.tiny_models import tiny_llama as _tiny

VOCAB = 64
LORA = LoraConfig(rank=4, alpha=8.0)
CRITIC = replace(LORA, critic=True)


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models (tests/conftest.py)


def tiny_llama(seed: int = 0):  # type: ignore[no-untyped-def]
    return _tiny(seed, vocab=VOCAB, tie=True)  # tied: the SmolLM2 case the merge must handle


def kick_adapters(model: torch.nn.Module, seed: int = 1, scale: float = 0.05) -> None:
    """Give every adapter nonzero weights (peft starts lora_B at 0, a delta of 0)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(scale * torch.randn(p.shape, generator=g))


def lora_policy(seed: int = 0, kick: bool = True) -> torch.nn.Module:
    policy = wrap_policy(tiny_llama(seed), LORA)
    if kick:
        kick_adapters(policy)
    return policy


def ids(seed: int = 3, n: int = 12) -> torch.Tensor:
    return torch.randint(1, VOCAB, (2, n), generator=torch.Generator().manual_seed(seed))


def batch():
    g = torch.Generator().manual_seed(5)
    rows = []
    for i, n in enumerate((9, 12)):
        mask = [0, 0, 0] + [1] * (n - 3)
        rows.append(Trajectory(episode_id=f"e{i}", env="sao/Test-v0", task_id=f"t{i}", sample=0, seed=None,
                               token_ids=tuple(torch.randint(1, VOCAB, (n,), generator=g).tolist()),
                               action_mask=tuple(mask), logprobs=tuple(-4.0 if m else 0.0 for m in mask),
                               turns=(), messages=(), reward=float(i), terminated=True, truncated=False, status="ok"))
    return collate(rows, pad_id=0)


def on_policy(b, model):
    with torch.no_grad():
        logp = token_logprobs(model, b.input_ids, b.attention_mask)
    return replace(b, rollout_logprobs=logp * b.action_mask)


def trainable(model: torch.nn.Module) -> set[str]:
    return {n for n, p in model.named_parameters() if p.requires_grad}


# ---- merged weights --------------------------------------------------------------------------------

@pytest.mark.part("peft")
def test_merged_weights_equal_peft_merge_and_unload_and_leave_the_model_alone() -> None:
    policy = lora_policy()
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    x = ids()
    logits_before = policy(input_ids=x).logits

    merged = merged_state_dict(policy)
    reference = copy.deepcopy(policy).merge_and_unload().state_dict()
    assert set(merged) == set(reference) == set(tiny_llama().state_dict())  # the plain HF names
    for name, tensor in reference.items():
        assert torch.allclose(merged[name], tensor, atol=1e-6, rtol=0), name
    assert not torch.equal(merged["model.layers.0.self_attn.q_proj.weight"],
                           before["base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight"])
    # untouched tensors are the model's own: the tied head is still the embedding
    assert merged["lm_head.weight"].data_ptr() == merged["model.embed_tokens.weight"].data_ptr()

    after = policy.state_dict()
    assert set(after) == set(before) and all(torch.equal(after[k], before[k]) for k in before)
    assert torch.equal(policy(input_ids=x).logits, logits_before)


def test_save_checkpoint_writes_the_merged_plain_model_that_transformers_loads(tmp_path: Path) -> None:
    policy = lora_policy()
    folder = save_checkpoint(policy, tmp_path, 1, dtype=torch.float32)
    saved = load_file(str(folder / WEIGHTS_FILE))
    assert not any("lora_" in k or "base_layer" in k for k in saved)
    # served untied (sao.rl.weights.sync module doc): the head is its own tensor, equal to the embedding
    assert torch.equal(saved["lm_head.weight"], saved["model.embed_tokens.weight"])
    config = json.loads((folder / "config.json").read_text())
    assert not config["tie_word_embeddings"] and config["dtype"] == "float32"
    plain = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    x = ids()
    with torch.no_grad():
        assert torch.allclose(plain(input_ids=x).logits, policy(input_ids=x).logits, atol=1e-5)


def test_probe_rounds_the_merged_weights_as_the_engine_does(tmp_path: Path) -> None:
    """learner_logprobs(round_to=bf16) on a LoRA policy = the plain model the engine loads (bf16 on disk)."""
    policy = lora_policy()
    folder = save_checkpoint(policy, tmp_path, 1, dtype=torch.bfloat16)
    engine_side = LlamaForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).float().eval()
    sync = WeightSync(engine=None, root=tmp_path, model_name="m", probe_ids=ids()[0].tolist())  # type: ignore[arg-type]
    probe = torch.tensor([sync.probe_ids])
    expected = token_logprobs(engine_side, probe, torch.ones_like(probe))[0, 1:]
    rounded = torch.tensor(sync.learner_logprobs(policy, round_to=torch.bfloat16))
    assert torch.allclose(rounded, expected, atol=1e-5)
    full = torch.tensor(sync.learner_logprobs(policy))  # and the model is put back afterwards
    with torch.no_grad():
        assert torch.allclose(full, token_logprobs(policy, probe, torch.ones_like(probe))[0, 1:], atol=0)
    assert trainable(policy) == {n for n, _ in policy.named_parameters() if "lora_" in n}


# ---- what trains -----------------------------------------------------------------------------------

@pytest.mark.part("peft")
def test_only_the_policy_adapters_train_and_the_optimizer_holds_state_for_them_only() -> None:
    policy = lora_policy(kick=False)
    names = trainable(policy)
    assert names and all(".lora_A." in n or ".lora_B." in n for n in names)
    adapted = {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in names}
    assert adapted == set(LORA.target_modules)
    learner = Learner(policy, LearnerConfig(lr=1e-2))
    frozen_before = {n: p.detach().clone() for n, p in policy.named_parameters() if not p.requires_grad}
    make_algorithm(ReinforceMeanConfig()).update(learner, on_policy(batch(), policy))
    state = learner.policy_optimizer.state
    assert len(state) == len(names)  # AdamW state (exp_avg, exp_avg_sq) for the adapters only
    assert {id(p) for p in state} == {id(p) for p in policy.parameters() if p.requires_grad}
    assert all(torch.equal(p, frozen_before[n]) for n, p in policy.named_parameters() if not p.requires_grad)
    assert any(float(p.detach().abs().max()) > 0 for n, p in policy.named_parameters() if ".lora_B." in n)  # B moved off 0


def test_backbone_of_and_token_logprobs_see_the_adapted_policy() -> None:
    policy = lora_policy()
    trunk = backbone_of(policy)
    assert trunk is unwrap(policy).model and type(trunk).__name__ == "LlamaModel"
    assert policy.get_output_embeddings() is unwrap(policy).lm_head
    x = ids()
    mask = torch.ones_like(x)
    with torch.no_grad():
        naive = torch.log_softmax(policy(input_ids=x).logits.float(), -1)[:, :-1].gather(-1, x[:, 1:, None])[..., 0]
        plain = token_logprobs(tiny_llama(), x, mask)
    logp = token_logprobs(policy, x, mask)
    assert torch.allclose(logp[:, 1:], naive, atol=1e-5)
    assert not torch.allclose(logp, plain, atol=1e-4)  # the adapters count


def test_value_from_a_lora_policy_is_a_plain_merged_trunk() -> None:
    policy = lora_policy()
    value = ValueModel.from_policy(policy)
    assert not any("lora_" in n or "base_layer" in n for n, _ in value.named_parameters())
    assert all(p.requires_grad for p in value.parameters())
    x = ids()
    with torch.no_grad():
        expected = backbone_of(policy)(input_ids=x).last_hidden_state
        assert torch.allclose(value.backbone(input_ids=x).last_hidden_state, expected, atol=1e-5)
    assert trainable(policy) == {n for n, _ in policy.named_parameters() if "lora_" in n}  # policy untouched


def test_lora_critic_trains_mlp_adapters_norms_and_head_only() -> None:
    policy = lora_policy()
    value = ValueModel.from_policy(policy)
    targets = wrap_value(value, CRITIC)
    assert targets and all(".mlp." in t for t in targets)
    names = trainable(value)
    attention = set(attention_param_names(value.backbone))
    for n, _ in value.named_parameters():
        leaf_owner = n.rsplit(".", 1)[0]
        expected = n.startswith("head.") or "norm" in leaf_owner or (".mlp." in n and ".lora_" in n)
        assert (n in names) == expected, n
    assert attention and not {f"backbone.{a}" for a in attention} & names  # attention frozen, no adapters on it
    assert not any("lora_" in a for a in attention)
    learner = Learner(policy, LearnerConfig(lr=1e-3), value_model=value)  # freezes attention: already frozen
    assert trainable(value) == names
    make_algorithm(SAOConfig()).update(learner, on_policy(batch(), policy))
    assert len(learner.value_optimizer.state) == len(names)


def test_a_critic_without_mlp_targets_is_refused() -> None:
    value = ValueModel.from_policy(tiny_llama())
    with pytest.raises(ValueError, match="MLP module"):
        wrap_value(value, replace(CRITIC, target_modules=["q_proj", "v_proj"]))
    with pytest.raises(ValueError, match="tied"):
        wrap_policy(tiny_llama(), replace(LORA, target_modules=["embed_tokens", "q_proj"]))


# ---- checkpoints -------------------------------------------------------------------------------------

def lora_learner(seed: int) -> Learner:
    policy = wrap_policy(tiny_llama(0), LORA)
    kick_adapters(policy, seed=seed)  # a different start for each learner, to see the load restore it
    value = ValueModel.from_policy(policy)
    wrap_value(value, CRITIC)
    return Learner(policy, LearnerConfig(lr=1e-2, value_warmup_steps=0), value_model=value)


def step(learner: Learner, b) -> None:
    make_algorithm(SAOConfig()).update(learner, b)  # critic steps, then one policy step


def test_checkpoint_round_trip_restores_adapters_and_optimizer_state_exactly(tmp_path: Path) -> None:
    b = on_policy(batch(), lora_learner(1).policy)
    a = lora_learner(1)
    step(a, b)
    ck = Checkpointer(tmp_path / "ck", keep=1)
    folder = ck.save(a, TrainState(1, 1, 0, {}, {}))

    other = lora_learner(7)
    Checkpointer.load(folder, other)
    for model_a, model_b in ((a.policy, other.policy), (a.value_model, other.value_model)):
        sa, sb = model_a.state_dict(), model_b.state_dict()
        assert set(sa) == set(sb) and all(torch.equal(sa[k], sb[k]) for k in sa)
        assert any("lora_A" in k for k in sa)
    assert len(other.policy_optimizer.state) == len(a.policy_optimizer.state) > 0
    # the next step is the same step: adapters, Adam moments and step counts all came back
    step(a, b)
    step(other, b)
    for n, p in a.policy.named_parameters():
        assert torch.equal(p, dict(other.policy.named_parameters())[n]), n
    for n, p in a.value_model.named_parameters():
        assert torch.equal(p, dict(other.value_model.named_parameters())[n]), n


def test_resuming_a_lora_checkpoint_without_lora_says_so(tmp_path: Path) -> None:
    a = lora_learner(1)
    folder = Checkpointer(tmp_path, keep=1).save(a, TrainState(0, 0, 0, {}, {}))
    plain = tiny_llama()
    with pytest.raises(ValueError, match="same model.lora"):
        Checkpointer.load(folder, Learner(plain, value_model=ValueModel.from_policy(plain)))


# ---- configuration -----------------------------------------------------------------------------------

def test_lora_config_is_typed_validated_and_overridable() -> None:
    from hydra import compose, initialize_config_module

    import sao.rl.cli.train  # noqa: F401
    from sao.rl.cli.train import to_config

    with initialize_config_module("sao.conf", version_base="1.3"):
        cfg = to_config(compose("config", overrides=["model.lora.rank=8", "model.lora.critic=true"]))
        default = to_config(compose("config"))
    assert isinstance(cfg.model.lora, LoraConfig) and cfg.model.lora.rank == 8 and cfg.model.lora.critic
    assert default.model.lora == LoraConfig()  # the yaml matches the schema's defaults: off, no dropout
    validate(cfg)
    bad = {"rank": (-1, "rank must be >= 0"), "alpha": (0.0, "alpha must be > 0"), "dropout": (1.0, "dropout")}
    for key, (value, message) in bad.items():
        with pytest.raises(ConfigError, match=message):
            validate(TrainConfig(model=ModelConfig(lora=replace(LoraConfig(rank=4), **{key: value}))))
    with pytest.raises(ConfigError, match="critic=true needs model.lora.rank"):
        validate(TrainConfig(model=ModelConfig(lora=LoraConfig(critic=True))))


# ---- the real engine -----------------------------------------------------------------------------------

LORA_LR = 2e-4  # docs/guides/train.md's recommendation; at 1e-5 a rank-8 adapter barely moves the bf16 engine


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.long
@pytest.mark.part("peft", "sao-train")
def test_sao_train_with_lora_on_the_real_engine(restore_engine, tmp_path: Path) -> None:
    """`sao-train max_steps=3 model.lora.rank=8` on the session's vLLM: three merged syncs, the
    engine serving the adapted policy (probe gap small) and its log-probs moving."""
    from conftest import engine_probe

    server = restore_engine
    base_probe = engine_probe(server)  # version 0: the prepared weights
    exe = Path(sys.executable).with_name("sao-train")
    run_dir = tmp_path / "lora"
    try:
        out = subprocess.run([str(exe), "max_steps=3", "model.lora.rank=8", f"output_dir={run_dir}", "batch_size=4",
                              "value_pretrain_steps=1", "env.max_tokens=32", "keep_checkpoints=1", "logger=quiet",
                              "eval.enabled=false", "engine.probe_every=1",
                              f"optim.lr={LORA_LR}", "optim.value_warmup_steps=0",
                              f"engine.base_url={server.root_url}", f"engine.served_name={server.model_name}"],
                             capture_output=True, text=True, timeout=900)
        assert out.returncode == 0, out.stderr[-3000:]
        rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert [r["engine/weight_version"] for r in rows] == [1, 2, 3]
        for r in rows:
            assert math.isfinite(r["loss/policy"]) and r["sync/probe_gap"] < 0.05, r
            print(f"\nlora step {r['step']}: reward {r['reward/mean']:.3f} probe logprob "
                  f"{r['sync/probe_engine_logprob']:.4f} gap {r['sync/probe_gap']:.4f} sync {r['perf/sync_s']:.2f}s "
                  f"(save {r['perf/save_s']:.2f}s reload {r['perf/reload_s']:.2f}s) update {r['perf/update_s']:.1f}s")
        base_mean = sum(base_probe) / len(base_probe)
        final = engine_probe(server)  # version 3, as the run left it
        moved = sum(abs(a - b) for a, b in zip(final, base_probe)) / len(base_probe)
        print(f"engine probe log-prob mean: v0 {base_mean:.4f}, v3 {rows[-1]['sync/probe_engine_logprob']:.4f}; "
              f"mean |moved| {moved:.4f}")
        assert abs(rows[-1]["sync/probe_engine_logprob"] - sum(final) / len(final)) < 1e-3
        assert moved > 1e-3
        saved = load_file(str(run_dir / "checkpoints" / "step_000003" / "policy.safetensors"))
        assert any(".lora_A." in k for k in saved)  # the checkpoint holds the adapters
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)
