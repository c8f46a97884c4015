"""The log-prob path's per-model decisions (`lit_rlhf.models.output_layer.decide_chunked`,
`lit_rlhf.models.shared_prompt.decide_layout`) are taken at fit start (`PolicyModule.on_fit_start`)
for every causal LM a module scores with, a LoRA reference as the base it runs on; a training step
only reads them, and a refusal is warned once."""

from __future__ import annotations

import logging

import lightning as L
import pytest

from lit_rlhf.data import TLDRPreferenceDataModule
from lit_rlhf.models import output_layer, shared_prompt
from lit_rlhf.modules import DPOModule, policy

pytestmark = pytest.mark.usefixtures("one_thread")


class Decisions(L.Callback):
    """Records every decision taken: (which, model, inside a training batch)."""

    def __init__(self, monkeypatch) -> None:
        self.seen, self.in_step = [], False
        for module, name in ((output_layer, "decide_chunked"), (shared_prompt, "decide_layout")):
            monkeypatch.setattr(module, name, self.recording(name, getattr(module, name)))
        monkeypatch.setattr(policy, "decide_layout", shared_prompt.decide_layout)  # imported by name there

    def recording(self, name, decide):
        def recorded(model, *args):
            self.seen.append((name, model, self.in_step))
            return decide(model, *args)

        return recorded

    def on_train_batch_start(self, *args) -> None:
        self.in_step = True

    def on_train_batch_end(self, *args) -> None:
        self.in_step = False


def fit(module: DPOModule, callback: Decisions) -> None:
    data = TLDRPreferenceDataModule(tokenizer="tiny-random-llama", path="bundled:tldr_comparisons", limit=4, batch_size=2,
                                    max_prompt_length=96, max_completion_length=64, val_split=None, test_split=None)
    trainer = L.Trainer(max_steps=2, accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                        enable_checkpointing=False, limit_val_batches=0, callbacks=[callback])
    trainer.fit(module, datamodule=data)


@pytest.mark.parametrize("lora", [None, {"r": 4, "alpha": 8}], ids=["full", "lora"])
def test_each_causal_lm_is_decided_at_fit_start_and_a_step_only_reads_it(monkeypatch, lora):
    module = DPOModule(model="tiny-random-llama", lora=lora)
    callback = Decisions(monkeypatch)
    fit(module, callback)
    # with LoRA the reference is the policy's base with the adapter off: the same model decided once
    expected = [module.policy] if lora else [module.policy, module.ref_model]
    for name in ("decide_chunked", "decide_layout"):
        assert [id(model) for which, model, _ in callback.seen if which == name] == [id(m) for m in expected], name
    assert not [which for which, _, in_step in callback.seen if in_step]
    assert all(output_layer.chunked_layers(m, None) is not None for m in expected)


def test_a_refused_model_is_warned_once_and_another_keeps_its_decision(monkeypatch, caplog):
    module = DPOModule(model="tiny-random-llama")
    module.policy.config.final_logit_softcapping = 30.0  # its logits are not the output layer's
    with caplog.at_level(logging.WARNING, logger="lit_rlhf.models.output_layer"):
        fit(module, Decisions(monkeypatch))
    warned = [r.getMessage() for r in caplog.records if "use the dense logits" in r.getMessage()]
    assert len(warned) == 1 and "final_logit_softcapping" in warned[0]
    assert output_layer.chunked_layers(module.policy, None) is None
    assert output_layer.chunked_layers(module.ref_model, None) is not None
