"""The MSS curve's degree labels on a phone, in a real headless Chromium: knees close together at 390 px wide
still get labels that never overlap and stay inside the chart."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import expect

from tests.ui.console import Console, console, run_finished_job
from tests.ui.pages import Watched, sign_in

BOX = "(els) => els.map((e) => { const b = e.getBoundingClientRect(); return [b.left, b.top, b.right, b.bottom]; })"


@pytest.fixture(scope="module")
def crowded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Console, str]]:
    """A job whose curve (k = 2..15) has knees at neighbouring k, each labelled with several of ten degrees."""
    with console(tmp_path_factory.mktemp("console-mss")) as live:
        yield live, run_finished_job(live, layers=4, heads=4, reported_degrees=list(range(1, 11)),
                                     stability_shards=0)


def test_the_degree_labels_never_overlap_at_390_px(crowded, watched: Watched) -> None:
    live, job_id = crowded
    with live.client() as client:
        curve = client.get(f"/v1/jobs/{job_id}/artifacts/mss_curve.json").json()
    knees = sorted({k for k in curve["knees_by_degree"].values() if k is not None})
    assert len(knees) >= 3, curve["knees_by_degree"]  # several labels, or the check below means nothing
    page = watched.page
    page.set_viewport_size({"width": 390, "height": 844})
    sign_in(watched, live, path=f"/ui/jobs/{job_id}")
    chart = page.locator("figure.mss")
    labels = chart.locator(".knee-label")
    expect(labels).to_have_count(len(knees))
    boxes = labels.evaluate_all(BOX)
    lines = sorted(left for left, _, _, _ in chart.locator("line.knee").evaluate_all(BOX))
    # The knees stand closer together than their labels are wide: on one row, the labels would overlap.
    widest = max(right - left for left, _, right, _ in boxes)
    assert min(b - a for a, b in zip(lines, lines[1:], strict=False)) < widest, (lines, boxes)
    for i, (left, top, right, bottom) in enumerate(boxes):
        for other in boxes[i + 1:]:
            assert right <= other[0] or other[2] <= left or bottom <= other[1] or other[3] <= top, boxes
    svg = chart.locator("svg").first.bounding_box()
    assert svg is not None and svg["x"] + svg["width"] <= 390
    for left, top, right, _ in boxes:
        assert svg["x"] <= left and right <= svg["x"] + svg["width"] and svg["y"] <= top, (svg, boxes)
    watched.shot("phone-mss-labels")
