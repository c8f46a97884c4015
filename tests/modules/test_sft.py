"""SFTModule: completion-only loss, a fit that lowers the loss, export that plain transformers loads."""

from __future__ import annotations

import lightning as L
import torch
from torch.utils.data import DataLoader
from transformers import AutoModelForCausalLM, AutoTokenizer

from lit_rlhf.export import export_checkpoint
from lit_rlhf.modules import SFTModule
from lit_rlhf.types import SFTBatch

PAIRS = [
    ("Q: colour of the sky?\nA:", " blue"),
    ("Q: colour of grass?\nA:", " green"),
    ("Q: colour of snow?\nA:", " white"),
    ("Q: colour of coal?\nA:", " black"),
]


def make_batches(tokenizer, batch_size=4):
    rows = []
    for prompt, completion in PAIRS:
        p = tokenizer(prompt)["input_ids"]
        c = tokenizer(completion)["input_ids"] + [tokenizer.eos_token_id]
        rows.append((p + c, [False] * len(p) + [True] * len(c)))

    def collate(items):
        width = max(len(ids) for ids, _ in items)
        ids = torch.full((len(items), width), tokenizer.pad_token_id)
        attn = torch.zeros((len(items), width), dtype=torch.bool)
        loss = torch.zeros((len(items), width), dtype=torch.bool)
        for i, (row, mask) in enumerate(items):
            ids[i, : len(row)] = torch.tensor(row)
            attn[i, : len(row)] = True
            loss[i, : len(row)] = torch.tensor(mask)
        return SFTBatch(ids, attn, loss)

    return DataLoader(rows, batch_size=batch_size, collate_fn=collate)


def trainer(tmp_path, steps):
    return L.Trainer(max_steps=steps, accelerator="cpu", logger=False, enable_progress_bar=False,
                     enable_model_summary=False, default_root_dir=tmp_path, log_every_n_steps=1)


def test_loss_masks_prompt_and_padding(tiny_tokenizer):
    module = SFTModule(model="tiny-random-llama")
    batch = next(iter(make_batches(module.tokenizer)))
    logps = module.policy_logps(batch.input_ids, batch.attention_mask, batch.loss_mask)
    assert torch.all(logps[~batch.loss_mask] == 0)
    # changing a prompt token's target does not change which tokens are scored
    expected = -(logps.sum() / batch.loss_mask.sum())
    assert torch.allclose(module.compute_loss(batch)[0], expected)
    # the EOS token closes every completion and is trained on
    last = batch.attention_mask.long().sum(1) - 1
    assert torch.all(batch.input_ids[torch.arange(4), last] == module.tokenizer.eos_token_id)
    assert torch.all(batch.loss_mask[torch.arange(4), last])


def test_fit_lowers_loss_and_exports(tmp_path):
    L.seed_everything(0)
    module = SFTModule(model="tiny-random-llama", lr=3e-3, lr_scheduler="constant", export_dir=str(tmp_path / "hf"))
    loader = make_batches(module.tokenizer)
    batch = next(iter(loader))
    with torch.no_grad():
        before = module.compute_loss(batch)[0].item()
    trainer(tmp_path, 30).fit(module, loader)
    with torch.no_grad():
        after = module.compute_loss(batch)[0].item()
    assert after < 0.5 * before, (before, after)  # ~5.6 nats at random init

    # exported at the end of fit; plain transformers gives the same log-probs
    tok = AutoTokenizer.from_pretrained(tmp_path / "hf")
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    assert tok.pad_token_id == module.tokenizer.pad_token_id != tok.eos_token_id
    with torch.no_grad():
        ours = module.policy(input_ids=batch.input_ids[:1]).logits
        theirs = plain(input_ids=batch.input_ids[:1]).logits
    assert torch.allclose(ours, theirs, atol=1e-5)


def test_export_from_checkpoint(tmp_path):
    L.seed_everything(0)
    module = SFTModule(model="tiny-random-llama", lr=3e-3)
    t = trainer(tmp_path, 3)
    t.fit(module, make_batches(module.tokenizer))
    ckpt = tmp_path / "sft.ckpt"
    t.save_checkpoint(ckpt)
    out = export_checkpoint(ckpt, tmp_path / "from_ckpt")
    plain = AutoModelForCausalLM.from_pretrained(out)
    for name, param in module.policy.state_dict().items():
        assert torch.equal(param, plain.state_dict()[name]), name
