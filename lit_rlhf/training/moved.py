"""Former arguments of a module and where they went: a class lists them in `moved_options` (name
-> hint, inherited), and a config or script using one stops with one line naming the new place
(`refuse_moved` from Python, `lit_rlhf.cli_errors` from the command line).
"""

from __future__ import annotations

from typing import Any


def moved_options(cls: type) -> dict[str, str]:
    """`cls`'s `moved_options` with its bases' (the subclass's entry wins)."""
    merged: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        merged.update(vars(klass).get("moved_options", {}))
    return merged


def refuse_moved(cls: type, kwargs: dict[str, Any]) -> None:
    """Raise `TypeError` for the first keyword argument of `kwargs` (none is expected): naming
    its new place when `cls` lists it as moved, else as Python words an unexpected argument."""
    moved = moved_options(cls)
    for name in kwargs:
        if name in moved:
            raise TypeError(f"{cls.__name__}: `{name}` moved: {moved[name]}")
        raise TypeError(f"{cls.__name__}.__init__() got an unexpected keyword argument '{name}'")
