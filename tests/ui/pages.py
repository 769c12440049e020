"""What the browser tests do with a page: watch it, sign in through the form, check the key stayed secret."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from playwright.sync_api import Page, expect

from tests.ui.console import Console


@dataclass
class Watched:
    """A page and what it did: the URLs it requested or showed, and its errors."""

    page: Page
    shots: Path
    urls: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def shot(self, name: str) -> Path:
        """A full-page screenshot under the test's temporary directory."""
        path = self.shots / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        assert path.stat().st_size > 0
        return path


def sign_in(seen: Watched, live: Console, path: str = "/ui") -> None:
    """Open ``path`` and sign in with the console's key through the form, as a user would."""
    assert live.key is not None
    page = seen.page
    page.goto(live.url + path)
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    page.get_by_label("API key").fill(live.key)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_text("signed in")).to_be_visible()


def assert_key_kept_secret(seen: Watched, live: Console) -> None:
    """The key is in no URL the page used or showed, in no cookie, and nowhere in the server log."""
    assert live.key is not None
    assert seen.urls and all(live.key not in url for url in seen.urls)
    assert live.key not in seen.page.url
    assert seen.page.context.cookies() == []
    assert live.key not in live.log.text
    assert "GET /v1/jobs" in live.log.text  # the access log is on, so the check above means something
