"""Take the README's screenshot of the console from a real run: ``python -m tests.ui.screenshot docs/console.png``.

It serves the app on a temporary database, runs a real (tiny, random, 4 layers x 8 heads) pruning
job through the worker's ``execute_job``, signs in through the form in headless Chromium, points at a
head of the map, and saves the part of the job page from the result summary to the head map.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from playwright.sync_api import expect, sync_playwright  # noqa: E402

from tests.ui.console import CHROMIUM, CHROMIUM_ARGS, WAIT_MS, console, run_finished_job  # noqa: E402

#: A small model that still gives the MSS curve and the head map something to show, trained enough
#: (dense fine-tuning on) that the accuracies mean something.
PARAMS = {"layers": 4, "heads": 8, "dense_finetune": "always", "dense_epochs": 8, "dense_lr": 5e-3,
          "epochs": 4, "lr": 5e-3}


def main(output: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="cahp-ui-shot-") as tmp, console(Path(tmp)) as live:
        job_id = run_finished_job(live, **PARAMS)
        assert live.key is not None
        with sync_playwright() as driver:
            browser = driver.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 900}, device_scale_factor=1)
            page.set_default_timeout(WAIT_MS)
            page.goto(f"{live.url}/ui/jobs/{job_id}")
            page.get_by_label("API key").fill(live.key)
            page.get_by_role("button", name="Sign in").click()
            heads = page.locator("figure.heads")
            expect(heads.locator("rect.cell")).to_have_count(32)
            cell = heads.locator("rect.cell[data-layer='2'][data-head='5']")
            cell.scroll_into_view_if_needed()
            cell.hover()
            expect(heads.get_by_role("tooltip")).to_be_visible()
            # Page coordinates, as a full-page clip wants them.
            top, bottom = page.evaluate("""() => [
                document.querySelector('.result h2').getBoundingClientRect().top + scrollY,
                document.querySelector('.side-by-side').getBoundingClientRect().bottom + scrollY]""")
            page.screenshot(path=str(output), full_page=True,
                            clip={"x": 0, "y": top - 12, "width": 1280, "height": bottom - top + 24})
            browser.close()
    print(f"wrote {output}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/console.png"))
