"""Tasks with a known optimum for the learning tests, and what measures progress toward it.

Everything runs on the tiny random Llama (`tiny-random-llama`: 2 layers, hidden size 64, a
byte-level tokenizer, one token per byte). Its initial next-token distribution is close to
uniform over the 261 tokens, so the lowercase ASCII letters (`LETTERS`, 26 tokens) start with
~10% of the probability mass and any method that optimises "more letters" has room to move.

- Offline data (`preference_rows`, `labelled_rows`, `scored_rows`, `sft_rows`; `length_rows`, the
  SFT rows of PPO-ptx, whose completions are digits): completions
  made of letters (the preferred / desirable / high-reward ones) against completions made of
  digits and punctuation (`OTHERS`); prompts and completions are drawn from a seeded generator
  and the held-out rows come from a different seed than the training rows, so a method is
  measured on pairs it never saw. The true ordering is known by construction: letters first.
- Online reward (`LetterReward`): the number of sampled response tokens that are letters,
  over the response length R; its optimum is 1 (R letters, no EOS). `expected_letter_reward`
  measures the policy's expected reward on held-out prompts from its logits: at each sampled
  prefix it adds the probability mass the policy puts on the letters (the conditional
  expectation of the reward's term given the prefix), so the estimate has far less variance
  than counting sampled letters; the prefixes come from a fixed generator, so before/after
  comparisons use the same random numbers.
"""

from __future__ import annotations

import random
from typing import Any, Sequence

import lightning as L
import torch
from torch import Tensor

from lit_rlhf.data.collate import PromptCollator, SFTCollator, pad_left
from lit_rlhf.generation import SamplingConfig, generate_responses

LETTERS = "abcdefghijklmnopqrstuvwxyz"
OTHERS = "0123456789+-*/=#%&@!?"
WORDS = ("the", "a", "cat", "dog", "sun", "red", "blue", "tree", "house", "river", "why", "how", "story",
         "tell", "me", "about", "write", "one", "two", "big", "small", "old", "new", "day", "night")


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def make_prompts(n: int, seed: int) -> list[str]:
    """`n` distinct short prompts of 2-4 words (and a question mark or colon), drawn from `seed`."""
    rng = random.Random(seed)
    prompts: list[str] = []
    while len(prompts) < n:
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 4))) + rng.choice("?:")
        if text not in prompts:
            prompts.append(text)
    return prompts


def random_text(rng: random.Random, alphabet: str, low: int = 3, high: int = 6) -> str:
    return " " + "".join(rng.choice(alphabet) for _ in range(rng.randint(low, high)))


def preference_rows(tokenizer, n: int, seed: int) -> list[dict[str, Any]]:
    """`n` pairs: chosen = a completion of letters, rejected = one of digits/punctuation (D3:
    a leading space, then the text, then EOS)."""
    rng = random.Random(seed)
    eos = tokenizer.eos_token_id
    rows = []
    for prompt in make_prompts(n, seed):
        rows.append({"_prompt_ids": encode(tokenizer, prompt),
                     "_chosen_ids": encode(tokenizer, random_text(rng, LETTERS)) + [eos],
                     "_rejected_ids": encode(tokenizer, random_text(rng, OTHERS)) + [eos]})
    return rows


def labelled_rows(tokenizer, n: int, seed: int) -> list[dict[str, Any]]:
    """`n` unpaired rows, half desirable (letters, `_label` True), half undesirable (digits)."""
    rng = random.Random(seed)
    eos = tokenizer.eos_token_id
    rows = []
    for i, prompt in enumerate(make_prompts(n, seed)):
        good = i % 2 == 0
        text = random_text(rng, LETTERS if good else OTHERS)
        rows.append({"_prompt_ids": encode(tokenizer, prompt), "_completion_ids": encode(tokenizer, text) + [eos],
                     "_label": good, "_reward": letter_fraction(text)})
    return rows


def scored_rows(tokenizer, n: int, seed: int) -> list[dict[str, Any]]:
    """`n` single trajectories whose completions mix letters and digits in random proportions;
    `_reward` is the fraction of letters (a fixed function of the tokens, in [0, 1])."""
    rng = random.Random(seed)
    eos = tokenizer.eos_token_id
    rows = []
    for prompt in make_prompts(n, seed):
        share = rng.random()
        text = " " + "".join(rng.choice(LETTERS if rng.random() < share else OTHERS) for _ in range(rng.randint(3, 6)))
        rows.append({"_prompt_ids": encode(tokenizer, prompt), "_completion_ids": encode(tokenizer, text) + [eos],
                     "_reward": letter_fraction(text)})
    return rows


def sft_rows(tokenizer, n: int, seed: int) -> list[dict[str, Any]]:
    """`n` prompt/completion rows whose completion follows a rule of the prompt: the prompt's
    words' first letters, in order (e.g. "the red cat?" -> " trc")."""
    eos = tokenizer.eos_token_id
    rows = []
    for prompt in make_prompts(n, seed):
        completion = " " + "".join(word[0] for word in prompt.rstrip("?:").split())
        rows.append({"_prompt_ids": encode(tokenizer, prompt), "_completion_ids": encode(tokenizer, completion) + [eos]})
    return rows


def length_rows(tokenizer, n: int, seed: int) -> list[dict[str, Any]]:
    """`n` prompt/completion rows whose completion is made of digits by a rule of the prompt: the
    lengths of its words, in order (e.g. "the red cat?" -> " 333"). No letters: a policy trained
    toward `LetterReward` moves away from them."""
    eos = tokenizer.eos_token_id
    rows = []
    for prompt in make_prompts(n, seed):
        completion = " " + "".join(str(len(word)) for word in prompt.rstrip("?:").split())
        rows.append({"_prompt_ids": encode(tokenizer, prompt), "_completion_ids": encode(tokenizer, completion) + [eos]})
    return rows


def letter_fraction(text: str) -> float:
    text = text.strip()
    return sum(c in LETTERS for c in text) / len(text) if text else 0.0


def letter_ids(tokenizer) -> list[int]:
    ids = [tokenizer.convert_tokens_to_ids(c) for c in LETTERS]
    assert len(set(ids)) == len(LETTERS), "the tiny tokenizer has one token per letter"
    return ids


class LetterReward:
    """Reward function: the number of response tokens that are lowercase letters, over the
    response length R (so 1 is the optimum: R letters, no EOS).

    Completions reach a reward function as text (`lit_rlhf.rewards`); re-encoding it with the
    byte-level tokenizer gives back the sampled tokens' letters exactly (a special token's text,
    such as "<s>", re-encodes as that special token, not as letters; an invalid byte decodes to
    U+FFFD, whose bytes are not letters)."""

    def __init__(self, tokenizer, length: int) -> None:
        self.tokenizer = tokenizer
        self.length = length
        self.ids = set(letter_ids(tokenizer))

    def __call__(self, prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
        encoded = self.tokenizer(list(completions), add_special_tokens=False)["input_ids"]
        return [sum(t in self.ids for t in row) / self.length for row in encoded]


@torch.no_grad()
def expected_letter_reward(policy, tokenizer, prompts: Sequence[str], length: int, temperature: float,
                           samples: int = 32, seed: int = 1234) -> float:
    """E[LetterReward] of `policy` on `prompts` at `temperature`.

    For each prompt, `samples` responses of `length` tokens are drawn from a generator seeded
    with `seed`; the estimate adds, at every response position t that the response reached (no
    EOS before t), the policy's probability of a letter given the sampled prefix, divided by
    `length`. That is the exact conditional expectation of the reward's term t given the prefix,
    so its mean over the samples is an unbiased estimate of the expected reward.
    """
    was_training = policy.training
    policy.eval()
    try:
        ids, mask = pad_left([encode(tokenizer, p) for p in prompts for _ in range(samples)], tokenizer.pad_token_id)
        mask = mask.bool()
        config = SamplingConfig(max_new_tokens=length, temperature=temperature)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            response_ids, response_mask, _ = generate_responses(policy, ids, mask, config, tokenizer.eos_token_id,
                                                                tokenizer.pad_token_id)
        input_ids = torch.cat([ids, response_ids], dim=1)  # (N, P+R)
        attention = torch.cat([mask, torch.ones_like(response_mask)], dim=1)
        positions = (attention.long().cumsum(dim=1) - 1).clamp(min=0)
        logits = policy(input_ids=input_ids, attention_mask=attention.long(), position_ids=positions).logits
        prompt_width = ids.shape[1]
        next_token = logits[:, prompt_width - 1: prompt_width + length - 1].float() / temperature  # (N, R, V)
        letter_mass = next_token.softmax(dim=-1)[..., letter_ids(tokenizer)].sum(dim=-1)  # (N, R)
        return float((letter_mass * response_mask).sum(dim=1).mean() / length)
    finally:
        policy.train(was_training)


class LengthSFTDataModule(L.LightningDataModule):
    """`length_rows` as a DataModule of `SFTBatch`: `rows` rows drawn from `seed`, `batch_size` a
    batch (PPO-ptx's SFT data in the learning tests, named by `class_path`)."""

    def __init__(self, tokenizer: Any = None, rows: int = 64, seed: int = 0, batch_size: int = 8) -> None:
        super().__init__()
        self.tokenizer, self.rows, self.seed, self.batch_size = tokenizer, rows, seed, batch_size

    def train_dataloader(self):
        from torch.utils.data import DataLoader

        return DataLoader(length_rows(self.tokenizer, self.rows, self.seed), batch_size=self.batch_size,
                          collate_fn=SFTCollator(self.tokenizer.pad_token_id))


def token_nll(model, batch) -> float:
    """Mean NLL per completion token (EOS included) of the rows of an `SFTBatch`."""
    return float(-sequence_logps(model, batch.input_ids, batch.attention_mask, batch.loss_mask).sum()
                 / batch.loss_mask[:, 1:].sum())


def prompt_loader(tokenizer, prompts: Sequence[str], batch_size: int):
    from torch.utils.data import DataLoader

    rows = [{"_prompt_ids": encode(tokenizer, p), "prompt": p} for p in prompts]
    return DataLoader(rows, batch_size=batch_size, shuffle=True, collate_fn=PromptCollator(tokenizer.pad_token_id))


def eos_bias(module, bias: float) -> None:
    """Give the policy (and the reference, when there is one) an output-layer bias on EOS, so
    responses end early at random; see `tests.modules.test_token_mean.early_eos`."""
    for name in ("policy", "ref_model"):
        model = getattr(module, name, None)
        if model is None:
            continue
        head = model.lm_head
        biased = torch.nn.Linear(head.in_features, head.out_features, bias=True)
        with torch.no_grad():
            biased.weight.copy_(head.weight)
            biased.bias.zero_()
            biased.bias[module.tokenizer.eos_token_id] = bias
        biased.requires_grad_(head.weight.requires_grad)
        model.lm_head = biased


@torch.no_grad()
def sequence_logps(model, input_ids: Tensor, attention_mask: Tensor, loss_mask: Tensor) -> Tensor:
    """Summed log-probs (B,) of the tokens under `loss_mask` in right-padded rows (B, T), from a
    plain forward pass of the causal LM (independent of the modules' log-prob code)."""
    was_training = model.training
    model.eval()
    try:
        logits = model(input_ids=input_ids, attention_mask=attention_mask.long()).logits[:, :-1].float()
        token = logits.log_softmax(dim=-1).gather(2, input_ids[:, 1:, None]).squeeze(2)  # (B, T-1)
        return (token * loss_mask[:, 1:]).sum(dim=1)
    finally:
        model.train(was_training)
