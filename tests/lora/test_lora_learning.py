"""Learning check: LoRA DPO reaches the training reward accuracy of full fine-tuning in as many steps."""

from __future__ import annotations

import random

import torch

from lit_rlhf.data.collate import PreferenceCollator
from lit_rlhf.modules import DPOModule

PAIRS, BATCH, EPOCHS = 48, 8, 3  # 18 optimizer steps


def preference_set(tokenizer, seed=0):
    """Fixed pairs of random completions from one alphabet: which one is chosen follows no rule,
    so the training accuracy measures how well the policy fits the set (chance: 0.5)."""
    rng = random.Random(seed)
    rows = []
    for i in range(PAIRS):
        prompt = f"Q{i}: say something."
        chosen = " " + " ".join("".join(rng.choice("abcdefghij") for _ in range(rng.randint(2, 5))) for _ in range(3))
        rejected = " " + " ".join("".join(rng.choice("abcdefghij") for _ in range(rng.randint(2, 5))) for _ in range(3))
        enc = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
        rows.append({"_prompt_ids": enc(prompt), "_chosen_ids": enc(chosen) + [tokenizer.eos_token_id],
                     "_rejected_ids": enc(rejected) + [tokenizer.eos_token_id]})
    return rows


def train_accuracy(lora, lr) -> float:
    """Train DPO for EPOCHS over the set (fixed order), then its reward accuracy on the whole set."""
    torch.manual_seed(0)
    module = DPOModule(model="tiny-random-llama", beta=0.5, lora=lora)
    rows = preference_set(module.tokenizer)
    collate = PreferenceCollator(module.tokenizer.pad_token_id)
    optimizer = torch.optim.AdamW(module.optimizer_param_groups(), lr=lr)
    for _ in range(EPOCHS):
        for start in range(0, PAIRS, BATCH):
            loss, _ = module.compute_loss(collate(rows[start: start + BATCH]))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    with torch.no_grad():
        _, stats = module.compute_loss(collate(rows))
    return float(stats["rewards/accuracies"])


def test_lora_dpo_matches_full_fine_tuning_accuracy():
    """Measured (seed 0, one thread): full fine-tuning (lr 1e-3) 0.917, LoRA r 8 (lr 3e-3) 0.938;
    for scale, LoRA at lr 3e-2 diverges to 0.708 and full fine-tuning at lr 1e-6 gets 0.771."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        full = train_accuracy(None, lr=1e-3)
        lora = train_accuracy({"r": 8, "alpha": 16}, lr=3e-3)  # adapters take a higher learning rate
    finally:
        torch.set_num_threads(threads)
    assert full >= 0.75, full  # the set is learnable in these steps (the check is not vacuous)
    assert lora >= full - 0.05, (lora, full)
