"""SFT on packed batches: the loss and gradients of the padded batch (fp32, 1e-5), the token mean
under accumulation, the attention kernels that keep packed examples apart, exact resume."""

from __future__ import annotations

import random
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader
from transformers import AutoModelForCausalLM, GPTNeoXConfig, LlamaConfig, Qwen2Config

import lit_rlhf.modules.sft as sft_module
from lit_rlhf.training.memory import Memory
from lit_rlhf.data.collate import SFTCollator
from lit_rlhf.data.packing import PackedSFTCollator
from lit_rlhf.modules import SFTModule
from lit_rlhf.models.attention import SDPA_VARLEN, use_varlen_attention
from lit_rlhf.models.logprobs import per_token_logps
from lit_rlhf.models.packed import packed_token_logps, packing_supported
from lit_rlhf.types import PackedSFTBatch

TOL = dict(rtol=1e-5, atol=1e-5)


def examples(tokenizer, n=6, seed=0):
    """`n` prompt+completion examples of varied lengths (completions end with EOS)."""
    rnd = random.Random(seed)
    words = "the cat sat on a mat while dogs ran far away in green fields".split()
    out = []
    for i in range(n):
        prompt = " ".join(rnd.choices(words, k=rnd.randrange(1, 6))) + "\nTL;DR:"
        completion = " " + " ".join(rnd.choices(words, k=rnd.randrange(1, 4)))
        out.append({"_prompt_ids": tokenizer(prompt)["input_ids"],
                    "_completion_ids": tokenizer(completion)["input_ids"] + [tokenizer.eos_token_id], "_row": i})
    return out


def loss_and_grads(module, batch):
    module.zero_grad()
    nll_sum, tokens = module.nll_terms(batch)
    (nll_sum / tokens).backward()
    grads = {n: p.grad.clone() for n, p in module.policy.named_parameters() if p.grad is not None}
    return nll_sum.detach(), int(tokens), grads


@pytest.mark.parametrize("chunk_size", [None, 256, 3])
@pytest.mark.parametrize("pack_length", [None, 64])
def test_packed_loss_and_gradients_equal_the_padded(chunk_size, pack_length, monkeypatch):
    torch.manual_seed(0)
    module = SFTModule(model="tiny-random-llama", memory=Memory(logprob_chunk_size=chunk_size))
    monkeypatch.setattr(sft_module, "unpack", None)  # the packed rows themselves are scored, not unpacked
    rows = examples(module.tokenizer)
    pad = module.tokenizer.pad_token_id
    padded, packed = SFTCollator(pad)(rows), PackedSFTCollator(pad, pack_length)(rows)
    assert packed.input_ids.shape[0] < padded.input_ids.shape[0]  # it did pack
    want_sum, want_tokens, want_grads = loss_and_grads(module, padded)
    got_sum, got_tokens, got_grads = loss_and_grads(module, packed)
    assert module.policy.config._attn_implementation == SDPA_VARLEN  # switched at the first packed batch
    assert got_tokens == want_tokens
    torch.testing.assert_close(got_sum, want_sum, **TOL)
    assert got_grads.keys() == want_grads.keys() and want_grads
    for name in want_grads:
        torch.testing.assert_close(got_grads[name], want_grads[name], **TOL, msg=name)


def _tiny(config_cls, attn, **extra):
    torch.manual_seed(0)
    common = dict(vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
                  max_position_embeddings=64, attn_implementation=attn)
    if config_cls is not GPTNeoXConfig:
        common["num_key_value_heads"] = 1
    return AutoModelForCausalLM.from_config(config_cls(**common, **extra)).eval()


def test_packed_gradients_equal_the_padded_under_gradient_checkpointing(monkeypatch):
    module = SFTModule(model="tiny-random-llama", memory=Memory(gradient_checkpointing=True)).train()
    monkeypatch.setattr(sft_module, "unpack", None)
    rows = examples(module.tokenizer, n=5, seed=2)
    pad = module.tokenizer.pad_token_id
    want_sum, _, want_grads = loss_and_grads(module, SFTCollator(pad)(rows))
    got_sum, _, got_grads = loss_and_grads(module, PackedSFTCollator(pad)(rows))  # recomputed under sdpa_varlen
    assert module.policy.config._attn_implementation == SDPA_VARLEN
    torch.testing.assert_close(got_sum, want_sum, **TOL)
    for name in want_grads:
        torch.testing.assert_close(got_grads[name], want_grads[name], **TOL, msg=name)


@pytest.mark.parametrize("setting", ["lora", "bf16_autocast"])
def test_packed_equals_padded_with_lora_and_under_bf16_autocast(setting, monkeypatch):
    lora = {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]} if setting == "lora" else None
    torch.manual_seed(0)
    module = SFTModule(model="tiny-random-llama", lora=lora)
    monkeypatch.setattr(sft_module, "unpack", None)
    rows = examples(module.tokenizer, n=5, seed=3)
    pad = module.tokenizer.pad_token_id
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=setting == "bf16_autocast")
    with autocast:
        want_sum, _, want_grads = loss_and_grads(module, SFTCollator(pad)(rows))
    with autocast:
        got_sum, _, got_grads = loss_and_grads(module, PackedSFTCollator(pad)(rows))
    assert module.policy.config._attn_implementation == SDPA_VARLEN
    tol = TOL if setting == "lora" else dict(rtol=1e-2, atol=2e-3)  # bf16 matmuls: rounding differs with the layout
    torch.testing.assert_close(got_sum, want_sum, **tol)
    assert want_grads and got_grads.keys() == want_grads.keys()
    if setting == "lora":
        assert all("lora_" in name for name in want_grads)  # only the adapter trains
    for name in want_grads:
        torch.testing.assert_close(got_grads[name], want_grads[name], **tol, msg=name)


@pytest.mark.parametrize("attn", ["sdpa", "eager", SDPA_VARLEN])
@pytest.mark.parametrize("config_cls", [LlamaConfig, Qwen2Config, GPTNeoXConfig], ids=["llama", "qwen2", "gpt_neox"])
def test_architectures_keep_packed_examples_apart(config_cls, attn):
    model = _tiny(config_cls, "eager" if attn == "eager" else "sdpa")
    if attn == SDPA_VARLEN:
        assert use_varlen_attention(model)
    assert model.config._attn_implementation == attn
    assert packing_supported(model)
    seqs = [torch.randint(0, 64, (n,)) for n in (7, 3, 5)]
    ids = torch.cat(seqs)[None]
    positions = torch.cat([torch.arange(len(s)) for s in seqs])[None]
    loss_mask = torch.ones_like(ids, dtype=torch.bool)
    for chunk in (None, 4):
        got = packed_token_logps(model, ids, positions, loss_mask, chunk_size=chunk)[0]
        at = 0
        for s in seqs:
            alone = per_token_logps(model, s[None], torch.ones(1, len(s), dtype=torch.bool),
                                    torch.ones(1, len(s), dtype=torch.bool), chunk_size=chunk)[0]
            torch.testing.assert_close(got[at: at + len(s)], alone, **TOL)  # position 0 scores 0 in both
            at += len(s)


class _LeakyLM(nn.Module):
    """Each position sees the mean of every earlier embedding, whatever the position ids say."""

    def __init__(self):
        super().__init__()
        self.config = SimpleNamespace(vocab_size=11)
        self.embed = nn.Embedding(11, 4)
        self.out = nn.Linear(4, 11)

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=False, **_):
        h = self.embed(input_ids).cumsum(1) / torch.arange(1, input_ids.shape[1] + 1)[None, :, None]
        return SimpleNamespace(logits=self.out(h))


def test_a_model_that_attends_across_examples_is_refused():
    model = _LeakyLM()
    assert not packing_supported(model)
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with pytest.raises(ValueError, match="attends across packed examples"):
        packed_token_logps(model, ids, torch.tensor([[0, 1, 0, 1, 2]]), torch.ones_like(ids, dtype=torch.bool))


def test_unsupported_model_gets_the_batch_unpacked(monkeypatch):
    module = SFTModule(model="tiny-random-llama")
    rows = examples(module.tokenizer)
    pad = module.tokenizer.pad_token_id
    want = module.nll_terms(SFTCollator(pad)(rows))
    monkeypatch.setattr(sft_module, "packing_supported", lambda model: False)
    got = module.nll_terms(PackedSFTCollator(pad)(rows))
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


class _StepGrads(SFTModule):
    """Keeps the gradients the optimizer step gets (after the token-mean normalisation)."""

    def on_before_optimizer_step(self, optimizer):
        super().on_before_optimizer_step(optimizer)
        self.step_grads = {n: p.grad.clone() for n, p in self.policy.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("accumulate", [1, 2])
def test_token_mean_under_accumulation_is_unchanged(tmp_path, accumulate):
    grads = {}
    for packing in (False, True):
        L.seed_everything(0)
        module = _StepGrads(model="tiny-random-llama", lr=1e-3, lr_scheduler="constant")
        pad = module.tokenizer.pad_token_id
        collate = PackedSFTCollator(pad) if packing else SFTCollator(pad)
        # the same 8 examples per optimizer step: one batch of 8, or two of 4
        loader = DataLoader(examples(module.tokenizer, n=8, seed=1), batch_size=8 // accumulate, collate_fn=collate)
        trainer = L.Trainer(max_steps=1, accumulate_grad_batches=accumulate, accelerator="cpu", logger=False,
                            enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                            default_root_dir=tmp_path)
        trainer.fit(module, loader)
        grads[packing] = module.step_grads
    for name, want in grads[False].items():
        torch.testing.assert_close(grads[True][name], want, **TOL, msg=name)


def test_resume_is_exact_with_packing(tmp_path, monkeypatch):
    from tests.resume import test_resume as resume

    module_cls, module_args, steps, dm_cls, dm_args = resume.CASES["sft"]
    monkeypatch.setitem(resume.CASES, "sft_packed", (module_cls, module_args, steps, dm_cls, {**dm_args, "packing": True}))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # bitwise-reproducible CPU kernels, as in tests/resume
    try:
        resume.test_resume_is_exact("sft_packed", tmp_path)
        _, _, recorder, dm = resume.fit("sft_packed", tmp_path / "again")
    finally:
        torch.set_num_threads(threads)
    assert dm.batch_type() is PackedSFTBatch
    assert all(m["train/data/padding_fraction"] == 0.0 for m in recorder.metrics.values())


def test_bench_packing_runs(tmp_path):
    from benchmarks import bench_packing

    result = bench_packing.main(["--model", "tiny-random-llama", "--limit", "4", "--batch-size", "2", "--warmup", "0",
                                 "--max-prompt-length", "96", "--json", str(tmp_path / "out.json")])
    assert result["loss_abs_diff"] < 1e-5 and (tmp_path / "out.json").exists()
    assert result["padded"]["tokens"] == result["packed"]["tokens"] and result["packed"]["padding_fraction"] == 0.0
    assert result["padded"]["step_time_s"]["n"] == result["packed"]["step_time_s"]["n"] == 2
    assert result["speedup_of_medians"] > 0 and result["slot_ratio"] >= 1.0


def test_padding_fraction_is_logged_for_padded_batches(tmp_path):
    module = SFTModule(model="tiny-random-llama")
    rows = examples(module.tokenizer, n=4)
    batch = SFTCollator(module.tokenizer.pad_token_id)(rows)
    trainer = L.Trainer(max_steps=1, accelerator="cpu", logger=False, enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False, default_root_dir=tmp_path,
                        log_every_n_steps=1)
    trainer.fit(module, DataLoader(rows, batch_size=4, collate_fn=SFTCollator(module.tokenizer.pad_token_id)))
    logged = float(trainer.callback_metrics["train/data/padding_fraction"])
    assert logged == pytest.approx(1 - float(batch.attention_mask.sum()) / batch.attention_mask.numel()) and logged > 0
