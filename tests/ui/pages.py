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


#: Resolves after two animation frames: a chart redrawn by its resize observer has drawn by then.
TWO_FRAMES = "() => new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done)))"


def settled(page: Page, measure: str, tries: int = 50) -> object:
    """What ``measure`` returns once two measurements in a row agree.

    ``measure`` is a JavaScript function of no argument, run in the page in one go: a chart redraws itself when
    its width changes (a scrollbar appearing as the result loads), so measuring its parts one protocol call at a
    time could read an element a redraw has just replaced. ``measure`` returns null while there is nothing to
    measure yet."""
    last = None
    for _ in range(tries):
        page.evaluate(TWO_FRAMES)
        now = page.evaluate(measure)
        if now is not None and now == last:
            return now
        last = now
    raise AssertionError(f"the page never stopped redrawing: {last}")
