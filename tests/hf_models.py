"""Tiny Hugging Face GPT-2 and Llama models built from their configs (nothing downloaded) and
token data for them, for tests/test_huggingface.py and tests/test_pretrained.py: importable by
``model._target_`` / ``data._target_``."""

from __future__ import annotations

import torch
from torch.utils.data import TensorDataset
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

VOCAB, CONTEXT = 32, 16


def tiny_gpt2(use_cache: bool = True, layers: int = 2, dropout: float = 0.0) -> GPT2LMHeadModel:
    """GPT-2 with two blocks of width 32; ``use_cache=True`` is GPT-2's own default."""
    config = GPT2Config(
        vocab_size=VOCAB,
        n_positions=CONTEXT,
        n_embd=32,
        n_layer=layers,
        n_head=2,
        use_cache=use_cache,
        bos_token_id=VOCAB - 1,
        eos_token_id=VOCAB - 1,
        resid_pdrop=dropout,
        embd_pdrop=dropout,
        attn_pdrop=dropout,
    )
    return GPT2LMHeadModel(config)


def tiny_llama(layers: int = 2) -> LlamaForCausalLM:
    """Llama with two blocks of width 32: 4 query heads sharing 2 key/value heads (grouped-query
    attention), rotary positions, an output layer of its own (not tied)."""
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=CONTEXT,
    )
    return LlamaForCausalLM(config)


def counting(count: int, seed: int) -> torch.Tensor:
    """``[count, CONTEXT]`` sequences that count up by one (mod VOCAB) from a random start."""
    start = torch.randint(VOCAB, (count, 1), generator=torch.Generator().manual_seed(seed))
    return (start + torch.arange(CONTEXT)) % VOCAB


def token_data(kind: str = "inputs", train_samples: int = 64, val_samples: int = 32):
    """(train, val): batches of input ids alone (``inputs``), or ``(input_ids, labels)`` with
    the labels aligned to the inputs, transformers' convention (``pairs``)."""
    train, val = counting(train_samples, 0), counting(val_samples, 1)
    if kind == "pairs":
        return TensorDataset(train, train.clone()), TensorDataset(val, val.clone())
    return TensorDataset(train), TensorDataset(val)
