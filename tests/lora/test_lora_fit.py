"""A LoRA DPO fit end to end: checkpoint, export from it (merged and adapter), plain loading."""

from __future__ import annotations

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from transformers import AutoModelForCausalLM

from lit_rlhf.data import TLDRPreferenceDataModule
from lit_rlhf.export import main as export_main
from lit_rlhf.models import adapters, load_causal_lm, load_tokenizer
from lit_rlhf.modules import DPOModule


def test_lora_dpo_fit_checkpoint_and_export_both_ways(tmp_path):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        L.seed_everything(0)
        module = DPOModule(model="tiny-random-llama", lr=1e-2, beta=0.5, lora={"r": 4, "alpha": 8})
        dm = TLDRPreferenceDataModule(tokenizer="tiny-random-llama", path="bundled:tldr_comparisons", limit=4,
                                      batch_size=2, max_prompt_length=96, max_completion_length=256,
                                      val_split=None, test_split=None)
        trainer = L.Trainer(max_steps=2, accelerator="cpu", logger=False, enable_progress_bar=False,
                            enable_model_summary=False, limit_val_batches=0,
                            callbacks=[ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)])
        trainer.fit(module, datamodule=dm)
        moved = [p for n, p in module.policy.named_parameters() if "lora_B" in n]
        assert moved and all(p.abs().sum() > 0 for p in moved)  # trained from B = 0
        # the checkpoint holds the adapters only; the export rebuilds the base from its name
        checkpoint = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=False)
        assert all("lora_" in k for k in checkpoint["state_dict"])
        export_main([str(tmp_path / "ckpt" / "last.ckpt"), str(tmp_path / "hf")])

        ids = torch.randint(3, 200, (2, 10))
        with torch.no_grad():
            expected = module.policy(input_ids=ids).logits
            plain = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()  # merged: plain transformers
            torch.testing.assert_close(plain(input_ids=ids).logits, expected, rtol=0, atol=1e-4)
            from peft import PeftModel  # the adapter alone, PEFT format, on the base

            base = load_causal_lm("tiny-random-llama", load_tokenizer("tiny-random-llama"))
            with_adapter = PeftModel.from_pretrained(base, str(tmp_path / "hf" / "adapter")).eval()
            torch.testing.assert_close(with_adapter(input_ids=ids).logits, expected, rtol=0, atol=1e-4)
            merged = load_causal_lm(str(tmp_path / "hf" / "adapter"))  # our loader: base + adapter merged
            torch.testing.assert_close(merged(input_ids=ids).logits, expected, rtol=0, atol=1e-4)
        assert adapters.is_adapter_dir(tmp_path / "hf" / "adapter")
    finally:
        torch.set_num_threads(threads)
