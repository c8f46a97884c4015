"""Tools: schemas from signatures and docstrings, the call format, and the guarded runner."""

from __future__ import annotations

import time

import pytest

from lit_rlhf.envs import ToolRunner, calculator, parse_tool_calls, tool_schema
from lit_rlhf.envs.tools import bind_arguments
from tests.envs import hostile_tools as hostile


def test_schema_from_signature_and_docstring():
    def lookup(city: str, year: int, exact: bool = False) -> str:
        """Look a city up.

        Args:
            city: the city's name,
                as written locally.
            year (int): the year.
            exact: match exactly.

        Returns:
            the entry.
        """
        return city

    assert tool_schema(lookup) == {
        "name": "lookup",
        "description": "Look a city up.",
        "parameters": {"type": "object", "required": ["city", "year"], "properties": {
            "city": {"type": "string", "description": "the city's name, as written locally."},
            "year": {"type": "integer", "description": "the year."},
            "exact": {"type": "boolean", "description": "match exactly."},
        }},
    }


def test_schema_refuses_undescribable_tools():
    def untyped(x):
        """Doc."""

    def undocumented(x: int):
        pass

    with pytest.raises(TypeError, match="type annotation"):
        tool_schema(untyped)
    with pytest.raises(TypeError, match="docstring"):
        tool_schema(undocumented)
    with pytest.raises(TypeError, match="docstring"):
        ToolRunner([undocumented])


def test_parse_tool_calls():
    text = ('a <tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call> b '
            '<tool_call>{"name": "add", "arguments": "{\\"a\\": 3, \\"b\\": 4}"}</tool_call>'
            '<tool_call>{"name": 5}</tool_call><tool_call>not json</tool_call> <tool_call>{"name"')
    calls = parse_tool_calls(text)
    assert calls[0] == ("add", {"a": 1, "b": 2}, None)
    assert calls[1] == ("add", {"a": 3, "b": 4}, None)  # arguments given as a JSON string
    assert [c[0] for c in calls[2:]] == [None, None, None]
    assert "JSON object" in calls[2][2] and "not valid JSON" in calls[3][2] and "not closed" in calls[4][2]
    assert parse_tool_calls("no call here") == []


def test_bind_arguments_converts_and_refuses():
    assert bind_arguments(hostile.add, {"a": 2.0, "b": "3"}) == {"a": 2, "b": 3}
    for bad, message in [({"a": 1}, "missing argument 'b'"), ({"a": 1, "b": 2, "c": 3}, "unexpected"),
                         ({"a": 1.5, "b": 2}, "must be integer"), ({"a": True, "b": 2}, "must be integer"),
                         ([1, 2], "JSON object")]:
        with pytest.raises(ValueError, match=message):
            bind_arguments(hostile.add, bad)


def test_calculator():
    assert calculator("(12 + 30) / 7") == "6"
    assert calculator("7 / 2") == "3.5"
    assert calculator("2 ** 10 - 1") == "1023"
    for bad in ["__import__('os')", "2 ** 1000", "a + 1", "1 +"]:
        with pytest.raises((ValueError, SyntaxError)):
            calculator(bad)


def test_runner_turns_every_failure_into_an_error_observation():
    runner = ToolRunner([hostile.add, hostile.explode, hostile.hang, hostile.garbage, hostile.nan, hostile.huge,
                         calculator], timeout=0.3, max_output_chars=50)
    ok = runner.call("add", {"a": 2, "b": 3})
    assert (ok.output, ok.error) == ("5", None)
    cases = {
        "raised": runner.call("explode", {"text": "x"}),
        "timeout": runner.call("hang", {"seconds": 30}),
        "bad_output": runner.call("garbage", {"n": 1}),
        "unknown_tool": runner.call("nope", {}),
        "bad_arguments": runner.call("add", {"a": "two", "b": 1}),
        "parse": runner.call(*parse_tool_calls("<tool_call>{oops</tool_call>")[0]),
    }
    for kind, call in cases.items():
        assert call.error == kind, (kind, call)
        assert call.output.startswith("error:"), call
    assert "RuntimeError: boom on x" in cases["raised"].output
    assert cases["timeout"].seconds < 5
    assert runner.call("nan", {"n": 1}).error == "bad_output"  # NaN is not JSON
    assert runner.call("calculator", {"expression": "1 / 0"}).error == "raised"
    cut = runner.call("huge", {"n": 500})
    assert cut.error is None and len(cut.output) < 120 and "450 more characters cut" in cut.output


def test_process_isolation_kills_a_spinning_tool():
    """A CPU-bound tool that never returns: its worker process is killed at the time limit and
    the next call runs in a fresh one."""
    runner = ToolRunner([hostile.spin, hostile.add], timeout=0.5, isolation="process")
    try:
        assert runner.call("add", {"a": 1, "b": 1}).output == "2"  # starts the worker (spawn)
        started = time.perf_counter()
        call = runner.call("spin", {"n": 0})
        assert call.error == "timeout" and time.perf_counter() - started < 5
        assert runner.call("add", {"a": 2, "b": 2}).output == "4"  # a new worker
        assert runner.call("spin", {"n": "x"}).error == "bad_arguments"
    finally:
        runner.close()


HANGING_RUN = """
import time
from lit_rlhf.envs import ToolRunner
from tests.envs.hostile_tools import hang
call = ToolRunner([hang], timeout=0.5).call("hang", {"seconds": 60})
print(call.error, time.time(), flush=True)
"""


def test_a_timed_out_tool_does_not_keep_the_process_alive():
    """With thread isolation the abandoned call keeps running, but the process exits when its
    work is done, not when the tool returns 60 s later."""
    import subprocess
    import sys

    from tests.helpers import REPO_ROOT, subprocess_env

    try:
        done = subprocess.run([sys.executable, "-c", HANGING_RUN], cwd=REPO_ROOT, env=subprocess_env(),
                              capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("the process was still alive 30 s after it started: the timed-out tool kept it running")
    exited = time.time()
    assert done.returncode == 0, done.stderr[-3000:]
    error, returned = done.stdout.split()
    assert error == "timeout"
    assert exited - float(returned) < 5, f"the process lived {exited - float(returned):.1f} s after the call returned"


def test_tool_text_with_lone_surrogates_is_made_safe():
    runner = ToolRunner([hostile.undecodable, hostile.explode])
    call = runner.call("undecodable", {"n": 1})
    assert call.error is None and call.output == "read: \ufffd\ufffd ok"
    call.output.encode("utf-8")  # encodable: what a tokenizer and a logger need
    raised = runner.call("explode", {"text": "\udcff"})  # an error message quoting the bad text
    assert raised.error == "raised" and "boom on \ufffd" in raised.output
