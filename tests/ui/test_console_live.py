"""The job page follows a running job over its event stream, and falls back to polling without it."""

from __future__ import annotations

from playwright.sync_api import Route, expect

from tests.ui.console import Console, running_job
from tests.ui.pages import Watched, assert_key_kept_secret, sign_in
from worker.runner import Outcome


def test_the_job_page_follows_a_running_job_over_its_event_stream(served: Console, watched: Watched) -> None:
    page = watched.page
    with running_job(served) as running:
        sign_in(watched, served, path=f"/ui/jobs/{running.job_id}")
        expect(page.locator("[data-field=stage]")).to_have_text("recovery")
        expect(page.get_by_role("log")).to_contain_text("attempt 1 on worker")
        with served.client() as client:
            client.post(f"/v1/jobs/{running.job_id}/cancel")  # from elsewhere: the page hears it
        expect(page.locator("[data-field=status]")).to_have_text("cancelled")
        expect(page.get_by_role("log")).to_contain_text("cancelled on request")
        running.thread.join(120)
        assert running.outcome == [Outcome.cancelled]
    assert any(url.endswith(f"/v1/jobs/{running.job_id}/events") for url in watched.urls)
    assert not any("/logs?" in url for url in watched.urls)  # no polling of the log
    log = page.get_by_role("log").inner_text()
    assert log.count("cancelled on request") == 1  # every line once
    watched.shot("followed-over-events")
    assert_key_kept_secret(watched, served)


def test_without_the_event_stream_the_page_polls(served: Console, watched: Watched) -> None:
    page = watched.page

    def refuse(route: Route) -> None:  # a proxy that does not let event streams through
        route.fulfill(status=502, body="bad gateway")

    page.route("**/events", refuse)
    with running_job(served) as running:
        sign_in(watched, served, path=f"/ui/jobs/{running.job_id}")
        expect(page.locator("[data-field=stage]")).to_have_text("recovery")
        page.get_by_role("button", name="Cancel job").click()
        expect(page.locator("[data-field=status]")).to_have_text("cancelled")
        expect(page.get_by_role("log")).to_contain_text("cancelled on request")
        running.thread.join(120)
    assert any("/logs?offset=" in url for url in watched.urls)
    watched.shot("followed-by-polling")
    assert_key_kept_secret(watched, served)
    # The refused stream was reported as a failed request; the page itself logged no script error.
    watched.errors[:] = [e for e in watched.errors if "502" not in e]
