"""``python -m sao.rl.weights.export MODEL OUT [--dtype float32]``: the model folder an external vLLM must be
started from for ``sao-train engine.base_url=...`` (its LM head untied, so that weight syncs reach it:
:func:`sao.rl.weights.sync.export_engine_model`). ``MODEL`` is a folder, a Hugging Face id, or an alias that
``sao-model`` knows; ``--dtype`` is the ``model.engine_dtype`` the run will use."""

from __future__ import annotations

import argparse
from pathlib import Path


def export_model(model: str, out: Path, dtype: str = "float32") -> Path:
    """Write (once) the untied ``dtype`` copy of ``model`` into ``out`` and return ``out``."""
    import torch
    from transformers import AutoModelForCausalLM

    from sao.agents.models.prepare import ensure_model
    from sao.rl.weights.sync import export_engine_model

    path = ensure_model(model)
    policy = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return export_engine_model(policy, Path(path), Path(out), dtype=getattr(torch, dtype))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sao.rl.weights.export", description=__doc__)
    p.add_argument("model")
    p.add_argument("out", type=Path)
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    return p


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    print(export_model(args.model, args.out, args.dtype))


if __name__ == "__main__":
    main()
