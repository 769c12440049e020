"""A job pruned to a FLOPs target in the console, in a real headless Chromium: the heads and neurons per layer,
shown as soon as the run has decided them and replaced by the report's once the job has ended; the map of
heads and neurons beside the head map, and every runtime's latency against dense PyTorch."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import Locator, expect

from tests.ui.console import Console, console, run_finished_job, running_job
from tests.ui.pages import Watched, assert_key_kept_secret, settled, sign_in
from worker.runner import Outcome

#: The units map's widths in page pixels, measured in one go: a track's, and each layer's neuron bar's.
BARS = """() => {
  const svg = document.querySelector(".side-by-side figure.units svg");
  const track = svg && svg.querySelector("rect.track");
  return track && { track: track.getBoundingClientRect().width,
                    bars: [...svg.querySelectorAll("rect.bar[data-unit=neurons]")]
                      .sort((a, b) => a.dataset.layer - b.dataset.layer).map((e) => e.getBoundingClientRect().width) };
}"""
#: A FLOPs target on the tiny model: counted, not timed, so it is met whatever the machine's speed.
TARGET = {"target_flops": 0.5, "target_seq_len": 16, "stability_shards": 0}

RUNTIMES = {"torch_dense": "PyTorch, dense", "torch_pruned": "PyTorch, pruned", "onnx_dense": "onnxruntime, dense",
            "onnx_pruned": "onnxruntime, pruned", "onnx_int8_pruned": "onnxruntime int8, pruned"}


@pytest.fixture(scope="module")
def target_job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Console, str]]:
    with console(tmp_path_factory.mktemp("console-target")) as live:
        yield live, run_finished_job(live, export="onnx", quantize="int8", **TARGET)


def expect_layers(section: Locator, target: dict[str, Any]) -> None:
    """``section`` shows what ``target`` kept in each layer, and its FLOPs."""
    expect(section).to_contain_text(f"FLOPs kept {100 * target['flops_kept']:.1f}%")
    expect(section).to_contain_text("not timed (a FLOPs target)")
    layers = list(zip(target["heads_per_layer"], target["neurons_per_layer"], strict=True))
    expect(section.locator("tbody tr")).to_have_count(len(layers))
    for layer, (heads, neurons) in enumerate(layers):
        row = section.locator(f"tr[data-layer='{layer}']")
        expect(row).to_contain_text(f"{heads} of {target['heads_total']}")
        expect(row).to_contain_text(f"{neurons} of {target['neurons_total']}")


def test_a_target_job_shows_what_it_kept_in_each_layer(target_job, watched: Watched) -> None:
    live, job_id = target_job
    with live.client() as client:
        target = client.get(f"/v1/jobs/{job_id}/artifacts/report.json").json()["target"]
    sign_in(watched, live, path=f"/ui/jobs/{job_id}")
    section = watched.page.locator("div.target[data-source=report]")
    expect_layers(section, target)
    expect(watched.page.locator("div.target")).to_have_count(1)
    watched.shot("target-layers")


def test_the_map_of_heads_and_neurons_stands_beside_the_head_map(target_job, watched: Watched) -> None:
    live, job_id = target_job
    with live.client() as client:
        target = client.get(f"/v1/jobs/{job_id}/artifacts/report.json").json()["target"]
    assert any(n < target["neurons_total"] for n in target["neurons_per_layer"])  # neurons were cut
    sign_in(watched, live, path=f"/ui/jobs/{job_id}")
    beside = watched.page.locator(".side-by-side")
    expect(beside.locator("figure.heads")).to_be_visible()
    units = beside.locator("figure.units")
    expect(units.locator("svg")).to_have_attribute("aria-label", "; ".join(
        f"layer {layer}: {heads} of {target['heads_total']} heads, {neurons} of {target['neurons_total']} neurons"
        for layer, (heads, neurons) in enumerate(zip(target["heads_per_layer"], target["neurons_per_layer"],
                                                     strict=True))))
    # Each bar is as long as the share it stands for.
    widths = settled(watched.page, BARS)
    for layer, neurons in enumerate(target["neurons_per_layer"]):
        assert widths["bars"][layer] == pytest.approx(widths["track"] * neurons / target["neurons_total"], abs=1.0)
    watched.shot("target-units-beside-head-map")


def test_every_runtime_timed_shows_its_latency_against_dense_pytorch(target_job, watched: Watched) -> None:
    live, job_id = target_job
    with live.client() as client:
        speed = client.get(f"/v1/jobs/{job_id}/artifacts/report.json").json()["export"]["speed"]
    assert speed["baseline"] == "torch_dense" and set(speed["runtimes"]) == set(RUNTIMES)  # ONNX and int8 too
    sign_in(watched, live, path=f"/ui/jobs/{job_id}")
    table = watched.page.locator("table.latency-table")
    expect(table.locator("tbody tr")).to_have_count(len(speed["results"]) * len(RUNTIMES))
    for result in speed["results"]:
        for name, words in RUNTIMES.items():
            row = table.locator(f"tr[data-runtime='{name}'][data-batch='{result['batch_size']}']")
            expect(row.locator("th")).to_have_text(words)
            expect(row.locator("td[data-label=Median]")).to_have_text(f"{result['latency'][name]['p50_ms']:.2f} ms")
            against = row.locator("td").last
            if name == "torch_dense":
                expect(against).to_have_text("the baseline")
            else:
                expect(against).to_contain_text(f"×{result['speedup'][name]:.2f}")
    watched.shot("target-latency-by-runtime")


@pytest.mark.parametrize("stream", [True, False], ids=["event-stream", "polling"])
def test_the_target_is_shown_while_the_job_runs_then_the_report_replaces_it(
        tmp_path_factory: pytest.TempPathFactory, watched: Watched, stream: bool) -> None:
    page = watched.page
    if not stream:
        page.route("**/events", lambda route: route.fulfill(status=502, body="bad gateway"))
    with console(tmp_path_factory.mktemp("console-target-live")) as live, \
            running_job(live, holds=("load", "recovery"), epochs=1, **TARGET) as running:
        # Held in its first stage: running, nothing decided yet, and the page shows just that.
        assert live.job(running.job_id)["target"] is None
        sign_in(watched, live, path=f"/ui/jobs/{running.job_id}")
        expect(page.locator("[data-field=status]")).to_have_text("running")
        expect(page.locator("[data-field=stage]")).to_have_text("load")
        expect(page.locator("div.target")).to_have_count(0)
        # The run decides its allocation and is held again where recovery starts: the open page shows it.
        running.release("load")
        running.wait_for("recovery")
        decided = live.job(running.job_id)
        assert decided["status"] == "running" and decided["target"] is not None
        section = page.locator("div.target[data-source=job]")
        expect_layers(section, decided["target"])
        expect(section.locator(".target-note")).to_contain_text("the final report's figures replace these")
        expect(page.locator("[data-field=status]")).to_have_text("running")
        watched.shot(f"target-decided-{'stream' if stream else 'polling'}")
        # The job ends: the report's section takes the decided one's place.
        running.release("recovery")
        running.thread.join(180)
        assert running.outcome == [Outcome.succeeded]
        with live.client() as client:
            final = client.get(f"/v1/jobs/{running.job_id}/artifacts/report.json").json()["target"]
        expect(page.locator("[data-field=status]")).to_have_text("succeeded")
        expect_layers(page.locator("div.target[data-source=report]"), final)
        expect(page.locator("div.target[data-source=job]")).to_have_count(0)
        expect(page.locator(".target-note")).to_have_count(0)
        urls = list(watched.urls)
        assert_key_kept_secret(watched, live)
    assert any(url.endswith(f"/v1/jobs/{running.job_id}/events") for url in urls)
    assert any("/logs?offset=" in url for url in urls) is not stream
    if not stream:  # the refused stream was reported as a failed request; the page logged no script error
        watched.errors[:] = [e for e in watched.errors if "502" not in e]


def test_a_decided_target_stops_promising_a_report_when_the_report_cannot_be_read(
        tmp_path_factory: pytest.TempPathFactory, watched: Watched) -> None:
    page = watched.page
    page.route("**/artifacts", lambda route: route.fulfill(status=503, body="unavailable"))
    with console(tmp_path_factory.mktemp("console-target-unread")) as live, \
            running_job(live, holds=("recovery",), epochs=1, **TARGET) as running:
        running.wait_for("recovery")
        sign_in(watched, live, path=f"/ui/jobs/{running.job_id}")
        section = page.locator("div.target[data-source=job]")
        expect(section.locator(".target-note")).to_contain_text("the final report's figures replace these")
        running.release("recovery")
        running.thread.join(180)
        assert running.outcome == [Outcome.succeeded]
        expect(page.locator("[data-field=status]")).to_have_text("succeeded")
        expect(page.get_by_text("Could not list the artifacts")).to_be_visible()
        expect(section.locator(".target-note")).to_contain_text("the final report could not be read")
        expect(section.locator(".target-note")).not_to_contain_text("replace these when the job ends")
    watched.errors[:] = [e for e in watched.errors if "503" not in e]


def test_a_target_jobs_page_fits_a_phone_screen(target_job, watched: Watched) -> None:
    live, job_id = target_job
    page = watched.page
    page.set_viewport_size({"width": 390, "height": 844})
    sign_in(watched, live, path=f"/ui/jobs/{job_id}")
    for part in ("figure.units svg", "div.target[data-source=report]", "table.latency-table"):
        expect(page.locator(part)).to_be_visible()
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, f"the target job's page scrolls sideways at 390 px ({width} px wide)"
    watched.shot("phone-target-job")
