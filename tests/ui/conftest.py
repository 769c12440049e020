"""Fixtures of the console tests: one served app per module with a finished and a failed job, a
Chromium per session, and a fresh browser page per test that fails the test on any script error or
Content-Security-Policy violation and records every URL the page asked for."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Playwright, expect, sync_playwright

from tests.ui.console import CHROMIUM, CHROMIUM_ARGS, WAIT_MS, Console, console, run_failed_job, run_finished_job
from tests.ui.pages import Watched


@pytest.fixture(scope="session")
def playwright() -> Iterator[Playwright]:
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is missing: `apt-get install chromium` (.ci/run does it)")
    with sync_playwright() as driver:
        yield driver


@pytest.fixture(scope="session")
def browser(playwright: Playwright) -> Iterator[Browser]:
    chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
    yield chromium
    chromium.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    """The app served with auth on, holding a succeeded and a failed job of its key."""
    with console(tmp_path_factory.mktemp("console")) as live:
        live.jobs["succeeded"] = run_finished_job(live)
        live.jobs["failed"] = run_failed_job(live)
        yield live


@pytest.fixture
def watched(browser: Browser, tmp_path: Path) -> Iterator[Watched]:
    context = browser.new_context(viewport={"width": 1280, "height": 900}, accept_downloads=True)
    context.set_default_timeout(WAIT_MS)
    page = context.new_page()
    seen = Watched(page=page, shots=tmp_path)
    page.on("request", lambda request: seen.urls.append(request.url))
    page.on("framenavigated", lambda frame: seen.urls.append(frame.url))
    page.on("pageerror", lambda error: seen.errors.append(f"page error: {error}"))
    page.on("console", lambda message: seen.errors.append(f"console {message.type}: {message.text}")
            if message.type == "error" else None)
    expect.set_options(timeout=WAIT_MS)
    yield seen
    context.close()
    # A 401 while finding out whether a key is needed is an expected answer, not a failure of the page.
    unexpected = [e for e in seen.errors if "401 (Unauthorized)" not in e]
    assert unexpected == []
