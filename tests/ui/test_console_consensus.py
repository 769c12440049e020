"""A consensus job's head map in the console, in a real headless Chromium: the runs it combined, per head."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import expect

from tests.ui.console import Console, console, run_finished_job
from tests.ui.pages import Watched, sign_in


@pytest.fixture(scope="module")
def consensus_job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Console, str, str]]:
    """The app served with a finished ``coassociation`` job and a finished CAHP job of the same inputs."""
    with console(tmp_path_factory.mktemp("console-consensus")) as live:
        yield live, run_finished_job(live, strategy="coassociation"), run_finished_job(live)


def test_a_consensus_job_colours_each_head_by_the_runs_that_kept_it(consensus_job, watched: Watched) -> None:
    live, job_id, plain_id = consensus_job
    with live.client() as client:
        heads = client.get(f"/v1/jobs/{job_id}/artifacts/head_map.json").json()
        report = client.get(f"/v1/jobs/{job_id}/artifacts/report.json").json()
    consensus = heads["consensus"]
    assert consensus == report["selection"]["consensus"] and consensus["method"] == "coassociation"
    runs = consensus["runs"]
    page = watched.page
    sign_in(watched, live, path=f"/ui/jobs/{job_id}")
    grid = page.locator("figure.heads")
    expect(grid.locator("figcaption")).to_contain_text(
        f"A consensus of {runs} runs of CAHP (the full analysis and {runs - 1} leave-one-shard-out ones), "
        f"which agreed at a mean Jaccard of {consensus['mean_jaccard']:.2f}")
    # Each head says how many of the runs kept it, in every colouring.
    for layer, head in ((0, 0), tuple(heads["representatives"][0])):
        grid.locator(f"rect.cell[data-layer='{layer}'][data-head='{head}']").hover()
        kept_by = round(consensus["kept_frequency"][layer][head] * runs)
        expect(grid.get_by_role("tooltip")).to_contain_text(f"Kept by {kept_by} of {runs} runs of CAHP")
    grid.get_by_label("Consensus runs").check()
    expect(grid.locator(".legend")).to_contain_text(f"share of the {runs} runs of CAHP that kept the head")
    # The share is drawn as the salience is: a head every run kept has the ramp's top colour.
    always = next((layer, head) for layer, row in enumerate(consensus["kept_frequency"])
                  for head, share in enumerate(row) if share == 1.0)
    never = next((layer, head) for layer, row in enumerate(consensus["kept_frequency"])
                 for head, share in enumerate(row) if share == 0.0)
    expect(grid.locator(f"rect.cell[data-layer='{always[0]}'][data-head='{always[1]}']")).to_have_attribute(
        "fill", "#fde725")
    expect(grid.locator(f"rect.cell[data-layer='{never[0]}'][data-head='{never[1]}']")).to_have_attribute(
        "fill", "#440154")
    watched.shot("consensus-head-map")
    # A CAHP job has no such colouring.
    page.goto(f"{live.url}/ui/jobs/{plain_id}")
    plain = page.locator("figure.heads")
    expect(plain.get_by_label("Salience")).to_be_visible()
    expect(plain.get_by_label("Consensus runs")).to_have_count(0)
    expect(plain.locator("figcaption")).not_to_contain_text("consensus")
