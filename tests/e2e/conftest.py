"""Browser tests: Playwright drives Debian's Chromium against the console on a live server.

The console runs in this process (pytest-django's ``live_server``) on the test database; the
Celery worker, the S3 server and the serving node are the session's real parts. Every test
fails on a JavaScript error, a console error, a failed request or an HTTP error response,
unless the test names the statuses it expects (``browser_errors.allow(404)``).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings

from tests.harness.processes import NODE_INTERNAL_TOKEN

# Playwright's sync API runs an event loop in this thread; the ORM calls the tests make
# between browser steps are plain synchronous calls all the same.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

CHROMIUM = Path(os.environ.get("LORAHUB_CHROMIUM", "/usr/bin/chromium"))
SCREENSHOTS = Path(settings.VAR_DIR) / "screenshots"
PASSWORDS = {
    "alice": "alice-pass-123",
    "bob": "bob-pass-123",
    "rita": "rita-pass-123",
    "otto": "otto-pass-123",
}

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def browser() -> Iterator:
    """Chromium for one test module. Not for the whole session: while Playwright's sync API
    is open, the main thread's asyncio loop counts as running, which breaks later tests that
    call ``asyncio.run`` or start vLLM's async engine in this thread."""
    from playwright.sync_api import sync_playwright

    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: `make test` installs Debian's chromium package")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=str(CHROMIUM),
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
        )
        yield browser
        browser.close()


class BrowserErrors:
    """What went wrong in the page: console errors, page errors, failed requests, and HTTP
    responses of 400 or more (except the statuses a test allows)."""

    def __init__(self) -> None:
        self.problems: list[str] = []
        self.allowed: set[int] = set()

    def allow(self, *statuses: int) -> None:
        self.allowed.update(statuses)

    def on_console(self, message) -> None:
        if message.type != "error":
            return
        # Chromium also reports each HTTP error response as a console error; those are
        # judged by status below.
        status = re.search(r"status of (\d{3})", message.text)
        if status and int(status[1]) in self.allowed:
            return
        self.problems.append(f"console error: {message.text}")

    def on_failed(self, request) -> None:
        # ERR_ABORTED: the page navigated away before a subresource (the favicon) arrived;
        # the browser cancelled it, nothing failed
        if "ERR_ABORTED" not in (request.failure or ""):
            self.problems.append(
                f"request failed: {request.method} {request.url} ({request.failure})"
            )

    def on_response(self, response) -> None:
        if response.status >= 400 and response.status not in self.allowed:
            self.problems.append(
                f"HTTP {response.status} for {response.request.method} {response.url}"
            )


@pytest.fixture
def browser_errors() -> BrowserErrors:
    return BrowserErrors()


@pytest.fixture
def console(request, live_server, settings):
    """The console on the live server; in a test that runs the serving node, pointed at it
    (with the node's internal token, which stays on the server)."""
    if "node_url" in request.fixturenames:
        settings.LORAHUB_NODES = [f"test-node={request.getfixturevalue('node_url')}"]
        settings.LORAHUB_INTERNAL_TOKEN = NODE_INTERNAL_TOKEN
    else:
        settings.LORAHUB_NODES = ["test-node=http://127.0.0.1:9"]  # nothing listens there
        settings.LORAHUB_INTERNAL_TOKEN = "no-node-here"
    return live_server.url


@pytest.fixture
def context(browser, live_server, browser_errors):
    ctx = browser.new_context(base_url=live_server.url, viewport={"width": 1360, "height": 900})
    ctx.set_default_timeout(15_000)
    yield ctx
    ctx.close()


@pytest.fixture
def page(context, browser_errors):
    page = context.new_page()
    page.on("console", browser_errors.on_console)
    page.on("pageerror", lambda exc: browser_errors.problems.append(f"page error: {exc}"))
    page.on("requestfailed", browser_errors.on_failed)
    page.on("response", browser_errors.on_response)
    yield page
    assert not browser_errors.problems, "\n".join(browser_errors.problems)


def sign_in(page, username: str) -> None:
    page.goto("/accounts/login/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", PASSWORDS[username])
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r".*/$"))


def confirm(page) -> None:
    """Accept the console's confirmation dialog."""
    page.locator("#confirm-dialog[open] #confirm-ok").click()


def screenshot(page, name: str) -> Path:
    """A full-page PNG under var/screenshots/ (git-ignored); docs/ keeps a few small ones."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def keep_for_docs(path: Path) -> None:
    """Copy a screenshot into docs/screenshots when LORAHUB_UPDATE_DOCS=1 (for the README)."""
    if os.environ.get("LORAHUB_UPDATE_DOCS") == "1":
        target = Path(settings.BASE_DIR) / "docs" / "screenshots"
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, target / path.name)
