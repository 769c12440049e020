"""A job pruned to a FLOPs target in the console, in a real headless Chromium: the heads and neurons per layer."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import expect

from tests.ui.console import Console, console, run_finished_job
from tests.ui.pages import Watched, sign_in


@pytest.fixture(scope="module")
def target_job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Console, str]]:
    with console(tmp_path_factory.mktemp("console-target")) as live:
        yield live, run_finished_job(live, target_flops=0.5, target_seq_len=16, stability_shards=0)


def test_a_target_job_shows_what_it_kept_in_each_layer(target_job, watched: Watched) -> None:
    live, job_id = target_job
    with live.client() as client:
        target = client.get(f"/v1/jobs/{job_id}/artifacts/report.json").json()["target"]
    sign_in(watched, live, path=f"/ui/jobs/{job_id}")
    section = watched.page.locator("div.target")
    expect(section).to_contain_text(f"FLOPs kept {100 * target['flops_kept']:.1f}%")
    expect(section).to_contain_text("not timed (a FLOPs target)")
    for layer, (heads, neurons) in enumerate(zip(target["heads_per_layer"], target["neurons_per_layer"],
                                                 strict=True)):
        row = section.locator(f"tr[data-layer='{layer}']")
        expect(row).to_contain_text(f"{heads} of {target['heads_total']}")
        expect(row).to_contain_text(f"{neurons} of {target['neurons_total']}")
    watched.shot("target-layers")
