"""A tiny random Llama for the learner, LoRA and sync unit tests (one definition for all of them)."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def tiny_llama(seed: int = 0, *, vocab: int = 64, tie: bool = False, max_positions: int = 128) -> LlamaForCausalLM:
    """2 layers, hidden 32, fp32, in eval mode (dropout is 0 anyway), seeded by ``seed``."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_positions,
                         tie_word_embeddings=tie)
    return LlamaForCausalLM(config).float().eval()
