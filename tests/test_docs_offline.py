"""The documentation site works offline: it loads nothing from outside itself, and a real browser
with the network off renders its formulas without a console error. Its footer shows the package's
version, and its API reference formats signatures and lists no private base class.

- Every built page is scanned: no `<script>`, `<link>`, `<img>`, ... and no stylesheet `url()` or
  `@import` names an address outside the site (MathJax and the fonts are the site's own).
- Headless Chromium (Debian's `chromium`, installed by `scripts/install.sh`) opens the built GRPO
  page from a local server, every other address unreachable, and is driven over the DevTools
  protocol (`--remote-debugging-pipe`, no extra package): every formula must be typeset by MathJax
  (an `mjx-container` in each `arithmatex` element, no raw TeX, no MathJax error), and no
  exception, console error or failed load may occur.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import select
import shutil
import subprocess
import sys
import threading
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest

import lit_rlhf
from tests.helpers import REPO_ROOT, subprocess_env

OUTSIDE = re.compile(r"^(https?:)?//", re.IGNORECASE)
CSS_OUTSIDE = re.compile(r"(url\(\s*['\"]?|@import\s+['\"])(https?:)?//", re.IGNORECASE)
LOADING = {"script": ("src",), "link": ("href",), "img": ("src", "srcset"), "iframe": ("src",), "source": ("src", "srcset"),
           "video": ("src", "poster"), "audio": ("src",), "embed": ("src",), "object": ("data",)}
BROWSERS = ("chromium", "chromium-headless-shell", "chromium-browser", "google-chrome")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=REPO_ROOT,
                          env={**subprocess_env(), "NO_MKDOCS_2_WARNING": "1"}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return out


class _Loads(HTMLParser):
    """The addresses outside the site that a page's tags make the browser load (not its links)."""

    def __init__(self) -> None:
        super().__init__()
        self.outside: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "link" and (attrs.get("rel") or "").lower() == "canonical":
            return  # names the page's own address, loads nothing
        for name in LOADING.get(tag, ()):
            for value in re.split(r",\s*", attrs.get(name) or ""):
                if OUTSIDE.match(value.strip()):
                    self.outside.append(f"<{tag} {name}={value.strip()}>")
        if tag == "style" or "style" in attrs:
            self.outside += [f"<{tag} style>" for _ in CSS_OUTSIDE.finditer(attrs.get("style") or "")]


def outside_loads(site: Path) -> dict[str, list[str]]:
    found = {}
    for page in sorted(site.rglob("*.html")):
        parser = _Loads()
        parser.feed(page.read_text(errors="replace"))
        parser.outside += [f"<style>{m.group(0)}" for m in CSS_OUTSIDE.finditer(page.read_text(errors="replace"))]
        if parser.outside:
            found[page.relative_to(site).as_posix()] = parser.outside
    for sheet in sorted(site.rglob("*.css")):
        hits = [m.group(0) for m in CSS_OUTSIDE.finditer(sheet.read_text(errors="replace"))]
        if hits:
            found[sheet.relative_to(site).as_posix()] = hits
    return found


def test_no_page_loads_anything_from_outside_the_site(site):
    assert len(list(site.rglob("*.html"))) > 30
    found = outside_loads(site)
    assert not found, "built pages that load from outside the site (offline they break): " + json.dumps(found, indent=1)


def test_the_scan_sees_a_cdn_script_and_a_web_font(tmp_path):
    (tmp_path / "a.html").write_text('<a href="https://arxiv.org/abs/1">paper</a><script src="https://cdn.x/mathjax.js"></script>'
                                     '<link rel="stylesheet" href="//fonts.x/css?family=Roboto"><img src="figure.png">')
    (tmp_path / "b.css").write_text("@font-face { src: url('https://fonts.x/r.woff2') }")
    assert outside_loads(tmp_path) == {"a.html": ["<script src=https://cdn.x/mathjax.js>",
                                                  "<link href=//fonts.x/css?family=Roboto>"],
                                       "b.css": ["url('https://"]}


def text_of(html: str) -> str:
    return re.sub(r"<[^>]+>", "", html).replace("&quot;", '"').replace("&gt;", ">").replace("&amp;", "&")


def test_the_version_is_one_everywhere_and_in_the_footer(site):
    version = lit_rlhf.__version__
    done = subprocess.run([sys.executable, "main.py", "--version"], cwd=REPO_ROOT, env=subprocess_env(),
                          capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout) == (0, f"lit_rlhf {version}\n"), done.stderr[-2000:]
    newest = re.search(r"^## (\S+)", (REPO_ROOT / "docs" / "changelog.md").read_text(), re.M).group(1)
    assert newest == version, f"docs/changelog.md's newest entry is {newest}, the package is {version}"
    assert 'dynamic = ["version"]' in (REPO_ROOT / "pyproject.toml").read_text()  # read from lit_rlhf.__version__
    for page in ("index.html", "methods/grpo/index.html", "reference/losses/index.html"):
        footer = (site / page).read_text().split('class="md-copyright"')[1][:400]
        assert f"lit_rlhf {version}" in footer, page


def test_the_api_reference_formats_signatures_and_hides_private_bases(site):
    data = (site / "reference" / "data" / "index.html").read_text()
    assert "TLDRSFTDataModule" in data and "RLHFDataModule" in data
    assert "_SFTExamples" not in data and "_ReferenceTexts" not in data
    losses = text_of((site / "reference" / "losses-policy-gradient" / "index.html").read_text())
    assert "grpo_policy_loss(\n    logps: Tensor,\n    old_logps: Tensor | None," in losses  # one argument a line
    pages = {p.parent.name for p in (site / "reference").glob("*/index.html")}
    assert {"modules", "modules-offline", "modules-online", "losses", "losses-policy-gradient"} <= pages


def browser() -> str | None:
    return next((found for name in BROWSERS if (found := shutil.which(name))), None)


class DevTools:
    """Headless Chromium driven over the DevTools protocol on a pipe (fd 3 in, fd 4 out, NUL-separated
    JSON), with every address but the loopback unreachable (a dead proxy, and no name resolves)."""

    def __init__(self, binary: str, profile: Path) -> None:
        to_browser, self._write = os.pipe()
        self._read, from_browser = os.pipe()
        flags = ["--headless", "--remote-debugging-pipe", f"--user-data-dir={profile}", "--no-first-run", "--disable-gpu",
                 "--disable-extensions", "--disable-background-networking", "--disable-component-update",
                 "--proxy-server=http://127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
                 *(["--no-sandbox"] if os.geteuid() == 0 else []), "about:blank"]
        self.process = subprocess.Popen(["bash", "-c", f'exec "$0" "$@" 3<&{to_browser} 4>&{from_browser}', binary, *flags],
                                        pass_fds=(to_browser, from_browser), stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
        os.close(to_browser)
        os.close(from_browser)
        self._buffer, self._id, self.events = b"", 0, []

    def _message(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            if not select.select([self._read], [], [], max(0.0, deadline - time.monotonic()))[0]:
                raise TimeoutError("Chromium did not answer in time")
            chunk = os.read(self._read, 1 << 20)
            if not chunk:
                raise EOFError(f"Chromium exited ({self.process.poll()})")
            self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        return json.loads(message)

    def call(self, method: str, session: str | None = None, timeout: float = 30.0, **params) -> dict:
        self._id += 1
        request = {"id": self._id, "method": method, "params": params, **({"sessionId": session} if session else {})}
        os.write(self._write, json.dumps(request).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            message = self._message(deadline)
            if message.get("id") != self._id:
                self.events.append(message)
            elif "error" in message:
                raise RuntimeError(f"{method}: {message['error']}")
            else:
                return message["result"]

    def close(self) -> None:
        self.process.kill()
        self.process.wait(timeout=30)
        os.close(self._read)
        os.close(self._write)


@functools.cache
def _quiet_handler(directory: str):
    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=directory, **kwargs)

        def log_message(self, *args):  # the test reports failed loads itself
            pass

    return Handler


# waits for MathJax's first typeset (when MathJax is there), then counts what the page shows
INSPECT = """new Promise(done => {
  const report = () => {
    const math = [...document.querySelectorAll('.arithmatex')];
    done({formulas: math.length,
          typeset: math.filter(e => e.querySelector('mjx-container')).length,
          raw: math.filter(e => !e.querySelector('mjx-container')).map(e => e.textContent.slice(0, 80)),
          mathjaxErrors: document.querySelectorAll('mjx-merror, [data-mjx-error]').length,
          mathjax: typeof window.MathJax === 'object' && !!window.MathJax.startup});
  };
  const settle = () => (window.MathJax && MathJax.startup && MathJax.startup.promise
    ? MathJax.startup.promise.then(report, report) : setTimeout(report, 500));
  document.readyState === 'complete' ? settle() : addEventListener('load', settle);
})"""


def open_offline(directory: Path, page: str, profile: Path) -> tuple[dict, list[str]]:
    """What `page` (a path under the local server of `directory`) shows, and every exception,
    console error, error log entry and failed load of the browser that opened it."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _quiet_handler(str(directory)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    tools = DevTools(browser(), profile)
    try:
        target = tools.call("Target.createTarget", url="about:blank")["targetId"]
        session = tools.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Runtime", "Log", "Network", "Page"):
            tools.call(f"{domain}.enable", session)
        tools.call("Page.navigate", session, url=f"http://127.0.0.1:{server.server_address[1]}/{page}")
        deadline = time.monotonic() + 60
        while not any(e.get("method") == "Page.loadEventFired" for e in tools.events):
            tools.events.append(tools._message(deadline))
        shown = tools.call("Runtime.evaluate", session, timeout=60, expression=INSPECT, awaitPromise=True,
                           returnByValue=True)["result"]["value"]
        tools.call("Runtime.evaluate", session, expression="0")  # collects what arrived meanwhile
    finally:
        tools.close()
        server.shutdown()
        server.server_close()
    problems = []
    for event in tools.events:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            problems.append("exception: " + details.get("exception", {}).get("description", details.get("text", "")))
        elif method == "Runtime.consoleAPICalled" and params["type"] in ("error", "assert"):
            problems.append("console." + params["type"] + ": " + " ".join(str(a.get("value", a.get("description")))
                                                                             for a in params["args"]))
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            problems.append(f"log: {params['entry']['text']} {params['entry'].get('url', '')}".strip())
        elif method == "Network.loadingFailed" and not params.get("canceled"):
            problems.append(f"failed load: {params['errorText']} (request {params['requestId']})")
    return shown, problems


needs_browser = pytest.mark.skipif(browser() is None, reason="no headless Chromium on PATH (scripts/install.sh installs "
                                   "Debian's `chromium` with apt-get when run as root); install it to run this test")


@needs_browser
def test_grpo_page_renders_its_formulas_offline_in_chromium(site, tmp_path):
    shown, problems = open_offline(site, "methods/grpo/", tmp_path / "profile")
    assert shown["mathjax"], "MathJax did not load from the site"
    assert shown["formulas"] >= 5 and shown["typeset"] == shown["formulas"], shown
    assert not shown["raw"] and shown["mathjaxErrors"] == 0, shown
    assert not problems, problems


@needs_browser
def test_the_browser_check_sees_a_cdn_mathjax_fail_offline(tmp_path):
    """The same check on a page that loads MathJax from a CDN, as the site once did, after the
    site's own `mathjax.js` (with a stand-in for the theme's page-change stream): the formula stays
    raw and the load fails, so the check fails; `mathjax.js` itself throws nothing without MathJax."""
    (tmp_path / "site").mkdir()
    shutil.copy(REPO_ROOT / "docs" / "javascripts" / "mathjax.js", tmp_path / "site" / "mathjax.js")
    (tmp_path / "site" / "index.html").write_text(
        '<html><body><p><span class="arithmatex">\\(x^2\\)</span></p>'
        "<script>window.document$ = {subscribe: f => f()};</script><script src=\"mathjax.js\"></script>"
        '<script src="https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-mml-chtml.js"></script></body></html>')
    shown, problems = open_offline(tmp_path / "site", "index.html", tmp_path / "profile")
    assert not shown["mathjax"] and shown["raw"] == ["\\(x^2\\)"]
    assert any(p.startswith("failed load:") for p in problems), problems
    assert not any(p.startswith("exception:") for p in problems), problems
