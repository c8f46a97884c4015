"""The LightningCLI behind `main.py`: any module x any DataModule from YAML configs.

    python main.py fit --config configs/tldr/sft.yaml
    python main.py fit --config configs/tldr/dpo.yaml --config configs/strategy/ddp.yaml
    python main.py fit --config configs/tldr/sft.yaml --ckpt_path last      # resume (lit_rlhf.resume)
    python main.py fit --config configs/tldr/sft.yaml --print_config        # resolved config
    python main.py fit --model.help DPOModule                              # a module's arguments

The DataModule's `tokenizer` is linked to the module's tokenizer (or its model when the module
sets none), so a config names the model once.

`run` (what `main.py` calls) adds what a person at a terminal needs: a quiet console
(`lit_rlhf.console`; `--verbose` or LIT_RLHF_VERBOSE=1 shows everything), the project's own
errors (a missing model, an unreadable dataset, a failed start-up check) printed as one message
with exit code 2 instead of a traceback, and, unless the config lists its own, a compact progress
bar and the dead-run warnings (`default_callbacks`).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from lightning import Callback, LightningDataModule, LightningModule
from lightning.pytorch.cli import LightningCLI

from lit_rlhf import console, hub, resume

log = logging.getLogger(__name__)

PROJECT_PACKAGES = ("lit_rlhf", "callbacks", "examples")


def tokenizer_of(model: str, tokenizer: str | None) -> str:
    return tokenizer or model


class RLHFCLI(LightningCLI):
    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments(
            ("model.init_args.model", "model.init_args.tokenizer"),
            "data.init_args.tokenizer",
            compute_fn=tokenizer_of,
        )
        resume.add_resume_arguments(parser)

    def before_fit(self) -> None:
        resume.end_startup_handler(self.trainer)
        resume.prepare_fit(self.trainer, self.config_init[self.subcommand])

    def _run_subcommand(self, subcommand: str) -> None:
        try:
            super()._run_subcommand(subcommand)
        except SystemExit as exception:  # a preempted fit exits with 75 (lit_rlhf.resume)
            preempted = resume.preempted_exit(getattr(self, "trainer", None), exception)
            if preempted is None:
                raise
            log.warning("run stopped: %s", preempted)
            raise preempted from None

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list[Callback]) -> Any:
        return super()._instantiate_trainer(config, callbacks + default_callbacks(config, callbacks))


def default_callbacks(trainer_config: dict[str, Any], more: list[Callback] = ()) -> list[Callback]:
    """The callbacks every run gets unless its config lists its own: `CompactProgressBar` (when
    the progress bar is enabled) and `RunHealthCallback` (dead-run warnings)."""
    from lightning.pytorch.callbacks import ProgressBar

    from callbacks.progress import CompactProgressBar
    from callbacks.run_health import RunHealthCallback

    listed = trainer_config.get("callbacks") or []
    listed = (listed if isinstance(listed, list) else [listed]) + list(more)
    extra: list[Callback] = []
    if trainer_config.get("enable_progress_bar", True) is not False and not any(isinstance(c, ProgressBar) for c in listed):
        extra.append(CompactProgressBar())
    if not any(isinstance(c, RunHealthCallback) for c in listed):
        extra.append(RunHealthCallback())
    return extra


def register_project_classes() -> None:
    """Import the project's modules and DataModules so that `fit --help` lists them as known
    subclasses and `--model.help DPOModule` / `--data.help TLDRPreferenceDataModule` resolve the
    short names."""
    import lit_rlhf.data  # noqa: F401
    import lit_rlhf.modules  # noqa: F401


UNION_DUMP = "Does not validate against any of the Union subtypes"


def project_error(err: BaseException) -> BaseException | None:
    """The error to show a person, or None for a traceback: the first exception defined by this
    project in `err`'s chain (`__cause__`/`__context__`), else, when `err` is jsonargparse's
    union-validation dump around an error raised while building a class of the config (e.g.
    `ValueError: lr must be > 0`), that error."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if type(current).__module__.split(".")[0] in PROJECT_PACKAGES:
            return current
        current = current.__cause__ or current.__context__
    if isinstance(err, ValueError) and str(err).startswith(UNION_DUMP) and err.__cause__ is not None:
        return err.__cause__
    return None


def error_message(err: BaseException) -> str:
    """`error: <message>` for the project's errors, `error: <Type>: <message>` for others."""
    own = type(err).__module__.split(".")[0] in PROJECT_PACKAGES
    return f"error: {err}" if own else f"error: {type(err).__name__}: {err}"


def run(args: list[str] | None = None) -> None:
    """The command line: `main` with a quiet console and the project's errors as one message.

    A project error (e.g. `ModelNotFoundError`, `DataSourceError`, a start-up check) is printed
    as `error: <message>` on stderr with exit code 2; any other exception, and every exception
    with `--verbose` / LIT_RLHF_VERBOSE=1, propagates with its traceback."""
    verbose = console.verbose_requested()
    console.configure(verbose)
    hub.prepare_environment()  # idempotent: main.py already called it before Lightning's import
    try:
        main(args)
    except Exception as err:
        found = project_error(err)
        if found is None or verbose:
            raise
        print(f"{error_message(found)}\n(run with --verbose for the traceback)", file=sys.stderr)
        raise SystemExit(2) from None


@resume.sigterm_exits_during_startup()  # SIGTERM before the trainer runs: exit 75 at once
def main(args: list[str] | None = None, run: bool = True, **kwargs: Any) -> RLHFCLI:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    register_project_classes()
    return RLHFCLI(
        LightningModule,
        LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        save_config_kwargs={"overwrite": True},
        auto_configure_optimizers=False,  # every module configures its own optimiser from its init args
        args=args,
        run=run,
        **kwargs,
    )
