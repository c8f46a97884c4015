"""RewardModule learns a learnable preference set; D15 at the end of fit; checkpoint and export.

The synthetic set: a prompt of three random words, a completion of three random words; the
chosen completion ends one word with "!" where the rejected one has the word's last letter, so
both have the same length and differ only by that token. One fit (module-scoped fixture, ~15 s
on 2 CPU cores) is shared by the tests below.
"""

from __future__ import annotations

import random

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger
from torch.utils.data import DataLoader

from callbacks import RewardNormalizationCallback
from lit_rlhf import models
from lit_rlhf.data.collate import PreferenceCollator
from lit_rlhf.data.formatting import encode_completion, encode_prompt
from lit_rlhf.modules import RewardModule

N_TRAIN, N_VAL, BATCH, EPOCHS = 64, 32, 8, 2  # 16 optimizer steps


def _examples(tokenizer, n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)

    def word() -> str:
        return "".join(rng.choice("abcdefgh") for _ in range(rng.randint(3, 6)))

    out = []
    for i in range(n):
        prompt = " ".join(word() for _ in range(3)) + ":"
        words = [word() for _ in range(3)]
        j = rng.randrange(3)
        chosen = list(words)
        chosen[j] = chosen[j][:-1] + "!"
        out.append({
            "prompt": prompt, "batch": f"batch{i % 2}", "confidence": 1 + i % 3,
            "_prompt_ids": encode_prompt(tokenizer, prompt),
            "_chosen_ids": encode_completion(tokenizer, " " + " ".join(chosen)),
            "_rejected_ids": encode_completion(tokenizer, " " + " ".join(words)),
        })
    return out


class References:
    """The minimal `reference_texts(split)` source the normalisation callback needs."""

    def __init__(self, seed: int = 5):
        rng = random.Random(seed)
        self.prompts = [f"post {i}: " + "".join(rng.choice("abcdefgh ") for _ in range(12)) for i in range(10)]
        self.completions = [" " + "".join(rng.choice("abcdefgh!") for _ in range(8)) for _ in range(10)]
        self.splits_asked: list[str] = []

    def reference_texts(self, split: str):
        self.splits_asked.append(split)
        return self.prompts, self.completions


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    root = tmp_path_factory.mktemp("reward_fit")
    L.seed_everything(0)
    module = RewardModule(lr=1e-3, lr_scheduler="constant", export_dir=str(root / "hf_model"))
    collate = PreferenceCollator(module.tokenizer.pad_token_id)
    train = DataLoader(_examples(module.tokenizer, N_TRAIN, 1), batch_size=BATCH, shuffle=True, collate_fn=collate)
    val = DataLoader(_examples(module.tokenizer, N_VAL, 2), batch_size=16, collate_fn=collate)
    refs = References()
    norm = RewardNormalizationCallback(datamodule=refs, split="validation", batch_size=4)
    ckpt = ModelCheckpoint(dirpath=root / "checkpoints", save_last=True)
    logger = TensorBoardLogger(save_dir=root, name="tb")
    trainer = L.Trainer(max_epochs=EPOCHS, accelerator="cpu", logger=logger, callbacks=[ckpt, norm],
                        enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=1,
                        num_sanity_val_steps=0)
    trainer.fit(module, train, val)
    module.eval()
    return {"module": module, "trainer": trainer, "refs": refs, "norm": norm, "root": root, "val": val}


def test_fit_reaches_high_validation_accuracy(fitted):
    trainer = fitted["trainer"]
    assert trainer.global_step == N_TRAIN // BATCH * EPOCHS
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    # chance is 0.5 and the initial loss log(2) = 0.69; 16 steps reach >= 0.9 (observed 1.0)
    assert metrics["val/rewards/accuracy"] >= 0.9
    assert metrics["val/loss"] < 0.3
    assert metrics["val/rewards/margins"] > 1.0
    for key in ("val/accuracy_by_batch/batch0", "val/accuracy_by_batch/batch1", "val/accuracy_by_confidence/1",
                "val/accuracy_by_confidence/3", "val/calibration/ece", "train/loss", "train/rewards/accuracy"):
        assert key in metrics, key


def test_per_group_accuracy_matches_a_recount(fitted):
    module, val = fitted["module"], fitted["val"]
    correct, groups = [], []
    with torch.no_grad():
        for batch in val:
            chosen, rejected = module.pair_rewards(batch)
            correct += (chosen > rejected).tolist()
            groups += batch.meta["batch"]
    metrics = fitted["trainer"].callback_metrics
    for g in ("batch0", "batch1"):
        hits = [c for c, b in zip(correct, groups) if b == g]
        # the logged value is from the last validation, before D15 (a shift does not change accuracy)
        assert float(metrics[f"val/accuracy_by_batch/{g}"]) == pytest.approx(sum(hits) / len(hits))


def test_normalisation_callback_centres_reference_rewards(fitted):
    module, refs, norm = fitted["module"], fitted["refs"], fitted["norm"]
    assert refs.splits_asked == ["validation"]
    assert abs(norm.stats["mean_before"]) > 1e-3  # the test is not vacuous
    assert abs(norm.stats["mean_after"]) < 1e-6
    scores = module.score_texts(refs.prompts, refs.completions)
    assert abs(scores.double().mean().item()) < 1e-4  # D15, re-scored
    assert norm.state_dict()["stats"]["bias"] == pytest.approx(module.reward_model.head.bias.item())


def test_normalised_checkpoint_and_export_load_back_with_the_same_rewards(fitted):
    module, refs, root = fitted["module"], fitted["refs"], fitted["root"]
    expected = module.score_texts(refs.prompts, refs.completions)
    ckpt_path = fitted["norm"].checkpoint_path
    assert ckpt_path == root / "checkpoints" / "reward-normalized.ckpt" and ckpt_path.is_file()
    from_ckpt = models.load_reward_model(str(ckpt_path))
    assert from_ckpt.head.bias.item() == pytest.approx(module.reward_model.head.bias.item(), abs=1e-7)
    # the export runs after the callback (module on_fit_end), so it carries the D15 bias too
    from_export = models.load_reward_model(str(root / "hf_model"))
    tok = module.tokenizer
    from lit_rlhf.data.collate import pad_right

    rows = [encode_prompt(tok, p) + encode_completion(tok, c) for p, c in zip(refs.prompts, refs.completions)]
    ids, mask = pad_right(rows, tok.pad_token_id)
    with torch.no_grad():
        torch.testing.assert_close(from_ckpt.score(ids, mask), expected, rtol=0, atol=1e-5)
        torch.testing.assert_close(from_export.score(ids, mask), expected, rtol=0, atol=1e-5)
    # last.ckpt (written during training) holds the un-normalised bias
    last = models.load_reward_model(str(root / "checkpoints" / "last.ckpt"))
    assert last.head.bias.item() == pytest.approx(module.reward_model.head.bias.item() + fitted["norm"].stats["mean_before"], abs=1e-5)


def test_tensorboard_has_group_tables_calibration_figure_and_normalisation(fitted):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(fitted["trainer"].logger.log_dir, size_guidance={"tensors": 0, "images": 0, "scalars": 0})
    acc.Reload()
    tags = acc.Tags()
    text_tags = set(tags["tensors"])
    assert {"val/accuracy_by_batch/text_summary", "val/accuracy_by_confidence/text_summary"} <= text_tags
    table = acc.Tensors("val/accuracy_by_confidence/text_summary")[-1].tensor_proto.string_val[0].decode()
    assert table.startswith("| confidence | accuracy | pairs |") and "| 2 |" in table
    assert "val/calibration" in tags["images"]
    for key in ("val/accuracy_by_batch/batch0", "train/normalization/mean_before", "train/normalization/mean_after"):
        assert key in tags["scalars"], key


def test_python_m_lit_rlhf_export_turns_the_checkpoint_into_a_sequence_classifier(fitted, tmp_path):
    from transformers import AutoModelForSequenceClassification

    from lit_rlhf.export import export_checkpoint

    module, refs = fitted["module"], fitted["refs"]
    out = export_checkpoint(fitted["norm"].checkpoint_path, tmp_path / "exported")
    plain = AutoModelForSequenceClassification.from_pretrained(out).eval()
    assert plain.config.num_labels == 1
    tok = module.tokenizer
    ids = torch.tensor([encode_prompt(tok, refs.prompts[0]) + encode_completion(tok, refs.completions[0])])
    with torch.no_grad():
        expected = module(ids, torch.ones_like(ids, dtype=torch.bool))
        got = plain(input_ids=ids).logits.squeeze(-1)
    # Llama (RMSNorm): plain transformers returns reward - reward_bias, documented at export
    torch.testing.assert_close(got + plain.config.reward_bias, expected, rtol=0, atol=1e-5)
