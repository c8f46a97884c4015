"""What a mistake on the command line or in a config prints: one `error:` line, exit code 2.

Where jsonargparse prints the whole usage (and, for a class's argument, its union-validation
dump), `ProjectArgumentParser` raises an `OptionError` naming the option, where it was given and
the closest valid names, or the new place of an argument a class gave up
(`lit_rlhf.training.moved`):

    error: trainer.max_epoch (in sft.yaml, line 14) is not an option of `fit`; did you mean trainer.max_epochs?

`--verbose` keeps jsonargparse's own message. A value the Trainer refuses (`--trainer.max_steps
-5`) becomes a `TrainerSettingError` the same way.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any, Iterable

from lightning.pytorch.cli import LightningArgumentParser

# names other libraries use for an argument of ours (TRL / transformers' TrainingArguments)
ALIASES = {
    "learning_rate": "lr",
    "per_device_train_batch_size": "batch_size",
    "per_device_eval_batch_size": "eval_batch_size",
    "max_length": "max_completion_length",
}


class OptionError(ValueError):
    """An option the parser does not accept, or a value it cannot take; the message is one line."""

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key  # the dotted option at fault, when known


class TrainerSettingError(ValueError):
    """A value Lightning's Trainer refuses when it is built (e.g. `max_steps: -5`)."""


CKPT_PATH_HELP = ("a checkpoint file to resume from, or `last`: this run's last.ckpt (the logger's newest version_N "
                  "directory is reused; exit 2 when it has none, unless --fresh_if_no_checkpoint true; lit_rlhf.resume)")


class ProjectArgumentParser(LightningArgumentParser):
    """The CLI's parser: where jsonargparse would print its usage and exit, raise `OptionError`."""

    def error(self, message: str, ex: Exception | None = None):  # type: ignore[override]
        from jsonargparse._common import debug_mode_active

        from lit_rlhf import console

        if not self.exit_on_error or debug_mode_active() or console.verbose_requested():
            return super().error(message, ex)
        parser = getattr(ex, "subcommand_parser", None) or self
        raise OptionError(*short_message(parser, message))

    def add_method_arguments(self, theclass: Any, themethod: str, *args: Any, **kwargs: Any) -> Any:
        """Lightning's arguments of `Trainer.<themethod>`, `--ckpt_path`'s help saying what `last`
        means here (`lit_rlhf.resume`) instead of Lightning's."""
        added = super().add_method_arguments(theclass, themethod, *args, **kwargs)
        for action in self._actions:
            if action.dest == "ckpt_path":
                action.help = CKPT_PATH_HELP
        return added


def short_message(parser: Any, message: str) -> tuple[str, str | None]:
    """(one-line message, dotted key at fault or None) for jsonargparse's error `message`."""
    command = parser.prog.replace(" [options]", "").split()[-1]
    unknown = re.match(r"unrecognized arguments: (\S+)", message)
    if unknown and unknown.group(1).startswith("-"):
        key = unknown.group(1).lstrip("-").split("=", 1)[0]
        return unknown_option(key, option_keys(parser), f"an option of `{command}`"), key
    unknown = re.match(r"Subcommand '(\w+)' does not accept option '([^']+)'", message)
    if unknown:
        key = unknown.group(2)
        return unknown_option(key, option_keys(parser), f"an option of `{unknown.group(1)}`"), key
    keyed = re.match(r'Parser key "([^"]+)":\s*\n(.*)', message, re.S)
    if not keyed:
        return " ".join(line.strip() for line in message.strip().splitlines()), None
    where, detail = keyed.group(1), keyed.group(2)
    problem = re.search(r"Problem with given class_path '([^']+)':\s*\n\s*(.+?)(?:\n\s*- |\n\s*Given value|\Z)",
                        detail, re.S)
    if problem is None:
        return f"{where}: {' '.join(line.strip() for line in detail.strip().splitlines())}", where
    class_path, reason = problem.group(1), " ".join(line.strip() for line in problem.group(2).strip().splitlines())
    rejected = re.fullmatch(r"Option '([^']+)' is not accepted", reason)
    if rejected:
        name = rejected.group(1)
        prefix = f"{where}.init_args." if where in ("model", "data") else ""
        key = f"{prefix}{name}"
        former = name.split(".")[0]  # a mapping given to a former argument is rejected by its first field
        hint = moved_option(class_path, former)
        if hint is not None:
            return f"{prefix}{former} moved: {hint}", f"{prefix}{former}"
        return unknown_option(key, [f"{prefix}{n}" for n in class_arguments(class_path)],
                              f"an argument of {class_path}" + ("" if prefix else f" ({where})")), key
    return f"{where} ({class_path}): {reason}", where


def unknown_option(key: str, valid: Iterable[str], what: str) -> str:
    return moved_setting(key) or f"{key} is not {what}; {did_you_mean(key, valid)}"


def moved_setting(key: str) -> str | None:
    """The one-line pointer for a setting every online or trained module gave up (an online
    one to the rollout source, `lit_rlhf.online.moved`; a memory one to `memory`,
    `lit_rlhf.training.memory`), or None: `model.init_args.max_staleness` -> 'model.init_args.max_staleness
    moved: use rollout: {class_path: ...}'."""
    from lit_rlhf.online.moved import MOVED as ONLINE
    from lit_rlhf.training.memory import MOVED as MEMORY

    moved = {**ONLINE, **MEMORY}
    for part in key.split("."):
        if part in moved:
            return f"{key} moved: {moved[part]}"
    return None


def did_you_mean(key: str, valid: Iterable[str]) -> str:
    """'did you mean a, b?' with the valid names closest to `key` (an alias of ours first)."""
    valid = sorted(set(valid))
    if not valid:
        return "see --help for the valid names"
    head, _, leaf = key.rpartition(".")
    prefix = f"{head}." if head else ""
    close: list[str] = []
    alias = difflib.get_close_matches(leaf, list(ALIASES), n=1, cutoff=0.8)
    if alias and f"{prefix}{ALIASES[alias[0]]}" in valid:
        close.append(f"{prefix}{ALIASES[alias[0]]}")
    close += [m for m in difflib.get_close_matches(key, valid, n=3, cutoff=0.6) if m not in close]
    if not close:  # nothing alike by spelling: the nearest names of the same group
        same_group = [v for v in valid if v.startswith(prefix)] or valid
        close = difflib.get_close_matches(key, same_group, n=3, cutoff=0.0)
    return f"did you mean {', '.join(close[:3])}?"


def option_keys(parser: Any) -> list[str]:
    """The dotted options a (sub)command parser accepts (`trainer.max_steps`, `model`, ...)."""
    return [a.dest for a in getattr(parser, "_actions", []) if getattr(a, "dest", None)
            and a.dest not in ("help", "config", "print_config", "==SUPPRESS==") and not a.dest.startswith("__")]


def moved_option(class_path: str, name: str) -> str | None:
    """Where the class's former argument `name` went (`lit_rlhf.training.moved`: e.g.
    GRPOModule's `importance_sampling` -> "use GSPOModule"), or None."""
    from jsonargparse._util import import_object

    from lit_rlhf.training.moved import moved_options

    try:
        return moved_options(import_object(class_path)).get(name)
    except Exception:  # noqa: BLE001 - no hint rather than a second error
        return None


def class_arguments(class_path: str) -> list[str]:
    """The init arguments jsonargparse accepts for `class_path` (inherited ones included)."""
    from jsonargparse import ArgumentParser
    from jsonargparse._util import import_object

    try:
        cls = import_object(class_path)
        probe = ArgumentParser(exit_on_error=False)
        probe.add_class_arguments(cls, "x", fail_untyped=False)
    except Exception:  # noqa: BLE001 - no suggestion rather than a second error
        return []
    return [a.dest[2:] for a in probe._actions if getattr(a, "dest", "").startswith("x.")]


def config_files(args: list[str]) -> list[str]:
    """The `--config` / `-c` files of `args`, in order."""
    files = []
    for i, arg in enumerate(args):
        if arg in ("--config", "-c") and i + 1 < len(args):
            files.append(args[i + 1])
        elif arg.startswith("--config="):
            files.append(arg.split("=", 1)[1])
    return files


def where_given(key: str, args: list[str]) -> str | None:
    """'command line' when `key` was given as an option, else 'FILE, line N' of the first config
    that sets its last component, else None."""
    leaf = key.rsplit(".", 1)[-1]
    if any(a.lstrip("-").split("=", 1)[0].endswith(leaf) for a in args if a.startswith("--")):
        return "command line"
    pattern = re.compile(rf"^[\s-]*['\"]?{re.escape(leaf)}['\"]?\s*:")
    for name in config_files(args):
        try:
            lines = Path(name).read_text().splitlines()
        except OSError:
            continue
        for number, line in enumerate(lines, 1):
            if pattern.match(line):
                return f"{name}, line {number}"
    return None


def locate(err: OptionError, args: list[str]) -> OptionError:
    """`err` with where its option was given (config file and line, or the command line)."""
    where = None if err.key is None else where_given(err.key, args)
    return err if where is None else OptionError(str(err).replace(err.key, f"{err.key} ({where})", 1), err.key)
