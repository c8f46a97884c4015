"""Tools (`docs/guides/environments.md`): plain typed Python callables with a Google-style
docstring, their schemas (`tool_schema`: from the signature and the summary and `Args:` lines),
the Hermes-style call format (`parse_tool_calls`: `<tool_call>{"name": ..., "arguments": {...}}
</tool_call>`) and a guarded runner.

`ToolRunner.call` never raises: every failure becomes a `ToolCall` whose `error` names its kind
and whose `output` is what the policy sees (lone surrogates replaced, `envs.base.safe_text`). A
call that times out is abandoned: in `thread` isolation its daemon thread runs on until it
returns or the process exits (no `finally` run then); a tool that may loop forever or must clean
up belongs in `process` isolation, whose worker is killed and replaced.
"""

from __future__ import annotations

import inspect
import json
import re
import threading
import time
import typing
from typing import Any, Callable, Literal

from lit_rlhf.envs.base import ToolCall, safe_text
from lit_rlhf.envs.worker import ProcessWorker

CALL_PATTERN = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
OPEN_TAG = "<tool_call>"

_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object"}


def _json_type(annotation: Any) -> str:
    origin = typing.get_origin(annotation) or annotation
    if origin in _JSON_TYPES:
        return _JSON_TYPES[origin]
    raise TypeError(f"tool parameter type {annotation!r} has no JSON schema type: use str, int, float, bool, "
                    "list or dict")


def _docstring_parts(fn: Callable) -> tuple[str, dict[str, str]]:
    """(summary, {parameter: description}) from a Google-style docstring: its first paragraph and
    the entries of its `Args:` section."""
    from docstring_parser import DocstringStyle, parse

    doc = inspect.getdoc(fn) or ""
    params = {p.arg_name: " ".join((p.description or "").split()) for p in parse(doc, DocstringStyle.GOOGLE).params}
    return doc.split("\n\n", 1)[0].replace("\n", " ").strip(), params


def tool_name(fn: Callable) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__


def tool_schema(fn: Callable) -> dict[str, Any]:
    """The JSON schema of a tool: `{"name", "description", "parameters": {"type": "object",
    "properties": {name: {"type", "description"}}, "required": [...]}}`, from its signature
    and docstring. Raises TypeError for a parameter without a supported type annotation."""
    summary, docs = _docstring_parts(fn)
    hints = typing.get_type_hints(fn)
    properties, required = {}, []
    for name, param in inspect.signature(fn).parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"tool {tool_name(fn)!r}: *args/**kwargs cannot be described to the policy")
        if name not in hints:
            raise TypeError(f"tool {tool_name(fn)!r}: parameter {name!r} needs a type annotation")
        prop = {"type": _json_type(hints[name])}
        if name in docs:
            prop["description"] = docs[name]
        properties[name] = prop
        if param.default is param.empty:
            required.append(name)
    if not summary:
        raise TypeError(f"tool {tool_name(fn)!r} needs a docstring: its first paragraph describes it to the policy")
    return {"name": tool_name(fn), "description": summary,
            "parameters": {"type": "object", "properties": properties, "required": required}}


def parse_tool_calls(text: str) -> list[tuple[str | None, Any, str | None]]:
    """Every call in `text` -> [(name, arguments, parse error)]: name and arguments when the
    call is well formed, (None, raw text, message) when it is not. An opening tag with no
    closing tag is a malformed call too."""
    calls: list[tuple[str | None, Any, str | None]] = []
    for raw in CALL_PATTERN.findall(text):
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as err:
            calls.append((None, raw, f"the call is not valid JSON ({err.msg} at character {err.pos})"))
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            calls.append((None, raw, 'a call is a JSON object {"name": <tool>, "arguments": {...}}'))
            continue
        arguments = obj.get("arguments", {})
        if isinstance(arguments, str):  # some models write the arguments as a JSON string
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                pass
        calls.append((obj["name"], arguments, None))
    tail = text.rsplit("</tool_call>", 1)[-1]
    if OPEN_TAG in tail:
        calls.append((None, tail[tail.index(OPEN_TAG):], "a <tool_call> tag is not closed with </tool_call>"))
    return calls


def bind_arguments(fn: Callable, arguments: Any) -> dict[str, Any]:
    """The keyword arguments of a call, checked against the tool's signature and converted to
    its annotated types (an integral float for an int, a number for a str, ...); ValueError
    naming the problem otherwise."""
    if not isinstance(arguments, dict):
        raise ValueError(f"arguments must be a JSON object, got {type(arguments).__name__}")
    signature = inspect.signature(fn)
    hints = typing.get_type_hints(fn)
    unknown = sorted(set(arguments) - set(signature.parameters))
    if unknown:
        raise ValueError(f"unexpected argument(s) {unknown}; the tool takes {list(signature.parameters)}")
    out = {}
    for name, param in signature.parameters.items():
        if name not in arguments:
            if param.default is param.empty:
                raise ValueError(f"missing argument {name!r}")
            continue
        out[name] = _convert(arguments[name], hints.get(name, Any), name)
    return out


def _convert(value: Any, annotation: Any, name: str) -> Any:
    target = typing.get_origin(annotation) or annotation
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if target is Any or (isinstance(value, bool) if target is bool else
                         target not in (int, float, str) and isinstance(value, target)):
        return value
    if target is int and (number and (isinstance(value, int) or value.is_integer())
                          or isinstance(value, str) and re.fullmatch(r"\s*[-+]?\d+\s*", value)):
        return int(value)
    if target in (float, str) and (number or isinstance(value, str)):
        try:
            return target(value)
        except ValueError:
            pass
    raise ValueError(f"argument {name!r} must be {_json_type(annotation)}, got {json.dumps(value)[:80]}")


def render_output(value: Any, max_chars: int) -> str:
    """A tool's return value as the text the policy sees (JSON for data); ValueError for a
    value that is not text, a number, a bool or JSON-serialisable data."""
    if isinstance(value, str):
        text = value
    elif value is None or isinstance(value, (bool, int, float, list, dict)):
        try:
            text = json.dumps(value, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as err:
            raise ValueError(f"the tool returned data that is not JSON-serialisable ({err})") from err
    else:
        raise ValueError(f"the tool returned a {type(value).__name__}, not text, a number or JSON data")
    if len(text) > max_chars:
        text = text[:max_chars] + f"... [{len(text) - max_chars} more characters cut]"
    return text


def run_in_daemon_thread(fn: Callable, kwargs: dict[str, Any], timeout: float) -> tuple[str, Any]:
    """`fn(**kwargs)` in a daemon thread, waited for `timeout` seconds -> `("ok", result)`,
    `("raised", message)` or `("timeout", None)`. A call past its limit is left running: being a
    daemon, its thread does not hold the interpreter open at exit (see the module docstring)."""
    outcome: list[tuple[str, Any]] = []

    def target() -> None:
        try:
            outcome.append(("ok", fn(**kwargs)))
        except BaseException as err:  # noqa: BLE001 - even SystemExit from a tool is the policy's observation
            outcome.append(("raised", f"{type(err).__name__}: {err}"))

    thread = threading.Thread(target=target, name=f"lit_rlhf_tool_{tool_name(fn)}", daemon=True)
    thread.start()
    thread.join(timeout)
    return outcome[0] if outcome else ("timeout", None)


class ToolRunner:
    """Runs tool calls with a time limit and turns every failure into an error `ToolCall`.

    Args:
        tools: the tool functions (each described by `tool_schema`); names must be unique.
        timeout: seconds a call may run before it is abandoned (`timeout` error).
        isolation: `thread` (the call runs in a daemon thread of this process; a call past its
            time limit runs on in the background until it returns or the process exits) or
            `process` (in a worker process, killed and replaced when a call times out; tools and
            their arguments must be picklable: module-level functions).
        max_output_chars: longer outputs are cut (with a note saying how much).
    """

    def __init__(self, tools: list[Callable], timeout: float = 5.0, isolation: Literal["thread", "process"] = "thread",
                 max_output_chars: int = 1000) -> None:
        if isolation not in ("thread", "process"):
            raise ValueError(f"isolation must be 'thread' or 'process', got {isolation!r}")
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        self.tools: dict[str, Callable] = {}
        for fn in tools:
            if not callable(fn):
                raise TypeError(f"tools must be callables, got {fn!r}")
            name = tool_name(fn)
            if name in self.tools:
                raise ValueError(f"two tools are named {name!r}")
            tool_schema(fn)  # refuse an undescribable tool now, not at its first call
            self.tools[name] = fn
        self.timeout, self.isolation, self.max_output_chars = float(timeout), isolation, int(max_output_chars)
        self._worker = ProcessWorker() if isolation == "process" else None
        self._lock = threading.Lock()

    def schemas(self) -> list[dict[str, Any]]:
        return [tool_schema(fn) for fn in self.tools.values()]

    def call(self, name: str | None, arguments: Any, parse_error: str | None = None) -> ToolCall:
        """Run one parsed call (`parse_tool_calls`' triple) -> its `ToolCall`; never raises."""
        if parse_error is not None:
            return ToolCall("<unparsed>", arguments, f"error: malformed tool call: {parse_error}", "parse")
        fn = self.tools.get(name)
        if fn is None:
            return ToolCall(str(name), arguments, f"error: unknown tool {name!r}; the tools are {sorted(self.tools)}",
                            "unknown_tool")
        try:
            kwargs = bind_arguments(fn, arguments)
        except ValueError as err:
            return ToolCall(name, arguments, f"error: bad arguments for {name}: {err}", "bad_arguments")
        started = time.perf_counter()
        status, value = self._run(fn, kwargs)
        seconds = time.perf_counter() - started
        if status == "timeout":
            return ToolCall(name, arguments, f"error: {name} did not finish within {self.timeout:g} s", "timeout", seconds)
        if status != "ok":
            return ToolCall(name, arguments, safe_text(f"error: {name} failed: {value}"), status, seconds)
        try:
            return ToolCall(name, arguments, safe_text(render_output(value, self.max_output_chars)), None, seconds)
        except ValueError as err:
            return ToolCall(name, arguments, safe_text(f"error: {err}"), "bad_output", seconds)

    def _run(self, fn: Callable, kwargs: dict[str, Any]) -> tuple[str, Any]:
        if self._worker is not None:
            with self._lock:
                return self._worker.call(fn, kwargs, self.timeout)
        return run_in_daemon_thread(fn, kwargs, self.timeout)

    def close(self) -> None:
        if self._worker is not None:
            self._worker.stop()

    def __getstate__(self) -> dict[str, Any]:  # `Environment.fork` deep-copies: no live process or lock
        state = dict(self.__dict__)
        state["_worker"] = ProcessWorker() if self.isolation == "process" else None
        state["_lock"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
