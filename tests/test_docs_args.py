"""Every public argument has a description in its docstring's Google-style `Args:` section, which
the API reference renders as a parameter table.

Checked: the constructor of every LightningModule exported by `lit_rlhf.modules` (and
`OnlineModule`), every DataModule exported by `lit_rlhf.data`, every Lightning callback exported
by `callbacks`, and every function exported by `lit_rlhf.losses`. A constructor's arguments may be
described in the class docstring or in `__init__`'s; `*args`/`**kwargs` and names starting with
`_` are not public. An inherited argument may be described on the base class that declares it.
"""

from __future__ import annotations

import inspect
import re

import pytest
from lightning import Callback, LightningDataModule, LightningModule

import callbacks
import lit_rlhf.data
import lit_rlhf.losses
import lit_rlhf.modules
from lit_rlhf.modules.online import OnlineModule

SECTION = re.compile(r"^(\s*)(Args|Arguments|Parameters):\s*$")
ENTRY = re.compile(r"^\s*\**(\w+)(\s*\([^)]*\))?:(\s|$)")


def described(doc: str | None) -> dict[str, str]:
    """Argument name -> description, from the `Args:` section(s) of a Google-style docstring."""
    found: dict[str, str] = {}
    lines = inspect.cleandoc(doc or "").split("\n")
    for i, line in enumerate(lines):
        section = SECTION.match(line)
        if not section:
            continue
        indent, entry_indent, name = len(section.group(1)), None, None
        for item in lines[i + 1:]:
            if not item.strip():
                continue
            depth = len(item) - len(item.lstrip())
            if depth <= indent:
                break
            entry = ENTRY.match(item)
            if entry and (entry_indent is None or depth == entry_indent):
                entry_indent, name = depth, entry.group(1)
                found[name] = item[entry.end():].strip()
            elif name is not None:
                found[name] = (found[name] + " " + item.strip()).strip()
    return found


def public_parameters(function) -> list[str]:
    return [p.name for p in inspect.signature(function).parameters.values()
            if p.name not in ("self", "cls") and not p.name.startswith("_")
            and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def undescribed(obj) -> list[str]:
    """The public arguments of a function, or of a class's constructor, that have no description."""
    if inspect.isclass(obj):  # an inherited argument may be described on the base that declares it
        docs = {}
        for klass in reversed(obj.__mro__):
            docs.update(described(klass.__doc__))
            docs.update(described(vars(klass)["__init__"].__doc__ if "__init__" in vars(klass) else ""))
        names = public_parameters(obj.__init__) if "__init__" in vars(obj) else []
    else:
        docs, names = described(obj.__doc__), public_parameters(obj)
    return [name for name in names if not docs.get(name)]


def exported(module, kind=None) -> list:
    objects = [getattr(module, name) for name in module.__all__]
    if kind is None:
        return [o for o in objects if inspect.isfunction(o)]
    return [o for o in objects if inspect.isclass(o) and issubclass(o, kind)]


CHECKED = {
    "module": [*exported(lit_rlhf.modules, LightningModule), OnlineModule],
    "callback": exported(callbacks, Callback),
    "loss": exported(lit_rlhf.losses),
}
DATAMODULES = exported(lit_rlhf.data, LightningDataModule)


def test_the_checked_sets_are_whole():
    assert len(CHECKED["module"]) >= 20 and len(CHECKED["callback"]) >= 8 and len(CHECKED["loss"]) >= 40
    assert len(DATAMODULES) >= 8


@pytest.mark.parametrize("obj", [o for objs in CHECKED.values() for o in objs], ids=lambda o: o.__qualname__)
def test_every_public_argument_is_described(obj):
    missing = undescribed(obj)
    assert not missing, f"{obj.__module__}.{obj.__qualname__}: no description in its docstring's Args: for {missing}"


@pytest.mark.parametrize("datamodule", DATAMODULES, ids=lambda o: o.__qualname__)
def test_every_datamodule_argument_is_described(datamodule):
    missing = undescribed(datamodule)
    assert not missing, f"{datamodule.__module__}.{datamodule.__qualname__}: no description in its docstring's Args: for {missing}"


def test_the_reader_finds_described_and_undescribed_arguments():
    def loss(logps, mask, beta: float = 0.1, *rest, _private=None, **kwargs):
        """A loss.

        Args:
            logps (Tensor): (B, T) log-probs,
                over two lines.
            beta: strength.
            mask:

        Returns:
            Something: not an argument.
        """

    assert described(loss.__doc__) == {"logps": "(B, T) log-probs, over two lines.", "beta": "strength.", "mask": ""}
    assert undescribed(loss) == ["mask"]

    class Module:
        """A module.

        Args:
            lr: learning rate.
        """

        def __init__(self, lr: float, beta: float, **kwargs) -> None:
            """Builds it.

            Args:
                beta: strength.
            """

    assert undescribed(Module) == []

    class NewArgument(Module):
        """A module with an argument its docstring forgets."""

        def __init__(self, lr: float, gamma: float = 1.0, **kwargs) -> None:
            super().__init__(lr, 0.1)

    assert undescribed(NewArgument) == ["gamma"]  # `lr` is described on the base that declares it
