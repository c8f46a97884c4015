"""A judge behind any OpenAI-compatible `/v1/chat/completions` endpoint (OpenAI, vLLM, TGI, ...),
standard library only (`urllib.request`, a `ThreadPoolExecutor` for bounded concurrency).

Per item: connection errors, timeouts, HTTP 429 and 5xx are retried `max_retries` times with
exponential backoff and jitter (`Retry-After` honoured up to `backoff_max_s`); other HTTP errors
are not. An item that still fails, or whose reply has no verdict, is `invalid` with the reason in
`error`; `judge` never raises for it. The API key is read from the environment variable named
`api_key_env` at request time and appears only in the Authorization header (not in attributes,
`repr`, `config()`, pickles or logs; error texts that echo it are redacted).
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import logging
import os
import random
import socket
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from lit_rlhf.judges.base import RandomOrderJudge, ShownVerdict
from lit_rlhf.judges.templates import JudgeTemplate, get_template

log = logging.getLogger(__name__)

_RETRY_STATUS = frozenset({429, 500, 502, 503, 504}) | frozenset(range(505, 600))
_MAX_ERROR_BODY = 300


class _Retryable(Exception):
    """A failure worth another attempt; `wait_s` is a server-requested minimum wait, if any."""

    def __init__(self, message: str, wait_s: float | None = None) -> None:
        super().__init__(message)
        self.wait_s = wait_s


class _Fatal(Exception):
    """A failure another attempt will not fix (HTTP 4xx other than 429, a malformed reply)."""


class ChatAPIJudge(RandomOrderJudge):
    """Pairwise judge that asks a chat model through an OpenAI-compatible HTTP API.

    Args:
        base_url: the API root, e.g. "https://api.openai.com/v1" or "http://127.0.0.1:8000/v1";
            requests go to `{base_url}/chat/completions` (a base_url that already ends with
            "/chat/completions" is used as is).
        model: the model name sent in the request.
        api_key_env: name of the environment variable holding the key, read at request time; None,
            or a variable that is unset or empty, sends no Authorization header (local servers).
        template: "tldr" (the N+ paper's summary comparison, verdict "Preferred: A|B"), "mt_bench"
            (MT-Bench pairwise, verdict [[A]]/[[B]]/[[C]]=tie), or a custom user-message string with
            {prompt}, {a}, {b} (read by whichever verdict format appears last), or a JudgeTemplate.
        seed: seeds the per-item A/B presentation order (`base.order_is_swapped(seed, index)`).
        randomise_order: False shows every pair as (a, b), e.g. to measure position bias.
        max_concurrency: requests in flight at once.
        timeout_s: socket timeout of one attempt (connect, and each read of the reply).
        max_retries: extra attempts after the first on retryable failures.
        backoff_base_s: the wait before retry k (k = 0, 1, ...) is drawn uniformly from [d/2, d]
            with d = min(backoff_max_s, backoff_base_s * 2**k).
        backoff_max_s: the longest wait before a retry (d above).
        temperature: the sampling temperature sent with each request (greedy by default).
        max_tokens: the longest reply asked for in each request.
    """

    def __init__(self, base_url: str, model: str, api_key_env: str | None = "OPENAI_API_KEY",
                 template: str | dict | JudgeTemplate = "tldr", seed: int = 0, randomise_order: bool = True,
                 max_concurrency: int = 8, timeout_s: float = 60.0, max_retries: int = 3, backoff_base_s: float = 1.0,
                 backoff_max_s: float = 30.0, temperature: float = 0.0, max_tokens: int = 256) -> None:
        super().__init__(seed=seed, randomise_order=randomise_order)
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.base_url = base_url
        self.model = model
        self.api_key_env = api_key_env
        self.template = get_template(template)
        self.max_concurrency = int(max_concurrency)
        self.timeout_s = float(timeout_s)
        self.max_retries = int(max_retries)
        self.backoff_base_s = float(backoff_base_s)
        self.backoff_max_s = float(backoff_max_s)
        self.temperature = float(temperature)
        self.max_tokens = int(max_tokens)
        self._template_arg = template if isinstance(template, str) else dataclasses.asdict(self.template)

    @property
    def url(self) -> str:
        base = self.base_url.rstrip("/")
        return base if base.endswith("/chat/completions") else base + "/chat/completions"

    def config(self) -> dict[str, Any]:
        """The constructor arguments (JSON-serialisable; the key's variable NAME only, never the key)."""
        names = ("base_url", "model", "api_key_env", "template", "seed", "randomise_order", "max_concurrency",
                 "timeout_s", "max_retries", "backoff_base_s", "backoff_max_s", "temperature", "max_tokens")
        return {k: self._template_arg if k == "template" else getattr(self, k) for k in names}

    def __repr__(self) -> str:
        shown = {k: v for k, v in self.config().items() if k != "template"}
        args = ", ".join(f"{k}={v!r}" for k, v in shown.items())
        return f"{type(self).__name__}({args}, template={self.template.name!r})"

    def _judge_shown(self, prompts: list[str], firsts: list[str], seconds: list[str]):
        return self._each(self._judge_one, prompts, firsts, seconds)

    def _each(self, fn: Callable, *columns: list) -> list:
        """`fn(index, *row)` for every row of `columns`, `max_concurrency` rows at a time."""
        if not columns[0]:
            return []
        workers = min(self.max_concurrency, len(columns[0]))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="chat-judge") as pool:
            return list(pool.map(fn, range(len(columns[0])), *columns))

    def _reply(self, index: int, messages: list[dict[str, str]]) -> tuple[str, str | None]:
        """(the reply's text, None), or ("", why) when no reply came; never raises."""
        body = {"model": self.model, "messages": messages, "temperature": self.temperature,
                "max_tokens": self.max_tokens}
        try:
            return self._request_with_retries(index, json.dumps(body).encode("utf-8")), None
        except _Fatal as err:
            message = str(err)
        except Exception as err:  # anything unforeseen stays confined to its item
            key = os.environ.get(self.api_key_env) if self.api_key_env else None
            message = _redact(f"unexpected error: {type(err).__name__}: {err}", key)
        log.warning("judge item %d invalid: %s", index, message)
        return "", message

    def _judge_one(self, index: int, prompt: str, first: str, second: str) -> tuple[ShownVerdict | None, str, str | None]:
        text, error = self._reply(index, self.template.messages(prompt, first, second))
        if error is not None:
            return None, "", error
        verdict = self.template.parse(text)
        if verdict is None:
            log.warning("judge item %d invalid: no verdict in the reply", index)
            return None, text, f"unparseable reply (no {self.template.parser} verdict)"
        return verdict, text, None

    def _request_with_retries(self, index: int, data: bytes) -> str:
        jitter = random.Random()
        for attempt in range(self.max_retries + 1):
            key = os.environ.get(self.api_key_env) if self.api_key_env else None
            try:
                return self._post(data, key)
            except _Retryable as err:
                if attempt == self.max_retries:
                    raise _Fatal(f"{err} (gave up after {attempt + 1} attempts)") from None
                delay = min(self.backoff_max_s, self.backoff_base_s * 2**attempt)
                delay = delay / 2 + jitter.uniform(0.0, delay / 2)
                if err.wait_s is not None:
                    delay = max(delay, min(err.wait_s, self.backoff_max_s))
                log.info("judge item %d: %s; retry %d/%d in %.2fs", index, err, attempt + 1, self.max_retries, delay)
                time.sleep(delay)
        raise AssertionError("unreachable")

    def _post(self, data: bytes, key: str | None) -> str:
        """One attempt: the reply's message content, or _Retryable / _Fatal (key-free messages)."""
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        request = urllib.request.Request(self.url, data=data, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                payload = response.read()
        except urllib.error.HTTPError as err:
            detail = _redact(_read_error_body(err), key)
            message = f"HTTP {err.code}: {detail}" if detail else f"HTTP {err.code}"
            if err.code in _RETRY_STATUS:
                raise _Retryable(message, _retry_after(err)) from None
            raise _Fatal(message) from None
        except (TimeoutError, socket.timeout) as err:
            raise _Retryable(f"timed out after {self.timeout_s}s ({type(err).__name__})") from None
        except urllib.error.URLError as err:
            reason = err.reason
            if isinstance(reason, (TimeoutError, socket.timeout)):
                raise _Retryable(f"timed out after {self.timeout_s}s") from None
            raise _Retryable(_redact(f"connection error: {reason}", key)) from None
        except (OSError, http.client.HTTPException) as err:  # resets, broken pipes, truncated replies
            raise _Retryable(_redact(f"connection error: {type(err).__name__}: {err}", key)) from None
        try:
            content = json.loads(payload)["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError) as err:
            snippet = _redact(payload[:_MAX_ERROR_BODY].decode("utf-8", "replace"), key)
            raise _Fatal(f"malformed chat-completions reply ({type(err).__name__}): {snippet!r}") from None
        if not isinstance(content, str):
            raise _Fatal(f"reply content is {type(content).__name__}, not text")
        return _redact(content, key)


def _read_error_body(err: urllib.error.HTTPError) -> str:
    try:
        return err.read(_MAX_ERROR_BODY).decode("utf-8", "replace").strip()
    except Exception:  # the body is a courtesy; the status code is what matters
        return ""
    finally:
        err.close()


def _retry_after(err: urllib.error.HTTPError) -> float | None:
    value = err.headers.get("Retry-After") if err.headers is not None else None
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None  # an HTTP date: fall back to our own backoff


def _redact(text: str, key: str | None) -> str:
    return text.replace(key, "***") if key else text
