"""Fixtures of the environment tests: a tiny model that ends its turns."""

from __future__ import annotations

import pytest
import torch


def make_eos_prone(model, tokenizer, scale: float = 2.8):
    """Point the tiny random model's output row for EOS along the mean direction of its last
    hidden states (measured on random tokens), so it samples EOS about once in 3 tokens: its
    turns end, and episodes have several turns."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        hidden = model.model(input_ids=torch.randint(0, 256, (8, 40), generator=generator)).last_hidden_state
        mean = hidden.reshape(-1, hidden.shape[-1]).mean(dim=0)
        model.lm_head.weight[tokenizer.eos_token_id] = scale * mean / mean.norm()
    return model


@pytest.fixture()
def eos_prone_tiny(tiny_model, tiny_tokenizer):
    return make_eos_prone(tiny_model, tiny_tokenizer)


@pytest.fixture(scope="session")
def eos_prone_model(tmp_path_factory):
    """`make_eos_prone`'s tiny model as a model directory (`load_causal_lm(path)`, configs)."""
    from lit_rlhf.models import load_causal_lm, load_tokenizer

    tokenizer = load_tokenizer("tiny-random-llama")
    model = make_eos_prone(load_causal_lm("tiny-random-llama", tokenizer), tokenizer)
    path = tmp_path_factory.mktemp("eos_prone_model")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
