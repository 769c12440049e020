"""The MSS curve's labels in a real headless Chromium: knees close together at 390 px wide still get degree labels
that never overlap and stay inside the chart, and k*'s label, on a phone and on a desktop, hides none of the
curve's points, no stretch of its line and no other label."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import expect

from tests.ui.console import Console, console, run_finished_job
from tests.ui.pages import Watched, settled, sign_in

#: The chart's boxes in page pixels, measured in one go: its svg, the knee labels and the knee lines.
CHART = """() => {
  const box = (e) => { const b = e.getBoundingClientRect(); return [b.left, b.top, b.right, b.bottom]; };
  const svg = document.querySelector("figure.mss svg");
  return svg && { svg: box(svg), labels: [...svg.querySelectorAll(".knee-label")].map(box),
                  lines: [...svg.querySelectorAll("line.knee")].map(box) };
}"""


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
    measured = settled(page, CHART)
    boxes, lines = measured["labels"], sorted(left for left, _, _, _ in measured["lines"])
    # The knees stand closer together than their labels are wide: on one row, the labels would overlap.
    widest = max(right - left for left, _, right, _ in boxes)
    assert min(b - a for a, b in zip(lines, lines[1:], strict=False)) < widest, (lines, boxes)
    for i, (left, top, right, bottom) in enumerate(boxes):
        for other in boxes[i + 1:]:
            assert right <= other[0] or other[2] <= left or bottom <= other[1] or other[3] <= top, boxes
    svg_left, svg_top, svg_right, _ = measured["svg"]
    assert svg_right <= 390
    for left, top, right, _ in boxes:
        assert svg_left <= left and right <= svg_right and svg_top <= top, (measured["svg"], boxes)
    watched.shot("phone-mss-labels")


#: The MSS chart's geometry in page pixels: each label's text box, each point's and k*'s ring's box.
GEOMETRY = """(figure) => {
  const box = (e) => { const b = e.getBoundingClientRect(); return [b.left, b.top, b.right, b.bottom]; };
  const svg = figure.querySelector("svg");
  return { svg: box(svg), star: box(svg.querySelector(".kstar-label")), ring: box(svg.querySelector("circle.kstar")),
           knees: [...svg.querySelectorAll(".knee-label")].map(box),
           points: [...svg.querySelectorAll(".points circle")].map(box) };
}"""
#: Drawn for the plot's present width (a resize redraws the SVG on the next frame).
REDRAWN = """() => { const plot = document.querySelector("figure.mss .plot"), svg = plot.querySelector("svg");
  return svg !== null && Number(svg.getAttribute("width")) === Math.max(280, Math.floor(plot.clientWidth)); }"""


def _overlap(a: list[float], b: list[float]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _crosses(a: tuple[float, float], b: tuple[float, float], box: list[float]) -> bool:
    """Whether the segment from ``a`` to ``b`` passes through ``box`` (Liang-Barsky clipping)."""
    (ax, ay), (bx, by) = a, b
    low, high = 0.0, 1.0
    for p, q in ((ax - bx, ax - box[0]), (bx - ax, box[2] - ax), (ay - by, ay - box[1]), (by - ay, box[3] - ay)):
        if p == 0:
            if q < 0:
                return False
        elif p < 0:
            low = max(low, q / p)
        else:
            high = min(high, q / p)
        if low > high:
            return False
    return True


@pytest.mark.parametrize("width", [390, 1280])
def test_the_k_star_label_hides_no_point_line_or_label(crowded, watched: Watched, width: int) -> None:
    live, job_id = crowded
    with live.client() as client:
        curve = client.get(f"/v1/jobs/{job_id}/artifacts/mss_curve.json").json()
    page = watched.page
    page.set_viewport_size({"width": width, "height": 844})
    sign_in(watched, live, path=f"/ui/jobs/{job_id}")
    chart = page.locator("figure.mss")
    expect(chart.locator(".kstar-label")).to_have_text(f"k* = {curve['knee']}")
    page.wait_for_function(REDRAWN)
    g = chart.evaluate(GEOMETRY)
    star, ring, points = g["star"], g["ring"], g["points"]
    assert len(points) == len(curve["k"])
    centres = [((left + right) / 2, (top + bottom) / 2) for left, top, right, bottom in points]
    at = curve["k"].index(curve["knee"])
    sx = centres[at][0]
    if width == 390:  # the curve goes on right of k* closer than its label is wide: a fixed offset hid its points
        assert centres[at + 1][0] - sx < star[2] - star[0], (centres, star)
    # The label stands beside its ring, clear of it, of every point, of the curve's line (2 px wide) and of the
    # degree labels, inside the chart.
    assert min(abs(star[0] - sx), abs(star[2] - sx)) <= 13, (star, sx)
    assert not _overlap(star, ring), (star, ring)
    assert [p for p in points if _overlap(star, p)] == [], (star, points)
    thick = [star[0] - 1, star[1] - 1, star[2] + 1, star[3] + 1]
    assert [(a, b) for a, b in zip(centres, centres[1:], strict=False) if _crosses(a, b, thick)] == [], (star, centres)
    labels = [star, *g["knees"]]
    for i, label in enumerate(labels):
        assert [p for p in points if _overlap(label, p)] == [], (label, points)
        assert [other for other in labels[i + 1:] if _overlap(label, other)] == [], labels
    svg = g["svg"]
    assert svg[0] <= star[0] and star[2] <= svg[2] and svg[1] <= star[1] and star[3] <= svg[3], (svg, star)
    watched.shot(f"mss-k-star-label-{width}")
