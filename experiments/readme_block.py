"""A table a driver writes into experiments/README.md between `<!-- reading:NAME -->` and
`<!-- /reading:NAME -->`, so the page shows exactly what the result files hold."""

from __future__ import annotations

from pathlib import Path


def markers(name: str) -> tuple[str, str]:
    return f"<!-- reading:{name} -->\n", f"<!-- /reading:{name} -->"


def block(text: str, name: str) -> str:
    """The body of `text`'s block NAME (ValueError when it has none)."""
    begin, end = markers(name)
    if begin not in text or end not in text:
        raise ValueError(f"no block {begin.strip()} ... {end}")
    return text.split(begin, 1)[1].split(end, 1)[0]


def render_into(readme: str | Path, name: str, table: str) -> bool:
    """Put `table` into `readme`'s block NAME; True when the file changed."""
    readme = Path(readme)
    text = readme.read_text()
    begin, end = markers(name)
    try:
        old = block(text, name)
    except ValueError as err:
        raise ValueError(f"{readme} has {err}") from None
    new = text.replace(begin + old + end, begin + table + end, 1)
    readme.write_text(new)
    return new != text
