"""The map of heads and neurons on a phone, in a real headless Chromium: a model with BERT-base's 3072 feed-forward
neurons a layer, pruned to a FLOPs target, gets counts ("1536 neurons") that stay whole inside the map at 390 px."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import expect

from tests.support.helpers import job_body
from tests.support.tiny_models import make_classifier, make_tokenizer
from tests.ui.console import Console, console, tiny_inputs
from tests.ui.pages import Watched, settled, sign_in
from worker.runner import Outcome, execute_job

#: The map's boxes in page pixels, measured in one go: its svg, every text and every bar's track.
MAP = """() => {
  const box = (e) => { const b = e.getBoundingClientRect(); return [b.left, b.top, b.right, b.bottom]; };
  const svg = document.querySelector("figure.units svg");
  return svg && { svg: box(svg), texts: [...svg.querySelectorAll("text")].map(box),
                  bars: [...svg.querySelectorAll("rect.track")].map(box) };
}"""


@pytest.fixture(scope="module")
def wide_ffn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Console, str]]:
    """A finished FLOPs-target job on a tiny model whose layers hold 3072 feed-forward neurons, as BERT-base's do."""
    with console(tmp_path_factory.mktemp("console-units")) as live:
        _, data = tiny_inputs(live.local_root)
        model = live.local_root / "model-wide-ffn"
        make_classifier("bert", intermediate_size=3072).save_pretrained(model)
        make_tokenizer().save_pretrained(model)
        job_id = live.submit(job_body(f"file://{model}", f"file://{data}", target_flops=0.5, target_seq_len=16,
                                      stability_shards=0))
        assert execute_job(job_id=job_id, context=live.worker()) is Outcome.succeeded
        yield live, job_id


def test_the_neuron_counts_stay_inside_the_map_at_390_px(wide_ffn, watched: Watched) -> None:
    live, job_id = wide_ffn
    with live.client() as client:
        target = client.get(f"/v1/jobs/{job_id}/artifacts/report.json").json()["target"]
    assert target["neurons_total"] == 3072 and max(target["neurons_per_layer"]) >= 1000, target  # four-digit counts
    page = watched.page
    page.set_viewport_size({"width": 390, "height": 844})
    sign_in(watched, live, path=f"/ui/jobs/{job_id}")
    units = page.locator("figure.units")
    texts = units.locator("svg text")
    expect(texts.filter(has_text="neurons")).to_have_count(len(target["neurons_per_layer"]))
    measured = settled(page, MAP)
    svg_left, _, svg_right, _ = measured["svg"]
    assert svg_right <= 390
    boxes = measured["texts"]
    outside = [b for b in boxes if b[0] < svg_left or b[2] > svg_right]
    assert outside == [], (measured["svg"], boxes)
    # No count over another or over a bar. A layer's two counts stand one 14 px text box apart: their boxes
    # touch, to a rounding of a hundredth of a pixel.
    things = boxes + measured["bars"]
    for i, (left, top, right, bottom) in enumerate(things):
        for other in things[i + 1:]:
            apart = right <= other[0] or other[2] <= left or bottom <= other[1] + 0.1 or other[3] <= top + 0.1
            assert apart, ((left, top, right, bottom), other)
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    watched.shot("phone-units-labels")
