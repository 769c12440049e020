"""``/docs`` in a real headless Chromium, under the page's own Content-Security-Policy.

The ``watched`` fixture fails the test on any script error or policy violation, so this shows the
policy (this origin only, the start-up script by its hash, no inline styles) leaves Swagger UI
whole: it draws every operation from ``/openapi.json`` and "Try it out" calls the app.
"""

from __future__ import annotations

from pathlib import Path

from playwright.sync_api import expect

from tests.ui.console import console
from tests.ui.pages import Watched


def test_swagger_ui_draws_the_api_and_tries_a_call_under_its_policy(watched: Watched, tmp_path: Path) -> None:
    with console(tmp_path) as live:
        page = watched.page
        page.goto(f"{live.url}/docs")
        expect(page.locator(".opblock-summary-path", has_text="/v1/jobs/{job_id}/events").first).to_be_visible()
        for summary in page.locator(".opblock-summary").all():  # every operation drawn, schemas included
            summary.click()
        health = page.locator(".opblock", has=page.locator(".opblock-summary-path", has_text="/healthz"))
        health.locator(".try-out__btn").click()
        health.locator(".execute").click()
        expect(health.locator(".live-responses-table tbody .response-col_status").first).to_contain_text("200")
        expect(health.locator(".live-responses-table")).to_contain_text('"status": "ok"')
        watched.shot("docs")
    assert all(url.startswith(live.url) or url.startswith(("data:", "blob:", "about:")) for url in watched.urls)
