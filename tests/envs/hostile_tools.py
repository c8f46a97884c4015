"""Tools that misbehave, for the robustness tests (module level: picklable by the process worker)."""

from __future__ import annotations

import time


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first.
        b: the second.
    """
    return a + b


def explode(text: str) -> str:
    """Always raises.

    Args:
        text: ignored.
    """
    raise RuntimeError(f"boom on {text}")


def hang(seconds: float) -> str:
    """Sleeps for `seconds` (past any sensible time limit).

    Args:
        seconds: how long.
    """
    time.sleep(seconds)
    return "woke up"


def spin(n: int) -> str:
    """Loops forever (CPU-bound, never returns).

    Args:
        n: ignored.
    """
    while True:
        n += 1


def garbage(n: int) -> object:
    """Returns an object that is neither text nor JSON data.

    Args:
        n: ignored.
    """
    return object()


def nan(n: int) -> float:
    """Returns NaN (not valid JSON).

    Args:
        n: ignored.
    """
    return float("nan")


def huge(n: int) -> str:
    """Returns `n` characters.

    Args:
        n: how many.
    """
    return "x" * n


def undecodable(n: int) -> str:
    """Returns bytes that are not UTF-8, read as text with `surrogateescape` (lone surrogates).

    Args:
        n: ignored.
    """
    return "read: " + b"\xff\xfe ok".decode("utf-8", "surrogateescape")
