"""ChatAPIJudge against a real HTTP server on 127.0.0.1 (see conftest.py)."""

from __future__ import annotations

import json
import logging
import pickle
import re
import socket
import threading
import time

import pytest

from lit_rlhf.judges import ChatAPIJudge, order_is_swapped, win_rate

KEY_ENV = "LIT_RLHF_TEST_JUDGE_KEY"
SECRET = "sk-test-SECRET-0123456789abcdef"
MARKER = "MARKER"


def make_judge(server, **overrides) -> ChatAPIJudge:
    kwargs = dict(
        base_url=server.base_url,
        model="judge-model",
        api_key_env=KEY_ENV,
        seed=7,
        max_concurrency=4,
        timeout_s=2.0,
        max_retries=2,
        backoff_base_s=0.01,
        backoff_max_s=0.05,
    )
    kwargs.update(overrides)
    return ChatAPIJudge(**kwargs)


def item_id(server, request) -> int:
    return int(re.search(r"item-(\d+)", server.user_message(request)).group(1))


def prefer_marker(server):
    """A judge that prefers the summary containing MARKER, wherever it is shown."""

    def behaviour(request):
        text = server.user_message(request)
        shown_b = text.split("Summary B:\n", 1)[1]
        letter = "B" if MARKER in shown_b.split("\n\nFIRST", 1)[0] else "A"
        return ("reply", f"Comparison: Summary {letter} says it.\nPreferred: {letter}")

    return behaviour


@pytest.fixture(autouse=True)
def api_key(monkeypatch):
    monkeypatch.setenv(KEY_ENV, SECRET)


def test_verdicts_map_back_through_the_random_order(chat_server):
    chat_server.behaviour = prefer_marker(chat_server)
    n = 40
    marker_in_a = [i % 3 != 0 for i in range(n)]
    prompts = [f"POST: item-{i}" for i in range(n)]
    a = [f"summary a{i} {MARKER}" if m else f"summary a{i}" for i, m in enumerate(marker_in_a)]
    b = [f"summary b{i}" if m else f"summary b{i} {MARKER}" for i, m in enumerate(marker_in_a)]

    judgements = make_judge(chat_server).judge(prompts, a, b)

    assert [j.winner for j in judgements] == ["a" if m else "b" for m in marker_in_a]
    assert [j.swapped for j in judgements] == [order_is_swapped(7, i) for i in range(n)]
    assert 0 < sum(j.swapped for j in judgements) < n  # both orders were really shown
    assert all(j.error is None and "Preferred:" in j.raw for j in judgements)
    # what the server saw: the shown order, the key in the header, greedy decoding
    for request in chat_server.requests:
        i = item_id(chat_server, request)
        first = b[i] if order_is_swapped(7, i) else a[i]
        assert f"Summary A:\n{first}\n" in chat_server.user_message(request)
        assert request["model"] == "judge-model" and request["temperature"] == 0.0
    assert {h["Authorization"] for h in chat_server.headers} == {f"Bearer {SECRET}"}
    assert len(chat_server.requests) == n


def test_mt_bench_template_reads_the_last_bracket_verdict_and_ties(chat_server):
    replies = {0: "[[A]] hmm, on reflection [[B]]", 1: "It is a tie: [[C]]", 2: "Verdict: [[A]]"}
    chat_server.behaviour = lambda r: ("reply", replies[item_id(chat_server, r)])
    judge = make_judge(chat_server, template="mt_bench", randomise_order=False)

    judgements = judge.judge([f"q item-{i}" for i in range(3)], ["x"] * 3, ["y"] * 3)

    assert [j.winner for j in judgements] == ["b", "tie", "a"]
    system = chat_server.requests[0]["messages"][0]
    assert system["role"] == "system" and '"[[C]]" for a tie' in system["content"]
    assert "[The Start of Assistant A's Answer]\nx\n" in chat_server.user_message(chat_server.requests[0])


def test_custom_template_keeps_braces_and_texts_verbatim(chat_server):
    chat_server.behaviour = lambda r: ("reply", "Preferred: B")
    judge = make_judge(chat_server, template='JSON {"k": 1}\nQ={prompt}\nA={a}\nB={b}', randomise_order=False)

    (j,) = judge.judge(["p {a} {b}"], ["first {prompt}"], ["second"])

    assert j.winner == "b"
    assert chat_server.user_message(chat_server.requests[0]) == 'JSON {"k": 1}\nQ=p {a} {b}\nA=first {prompt}\nB=second'


def test_5xx_and_429_are_retried_other_4xx_are_not(chat_server):
    attempts: dict[int, int] = {}
    fail_plan = {
        0: ("status", 500, "boom", {}),  # fails twice, then succeeds (max_retries=2)
        1: ("status", 429, "slow down", {"Retry-After": "0"}),  # likewise
        2: ("status", 503, "down", {}),  # always fails: invalid after 1 + 2 attempts
        3: ("status", 400, "bad request", {}),  # not retried
    }

    def behaviour(request):
        i = item_id(chat_server, request)
        with chat_server.lock:
            attempts[i] = attempts.get(i, 0) + 1
            k = attempts[i]
        if i == 2 or i == 3 or (i in fail_plan and k <= 2):
            return fail_plan[i]
        return ("reply", "Preferred: A")

    chat_server.behaviour = behaviour
    judge = make_judge(chat_server, randomise_order=False)
    start = time.monotonic()
    judgements = judge.judge([f"item-{i}" for i in range(5)], ["a"] * 5, ["b"] * 5)

    assert time.monotonic() - start < 5.0
    assert attempts == {0: 3, 1: 3, 2: 3, 3: 1, 4: 1}
    assert [j.winner for j in judgements] == ["a", "a", "invalid", "invalid", "a"]
    assert "HTTP 503" in judgements[2].error and "3 attempts" in judgements[2].error
    assert "HTTP 400" in judgements[3].error
    assert win_rate(judgements).invalid == 2


def test_a_hang_times_out_and_is_counted_invalid(chat_server):
    def behaviour(request):
        return ("hang", 1.0) if item_id(chat_server, request) == 1 else ("reply", "Preferred: B")

    chat_server.behaviour = behaviour
    judge = make_judge(chat_server, timeout_s=0.3, max_retries=1, randomise_order=False)
    start = time.monotonic()
    judgements = judge.judge([f"item-{i}" for i in range(3)], ["a"] * 3, ["b"] * 3)

    elapsed = time.monotonic() - start
    assert [j.winner for j in judgements] == ["b", "invalid", "b"]
    assert "timed out" in judgements[1].error
    assert sum(item_id(chat_server, r) == 1 for r in chat_server.requests) == 2  # retried once
    assert elapsed < 2.0  # 2 attempts x 0.3 s plus backoff, not 2 x the 1 s hang


def test_unparseable_and_malformed_replies_are_invalid_with_the_text_kept(chat_server):
    def behaviour(request):
        i = item_id(chat_server, request)
        if i == 0:
            return ("reply", "I would rather not say. Preferred: neither")
        if i == 1:
            return ("body", b"<html>not json</html>")
        return ("reply", "Preferred: A")

    chat_server.behaviour = behaviour
    judge = make_judge(chat_server, randomise_order=False)
    judgements = judge.judge(["item-0", "item-1", "item-2"], ["a"] * 3, ["b"] * 3)

    assert [j.winner for j in judgements] == ["invalid", "invalid", "a"]
    assert judgements[0].raw == "I would rather not say. Preferred: neither" and "unparseable" in judgements[0].error
    assert "malformed" in judgements[1].error and "not json" in judgements[1].error
    assert len(chat_server.requests) == 3  # neither is retried


def test_connection_refused_is_retried_then_invalid():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    judge = ChatAPIJudge(f"http://127.0.0.1:{port}/v1", "m", api_key_env=KEY_ENV, timeout_s=0.5,
                         max_retries=1, backoff_base_s=0.01)
    judgements = judge.judge(["p", "q"], ["a", "a"], ["b", "b"])
    assert [j.winner for j in judgements] == ["invalid", "invalid"]
    assert all("connection error" in j.error and "2 attempts" in j.error for j in judgements)


def test_concurrency_is_bounded(chat_server):
    # counted while a request's answer is being made, which ends before the reply is sent: the
    # server's own in-flight count ends after, so a client that got its reply may already have sent
    # the next request and that count can pass the client's bound by one
    lock, active, peak = threading.Lock(), [0], [0]

    def behaviour(request):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.05)
        with lock:
            active[0] -= 1
        return ("reply", "Preferred: A")

    chat_server.behaviour = behaviour
    judge = make_judge(chat_server, max_concurrency=3)
    judgements = judge.judge([f"item-{i}" for i in range(12)], ["a"] * 12, ["b"] * 12)
    assert all(j.winner in ("a", "b") for j in judgements)
    assert 2 <= peak[0] <= 3


def test_the_api_key_never_leaks(chat_server, caplog):
    def behaviour(request):
        i = item_id(chat_server, request)
        auth = chat_server.headers[-1].get("Authorization", "")
        if i == 0:  # a hostile/buggy server that echoes the credentials back
            return ("status", 401, f"invalid credentials: {auth}", {})
        if i == 1:
            return ("status", 500, f"upstream error for {auth}", {})
        return ("reply", f"you sent {auth}. Preferred: A")

    chat_server.behaviour = behaviour
    caplog.set_level(logging.DEBUG)
    judge = make_judge(chat_server, max_retries=1)
    judgements = judge.judge(["item-0", "item-1", "item-2"], ["a"] * 3, ["b"] * 3)

    assert {h["Authorization"] for h in chat_server.headers} == {f"Bearer {SECRET}"}  # it was used
    assert [j.winner for j in judgements][:2] == ["invalid", "invalid"] and judgements[2].winner != "invalid"
    assert "HTTP 401" in judgements[0].error and "***" in judgements[0].error
    places = {
        "logs": caplog.text,
        "repr": repr(judge),
        "judgements": repr(judgements),
        "config json": json.dumps(judge.config()),
        "pickle": pickle.dumps(judge).decode("latin-1"),
        "attributes": repr(vars(judge)),
    }
    assert caplog.text  # the failures were logged
    for where, text in places.items():
        assert SECRET not in text, f"the API key leaked into {where}"
    assert judge.config()["api_key_env"] == KEY_ENV
    assert ChatAPIJudge(**judge.config()).config() == judge.config()  # the config rebuilds the judge


def test_no_key_sends_no_authorization_header(chat_server, monkeypatch):
    monkeypatch.delenv(KEY_ENV)
    chat_server.behaviour = lambda r: ("reply", "Preferred: A")
    (j,) = make_judge(chat_server).judge(["p"], ["a"], ["b"])
    assert j.winner in ("a", "b")
    assert "Authorization" not in chat_server.headers[0]


def test_position_bias_is_averaged_out_by_the_random_order(chat_server):
    """A judge that always answers "A" measures ~50% once the order is randomised.

    With the order a fair coin per item, the measured win rate is (number of unswapped items)/n,
    a Binomial(n, 1/2)/n draw: standard deviation 0.5/sqrt(200) = 0.035 for n = 200. The seed
    fixes the draw; we assert it equals the unswapped fraction exactly and lies within +-0.1
    (about 2.8 sd) of 0.5. Without randomisation the same judge gives a win rate of 1.
    """
    chat_server.behaviour = lambda r: ("reply", "Comparison: the first one.\nPreferred: A")
    n = 200
    prompts, a, b = [f"item-{i}" for i in range(n)], ["a"] * n, ["b"] * n

    judgements = make_judge(chat_server, max_concurrency=8).judge(prompts, a, b)
    stats = win_rate(judgements)
    assert stats.n == n and stats.invalid == 0
    assert stats.win_rate == pytest.approx(sum(not order_is_swapped(7, i) for i in range(n)) / n)
    assert abs(stats.win_rate - 0.5) < 0.1
    assert stats.ci_low < 0.5 < stats.ci_high

    biased = make_judge(chat_server, randomise_order=False).judge(prompts[:20], a[:20], b[:20])
    assert win_rate(biased).win_rate == 1.0


def test_an_unforeseen_error_stays_confined_to_its_item(chat_server, monkeypatch):
    chat_server.behaviour = lambda r: ("reply", "Preferred: A")
    judge = make_judge(chat_server, randomise_order=False)
    real_post = judge._post

    def flaky_post(data, key):
        if b"item-1" in data:
            raise UnicodeError(f"cannot encode {key}")
        return real_post(data, key)

    monkeypatch.setattr(judge, "_post", flaky_post)
    judgements = judge.judge(["item-0", "item-1"], ["a", "a"], ["b", "b"])
    assert [j.winner for j in judgements] == ["a", "invalid"]
    assert "UnicodeError" in judgements[1].error and SECRET not in judgements[1].error
