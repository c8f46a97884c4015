"""The LightningCLI behind `main.py`: any module x any DataModule from YAML configs
(`docs/getting-started.md`).

The DataModule's `tokenizer` is linked to the built module's (`tokenizer_name`), so a config names
the model once. `run` (what `main.py` calls) adds a quiet console (`lit_rlhf.console`;
`--verbose` shows everything) and prints the project's own errors (`lit_rlhf.cli_errors`) as one
line with exit code 2. Every fit gets a `PreemptionCheckpoint` (`default_callbacks`); the
console's callbacks live in the top-level `callbacks` package, which this package never imports:
`main.py` passes them in (`main(..., default_callbacks=...)`).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, Callable

from lightning import Callback, LightningDataModule, LightningModule
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from lit_rlhf import console, hub, resume
from lit_rlhf.cli_errors import OptionError, ProjectArgumentParser, TrainerSettingError, locate
from lit_rlhf.preemption import PreemptionCheckpoint
from lit_rlhf.training.sharding import resolve_data_parallel_size

log = logging.getLogger(__name__)

PROJECT_PACKAGES = ("lit_rlhf", "callbacks", "examples")
PREEMPTION_FLAG = "preemption_checkpoint"

# (trainer config, callbacks already listed) -> callbacks to add
DefaultCallbacks = Callable[[dict[str, Any], list[Callback]], list[Callback]]


def tokenizer_of(module: LightningModule) -> Any:
    """The tokenizer a module was built with (`tokenizer_name`: its `tokenizer`, else its `model`)."""
    return getattr(module, "tokenizer_name", None)


class RLHFCLI(LightningCLI):
    """LightningCLI with the project's parser (`lit_rlhf.cli_errors`), resume (`lit_rlhf.resume`)
    and default callbacks: `default_callbacks` of this module, then the caller's."""

    def __init__(self, *args: Any, default_callbacks: DefaultCallbacks | None = None, **kwargs: Any) -> None:
        self.more_default_callbacks = default_callbacks
        kwargs.setdefault("parser_class", ProjectArgumentParser)
        super().__init__(*args, **kwargs)

    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("model", "data.init_args.tokenizer", compute_fn=tokenizer_of, apply_on="instantiate")
        resume.add_resume_arguments(parser)
        parser.add_argument(
            f"--{PREEMPTION_FLAG}", type=bool, default=True,
            help="write last.ckpt when the run gets SIGTERM/SIGINT, then exit with 75/130 (lit_rlhf.preemption)",
        )

    def parse_arguments(self, parser, args) -> None:
        try:
            super().parse_arguments(parser, args)
        except OptionError as err:  # say where the option was given: config file and line, or the command line
            raise locate(err, list(sys.argv[1:] if args is None else args)) from None

    def before_fit(self) -> None:
        resume.end_startup_handler(self.trainer)
        resume.prepare_fit(self.trainer, self.config_init[self.subcommand])

    def fit(self, model: LightningModule, **kwargs: Any) -> None:
        """`trainer.fit`, run by LightningCLI in its place (the CLI calls its own method named after
        the subcommand when it has one: how a CLI subclass adds a subcommand), with Lightning's
        "not resumable" warning dropped where the resume is exact and a preempted fit turned into
        its exit code (75 or 130, `lit_rlhf.resume`)."""
        try:
            with resume.exact_resume_warnings(self.datamodule):
                self.trainer.fit(model, **kwargs)
        except SystemExit as exception:
            preempted = resume.preempted_exit(self.trainer, exception)
            if preempted is None:
                raise
            log.warning("run stopped: %s", preempted)
            raise preempted from None

    def instantiate_trainer(self, **kwargs: Any) -> Any:
        """The Trainer, with the default callbacks (`default_callbacks`, then the caller's) added
        to those the config lists; a refused setting (`max_steps: -5`) as one line."""
        config = self.config_init.get(str(self.subcommand), self.config_init)
        trainer_config = {**(config.get("trainer") or {}), **kwargs}
        listed = trainer_config.get("callbacks") or []
        listed = listed if isinstance(listed, list) else [listed]
        settings = self.config.get(str(self.subcommand), self.config)
        preemption = settings.get(PREEMPTION_FLAG, True) is not False
        extra = default_callbacks(trainer_config, listed, preemption=preemption)
        if self.more_default_callbacks is not None:
            extra += self.more_default_callbacks(trainer_config, listed + extra)
        try:
            trainer = super().instantiate_trainer(**{**kwargs, "callbacks": listed + extra})
        except MisconfigurationException as err:  # a refused value (max_steps: -5): one line, not a traceback
            raise TrainerSettingError(f"trainer: {err}") from err
        resolve_data_parallel_size(trainer)  # FSDP2: `data_parallel_size: auto` is every process
        return trainer


def default_callbacks(trainer_config: dict[str, Any], listed: list[Callback] = (), *,
                      preemption: bool = True) -> list[Callback]:
    """lit_rlhf's callbacks every run gets: a `PreemptionCheckpoint` (unless `listed` has one,
    `preemption` is False (`--preemption_checkpoint false`) or the trainer's checkpointing is off)."""
    enabled = preemption and trainer_config.get("enable_checkpointing", True) is not False
    if enabled and not any(isinstance(c, PreemptionCheckpoint) for c in listed):
        return [PreemptionCheckpoint()]
    return []


def register_project_classes() -> None:
    """Import the project's modules and DataModules so that `fit --help` lists them as known
    subclasses and `--model.help DPOModule` / `--data.help TLDRPreferenceDataModule` resolve the
    short names."""
    import lit_rlhf.data  # noqa: F401
    import lit_rlhf.modules  # noqa: F401


BASES = {"TrainingModule", "PolicyModule", "OfflineModule", "PairwiseModule", "OnlineModule", "RLHFDataModule"}  # not runnable alone


def fit_description() -> str:
    """The top of `fit --help`: where the methods' and DataModules' own arguments are."""
    import lit_rlhf.data
    import lit_rlhf.modules

    def names(package: Any, suffix: str) -> str:
        return ", ".join(sorted(n for n in package.__all__ if n.endswith(suffix) and n not in BASES))

    return (f"Train a method. A method's arguments: --model.help <method>, one of {names(lit_rlhf.modules, 'Module')}. "
            f"A DataModule's: --data.help <name>, one of {names(lit_rlhf.data, 'DataModule')}. Resume: --ckpt_path "
            "last. The options below are the Trainer's first, then the model's and the data's.")


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


def run(args: list[str] | None = None, default_callbacks: DefaultCallbacks | None = None) -> None:
    """The command line: `main` with a quiet console and the project's errors as one message.

    A project error (e.g. `ModelNotFoundError`, `DataSourceError`, a start-up check, a misspelled
    option) is printed as `error: <message>` on stderr with exit code 2; any other exception, and
    every exception with `--verbose` / LIT_RLHF_VERBOSE=1, propagates with its traceback."""
    verbose = console.verbose_requested()
    console.configure(verbose)
    hub.prepare_environment()  # idempotent: main.py already called it before Lightning's import
    report_errors(lambda: main(args, default_callbacks=default_callbacks), verbose)


def report_errors(call: Callable[[], Any], verbose: bool) -> None:
    """Run `call`; a project error (`project_error`) ends the process with `error: <message>` on
    stderr and exit code 2, any other exception (every one when `verbose`) propagates."""
    try:
        call()
    except Exception as err:
        found = project_error(err)
        if found is None or verbose:
            raise
        hint = ("`--help` lists the options" if isinstance(found, OptionError)
                else "run with --verbose for the traceback")
        print(f"{error_message(found)}\n({hint})", file=sys.stderr)
        raise SystemExit(2) from None


@resume.sigterm_exits_during_startup()  # SIGTERM before the trainer runs: exit 75 at once
def main(args: list[str] | None = None, run: bool = True, default_callbacks: DefaultCallbacks | None = None,
         **kwargs: Any) -> RLHFCLI:
    """Build (and with `run`, run) the CLI on `args`; `default_callbacks(trainer_config, listed)`
    adds the caller's default callbacks (main.py: the console's, `callbacks.default_callbacks`)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    register_project_classes()
    parser_kwargs = kwargs.pop("parser_kwargs", {})
    fit = parser_kwargs.setdefault("fit", {})
    fit.setdefault("description", fit_description())
    fit.setdefault("usage", "main.py fit --config CONFIG [--config CONFIG ...] [--OPTION VALUE ...] [--ckpt_path last]")
    return RLHFCLI(LightningModule, LightningDataModule, subclass_mode_model=True, subclass_mode_data=True,
                   save_config_kwargs={"overwrite": True},
                   auto_configure_optimizers=False,  # every module configures its own optimiser from its init args
                   args=args, run=run, default_callbacks=default_callbacks, parser_kwargs=parser_kwargs, **kwargs)
