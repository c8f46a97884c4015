"""One test per function of `lit_rlhf.lightning_compat`: each fails when the Lightning private
attribute it wraps disappears or changes meaning (checked on a real, tiny Trainer where the
meaning shows only in a run)."""

from __future__ import annotations

import csv
import signal
import warnings
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback, LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.core import saving
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from lightning.pytorch.utilities.exceptions import SIGTERMException

from lit_rlhf import lightning_compat as compat


def tiny_trainer(tmp_path: Path, **kwargs) -> L.Trainer:
    options = dict(default_root_dir=tmp_path, accelerator="cpu", max_steps=4, limit_val_batches=1, logger=False,
                   enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    return L.Trainer(**{**options, **kwargs})


class Probe(Callback):
    """Calls `probe(trainer)` at the end of every training batch and keeps the answers."""

    def __init__(self, probe):
        self.probe, self.seen = probe, []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.seen.append(self.probe(trainer))


def test_written_against_the_installed_lightning():
    assert L.__version__.startswith(compat.LIGHTNING_VERSION + "."), (
        f"lit_rlhf.lightning_compat was written against Lightning {compat.LIGHTNING_VERSION}; installed "
        f"{L.__version__}: check each function against the new version, then update LIGHTNING_VERSION")


def test_trust_checkpoint_instantiator_lets_load_from_checkpoint_call_it(tmp_path):
    assert isinstance(saving._ALLOWED_INSTANTIATORS, set)
    trainer = tiny_trainer(tmp_path, max_steps=1)
    trainer.fit(BoringModel())
    path = tmp_path / "boring.ckpt"
    trainer.save_checkpoint(path)
    checkpoint = torch.load(path, weights_only=False)
    checkpoint["hyper_parameters"] = {"_instantiator": f"{__name__}.build_boring"}
    torch.save(checkpoint, path)
    saving._ALLOWED_INSTANTIATORS.discard(f"{__name__}.build_boring")
    with pytest.raises(ValueError, match="allowlist"):
        BoringModel.load_from_checkpoint(path)
    compat.trust_checkpoint_instantiator(f"{__name__}.build_boring")
    BUILT.clear()
    BoringModel.load_from_checkpoint(path)
    assert BUILT == [BoringModel]  # Lightning called the trusted instantiator


BUILT: list[type] = []


def build_boring(cls, config):
    BUILT.append(cls)
    return cls(**config)


def test_last_checkpoints_in_dir_and_checkpoint_dir_follow_the_logger(tmp_path):
    logger = CSVLogger(tmp_path, name="run", version=3)
    callback = ModelCheckpoint(save_last=True)
    trainer = tiny_trainer(tmp_path, max_steps=1, logger=logger, enable_checkpointing=True, callbacks=[callback])
    expected = tmp_path / "run" / "version_3" / "checkpoints"
    assert Path(compat.checkpoint_dir(callback, trainer)) == expected  # resolved before any save
    assert compat.last_checkpoints_in_dir(callback, trainer) == set()
    trainer.fit(BoringModel())
    assert compat.last_checkpoints_in_dir(callback, trainer) == {str(expected / "last.ckpt")}
    (expected / "last-v1.ckpt").write_bytes(b"")
    (expected / "other.ckpt").write_bytes(b"")
    assert compat.last_checkpoints_in_dir(callback, trainer) == {str(expected / "last.ckpt"), str(expected / "last-v1.ckpt")}
    assert compat.checkpoint_dir(ModelCheckpoint(dirpath=tmp_path / "own"), trainer) == str(tmp_path / "own")


def test_uncount_stepped_batch_edits_the_counter_the_loop_restores(tmp_path):
    trainer = tiny_trainer(tmp_path, max_steps=3)
    trainer.fit(BoringModel())
    path = tmp_path / "three.ckpt"
    trainer.save_checkpoint(path)
    checkpoint = torch.load(path, weights_only=False)
    state = checkpoint["loops"]["fit_loop"]
    assert state["epoch_loop.state_dict"]["_batches_that_stepped"] == 3
    compat.uncount_stepped_batch(state)
    torch.save(checkpoint, path)
    resumed = tiny_trainer(tmp_path, max_steps=3)
    resumed.fit(BoringModel(), ckpt_path=path)
    assert resumed.fit_loop.epoch_loop._batches_that_stepped == 2  # what Lightning writes training scalars at


def test_accumulating_is_true_inside_an_accumulation_window_only(tmp_path):
    probe = Probe(compat.accumulating)
    trainer = tiny_trainer(tmp_path, max_steps=2, accumulate_grad_batches=3, callbacks=[probe])
    trainer.fit(BoringModel())
    assert probe.seen == [True, True, False, True, True, False]


class WithFrozen(BoringModel):
    """A BoringModel with a submodule in eval mode, as a frozen reference model is (D7)."""

    def __init__(self, replace: bool):
        super().__init__()
        self.frozen = torch.nn.Linear(2, 2)
        self.replace, self.calls = replace, 0

    def on_fit_start(self):
        self.frozen.eval()
        if self.replace:
            assert compat.replace_eval_mode_check(self.trainer, self.count)

    def count(self):
        self.calls += 1


@pytest.mark.parametrize("replace", [False, True])
def test_replace_eval_mode_check_runs_the_replacement_instead_of_lightnings_warning(tmp_path, replace):
    module = WithFrozen(replace)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        tiny_trainer(tmp_path, max_steps=1).fit(module)
    lightnings = [w for w in record if "eval mode" in str(w.message)]
    assert (module.calls, len(lightnings)) == ((1, 0) if replace else (0, 1))


def test_logger_writes_this_step_is_true_on_the_steps_the_logger_writes(tmp_path):
    probe = Probe(compat.logger_writes_this_step)

    class Logs(BoringModel):
        def training_step(self, batch, batch_idx):
            out = super().training_step(batch, batch_idx)
            self.log("marker", float(batch_idx), on_step=True, on_epoch=False)
            return out

    trainer = tiny_trainer(tmp_path, max_steps=6, log_every_n_steps=3, logger=CSVLogger(tmp_path), callbacks=[probe])
    trainer.fit(Logs())
    assert probe.seen == [False, False, True, False, False, True]
    rows = list(csv.DictReader((Path(trainer.logger.log_dir) / "metrics.csv").open()))
    assert [float(row["marker"]) for row in rows] == [2, 5]  # the batches whose probe said True


def test_learning_rates_reads_the_optimizers_as_the_monitor_names_them(tmp_path):
    monitor = LearningRateMonitor(logging_interval="step")
    probe = Probe(lambda trainer: compat.learning_rates(monitor, trainer, "any"))
    trainer = tiny_trainer(tmp_path, max_steps=1, logger=CSVLogger(tmp_path), callbacks=[monitor, probe])
    trainer.fit(BoringModel())
    assert probe.seen == [{"lr-SGD": pytest.approx(0.1)}]


class SignalledOnce(Callback):
    """Makes Lightning's own SIGTERM handler record a signal at the second batch's end."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if batch_idx == 1:
            signal.raise_signal(signal.SIGTERM)


def test_take_lightning_sigterm_takes_the_signal_lightning_would_stop_on(tmp_path):
    taken = []

    class Take(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            taken.append(compat.take_lightning_sigterm(trainer))

    trainer = tiny_trainer(tmp_path, max_steps=4, callbacks=[SignalledOnce(), Take()])
    trainer.fit(BoringModel())  # no SIGTERMException: the signal was taken
    assert taken == [False, True, False, False]
    assert trainer.global_step == 4


def test_signal_handlers_restored_at_teardown_is_lightnings_own_dict(tmp_path):
    seen = []

    def mine(signum, frame):
        pass

    class Swap(Callback):
        def on_train_start(self, trainer, pl_module):
            handlers = compat.signal_handlers_restored_at_teardown(trainer)
            seen.append(signal.SIGTERM in handlers)
            handlers[signal.SIGTERM] = mine

    previous = signal.getsignal(signal.SIGTERM)
    try:
        tiny_trainer(tmp_path, max_steps=1, callbacks=[Swap()]).fit(BoringModel())
        assert seen == [True]
        assert signal.getsignal(signal.SIGTERM) is mine  # what Lightning put back at teardown
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert compat.signal_handlers_restored_at_teardown(object()) == {}


def test_stop_after_this_batch_ends_the_fit_with_sigterm_and_skips_the_validation_due(tmp_path):
    validations = []

    class Stop(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if batch_idx == 1:
                compat.stop_after_this_batch(trainer)

        def on_validation_start(self, trainer, pl_module):
            validations.append(trainer.global_step)

    trainer = tiny_trainer(tmp_path, max_steps=8, val_check_interval=2, check_val_every_n_epoch=None,
                           num_sanity_val_steps=0, callbacks=[Stop()])
    with pytest.raises(SIGTERMException):
        trainer.fit(BoringModel())
    assert trainer.global_step == 2 and validations == []


@pytest.mark.parametrize("logger_class", [CSVLogger, TensorBoardLogger])
def test_logger_version_unset_and_set_logger_version(tmp_path, logger_class):
    (tmp_path / "run" / "version_0").mkdir(parents=True)
    logger = logger_class(tmp_path, name="run")
    assert compat.logger_version_unset(logger)
    compat.set_logger_version(logger, 0)
    assert not compat.logger_version_unset(logger)
    assert logger.version == 0 and Path(logger.log_dir) == tmp_path / "run" / "version_0"
    fresh = logger_class(tmp_path, name="run")
    assert fresh.version == 1  # reading `version` chooses the next one: no longer unset
    assert not compat.logger_version_unset(fresh)
    assert not compat.logger_version_unset(logger_class(tmp_path, name="run", version="mine"))


def test_progress_bar_due_every_refresh_rate_and_at_the_total(tmp_path):
    from lightning.pytorch.callbacks import TQDMProgressBar

    bar = TQDMProgressBar(refresh_rate=3)
    assert [c for c in range(1, 11) if compat.progress_bar_due(bar, c, 10)] == [3, 6, 9, 10]
    assert not compat.progress_bar_due(TQDMProgressBar(refresh_rate=0), 3, 10)  # a disabled bar never draws


def test_callback_state_key_is_the_key_lightning_saves_a_callbacks_state_under(tmp_path):
    class Counter(Callback):
        def __init__(self, name):
            self.name, self.count = name, 0

        @property
        def state_key(self):
            return compat.callback_state_key(self, name=self.name)

        def state_dict(self):
            return {"count": self.count}

    trainer = tiny_trainer(tmp_path, max_steps=1, callbacks=[Counter("a"), Counter("b")])
    trainer.fit(BoringModel())
    trainer.save_checkpoint(tmp_path / "c.ckpt")
    saved = torch.load(tmp_path / "c.ckpt", weights_only=False)["callbacks"]
    assert {"Counter{'name': 'a'}", "Counter{'name': 'b'}"} <= {key.rsplit(".", 1)[-1] for key in saved}


def test_restart_next_epoch_afresh(tmp_path):
    """The loop attributes it reads exist with the meaning it assumes: on a fresh fit nothing is
    restarted (False, nothing changed); a fit loop's restart stage can be reset."""
    trainer = tiny_trainer(tmp_path, max_steps=1)
    trainer.fit(BoringModel())
    loop = trainer.fit_loop
    assert hasattr(loop, "restarted_mid_epoch") and hasattr(loop.epoch_loop, "restarted_on_train_batch_end")
    assert callable(loop.reset_restart_stage) and isinstance(loop.epoch_loop.batch_progress.is_last_batch, bool)
    assert compat.restart_next_epoch_afresh(trainer) is False


def test_write_metrics_at(tmp_path):
    """Lightning writes `self.log` values through `_logger_connector.log_metrics(metrics, step)`:
    wrapped, they land at the chosen step with the epoch column; a logged `step` still wins."""
    trainer = tiny_trainer(tmp_path, max_steps=1)
    trainer.fit(BoringModel())
    written = []
    connector = trainer._logger_connector  # noqa: SLF001 - what the function relies on, checked here
    connector.log_metrics = lambda metrics, step=None: written.append((dict(metrics), step))
    compat.write_metrics_at(trainer, lambda t: 41)
    compat.write_metrics_at(trainer, lambda t: 99)  # idempotent: the first wrapping stays
    connector.log_metrics({"loss": 1.0})
    connector.log_metrics({"loss": 2.0, "step": 5})
    assert written == [({"epoch": trainer.current_epoch, "loss": 1.0}, 41), ({"loss": 2.0, "step": 5}, None)]


class _MeshProbe(BoringModel):
    def configure_model(self):
        self.mesh_shape = tuple(self.device_mesh.shape)


def test_set_model_parallel_sizes_sets_the_sizes_the_mesh_is_built_from(tmp_path):
    from lightning.pytorch.strategies import ModelParallelStrategy

    strategy = ModelParallelStrategy(data_parallel_size="auto", tensor_parallel_size="auto")
    compat.set_model_parallel_sizes(strategy, world_size=4)
    assert (strategy._data_parallel_size, strategy._tensor_parallel_size) == (4, 1)
    # Lightning builds its mesh from them: 4 x 1 in a 1-process world is refused ...
    with pytest.raises(RuntimeError, match="should equal the world size"):
        tiny_trainer(tmp_path, max_steps=1, devices=1, strategy=strategy).fit(_MeshProbe())
    # ... 1 x 1 is the mesh the module sees
    strategy = ModelParallelStrategy(data_parallel_size="auto", tensor_parallel_size=1)
    compat.set_model_parallel_sizes(strategy, world_size=1)
    module = _MeshProbe()
    tiny_trainer(tmp_path, max_steps=1, devices=1, strategy=strategy).fit(module)
    assert module.mesh_shape == (1, 1)
    fixed = ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1)
    compat.set_model_parallel_sizes(fixed, world_size=4)
    assert fixed._data_parallel_size == 2  # a number is left alone
