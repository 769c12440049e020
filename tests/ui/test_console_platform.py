"""The console as the platform engineer reads it: model names, warnings, ONNX and int8 figures, error
codes on the list at 1280 px, links without the key, and the New job form's columns, split and labels."""

from __future__ import annotations

import csv
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import expect

from app.core.db import repository, transaction
from tests.support.helpers import free_port, job_body, tar_directory
from tests.support.tiny_models import make_texts
from tests.ui.console import Console, console, tiny_inputs
from tests.ui.pages import Watched, assert_key_kept_secret, sign_in
from worker.runner import Outcome, execute_job

LABELS = {"git/commit": "4f2c9e1d8a7b6c5e4f3a2b1c0d9e8f7a6b5c4d3e", "branch": "feature/platform-day-console",
          "pipeline": "https://ci.example.com/platform/cahp/-/pipelines/123456789"}


def _speedup_text(value: float, low: float | None, high: float | None) -> str:
    """The rule of the cards and `cahp prune`, as the console must show it."""
    if low is None or high is None:
        return f"×{value:.2f}"
    if low <= 1 <= high:
        return f"no measurable change (×{value:.2f}, 95 % interval ×{low:.2f}–×{high:.2f})"
    return f"×{value:.2f} (95 % interval ×{low:.2f}–×{high:.2f})"


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    """A served app whose registry cannot be reached, with a job it ran to success (ONNX and int8, a name,
    long labels, an uploaded model) and one whose registration failed."""
    # Nothing listens at this registry: jobs that ask to register fail as registration_failed.
    with console(tmp_path_factory.mktemp("platform"), allowed_outbound_hosts=("127.0.0.1",),
                 mlflow_tracking_uri=f"http://127.0.0.1:{free_port()}") as live:
        model, data = tiny_inputs(live.local_root)
        archive = tar_directory(model, live.local_root.parent / "reviews-bert.tar.gz")
        with live.client() as client, archive.open("rb") as handle:
            uploaded = client.post("/v1/uploads", files={"file": ("reviews-bert.tar.gz", handle)}).json()["uri"]
        body = {**job_body(uploaded, f"file://{data}", export="onnx", quantize="int8", latency_repeats=4),
                "name": "reviews-pruned", "labels": LABELS}
        live.jobs["succeeded"] = live.submit(body)
        assert execute_job(job_id=live.jobs["succeeded"], context=live.worker()) is Outcome.succeeded
        live.jobs["failed"] = live.submit({**job_body(f"file://{model}", f"file://{data}"),
                                           "register": {"model_name": "reviews"}})
        # A first attempt whose worker shut down and handed the job back: the page lists both.
        context = live.worker()
        with transaction(context.sessions) as session:
            assert repository.claim_job(session, job_id=live.jobs["failed"], worker_id="old-host:1:stopped")
            assert repository.hand_back_job(session, job_id=live.jobs["failed"], worker_id="old-host:1:stopped",
                                            messages=["handed back"])
        assert execute_job(job_id=live.jobs["failed"], context=live.worker()) is Outcome.failed
        yield live


def test_the_list_fits_1280_px_with_names_labels_warnings_and_error_codes(
    platform: Console, watched: Watched
) -> None:
    page = watched.page
    sign_in(watched, platform)
    ok = page.locator(f"tr[data-job-id='{platform.jobs['succeeded']}']")
    failed = page.locator(f"tr[data-job-id='{platform.jobs['failed']}']")
    expect(ok.locator("td[data-label=Model] .model-title")).to_have_text("reviews-pruned")
    expect(ok.locator("td[data-label=Model] .model-base")).to_have_text("reviews-bert")
    expect(ok.locator("td[data-label=Model]")).not_to_contain_text("upload://")
    expect(failed.locator("td[data-label=Model]")).to_have_text("model-2x4")
    warnings = platform.job(platform.jobs["succeeded"])["result"]["warnings"]
    expect(ok.locator("[data-field=warnings]")).to_have_text(f"⚠ {len(warnings)} warning" + "s" * (len(warnings) > 1))
    expect(failed.locator("[data-field=error_code]")).to_have_text("registration_failed")
    expect(ok.locator("td[data-label=Labels] .chip")).to_have_count(3)
    # No sideways scrolling, and the last column (Duration) is inside the window.
    wrap = page.locator(".table-wrap")
    assert wrap.evaluate("(e) => e.scrollWidth <= e.clientWidth"), "the job list scrolls sideways at 1280 px"
    box = page.get_by_role("columnheader", name="Duration").bounding_box()
    assert box is not None and box["x"] + box["width"] <= 1280
    watched.shot("jobs-1280")
    assert_key_kept_secret(watched, platform)


def test_a_job_page_shows_warnings_first_onnx_and_int8_figures_and_copies_a_keyless_link(
    platform: Console, watched: Watched
) -> None:
    job_id = platform.jobs["succeeded"]
    job = platform.job(job_id)
    result = job["result"]
    page = watched.page
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=platform.url)
    sign_in(watched, platform, path=f"/ui/jobs/{job_id}")
    expect(page.locator("[data-field=name]")).to_have_text("reviews-pruned")
    expect(page.locator("[data-field=model] strong")).to_have_text("reviews-bert")
    quality = page.locator(".quality[data-field=warnings]")
    expect(quality.locator("li")).to_have_count(len(result["warnings"]))
    expect(quality.locator("li").first).to_have_text(result["warnings"][0])
    # The warnings come before the result's figures.
    assert page.locator(".quality").bounding_box()["y"] < page.locator("dl.summary").bounding_box()["y"]
    onnx, int8 = page.locator("[data-field=onnx]"), page.locator("[data-field=int8]")
    expect(onnx).to_contain_text(f"accuracy {100 * result['onnx_accuracy']:.1f}%")
    expect(onnx).to_contain_text(f"max |logit difference| from PyTorch {result['onnx_max_abs_diff']:.1e}".replace(
        "e-0", "e-"))
    expect(onnx).to_contain_text(_speedup_text(result["onnx_speedup"], result["onnx_speedup_low"],
                                               result["onnx_speedup_high"]))
    expect(int8).to_contain_text(f"accuracy {100 * result['int8_accuracy']:.1f}%")
    expect(int8).to_contain_text(f"{result['int8_max_abs_diff']:.4f}")
    expect(int8).to_contain_text(_speedup_text(result["int8_speedup"], result["int8_speedup_low"],
                                               result["int8_speedup_high"]))
    expect(page.locator("[data-field=speedup]")).to_contain_text(
        _speedup_text(result["speedup"], result["speedup_low"], result["speedup_high"]) + " at batch 32")
    watched.shot("deployable-figures")

    row = page.locator("tr[data-artifact='report.json']")
    row.get_by_role("button", name="Copy a link to report.json that needs no key").click()
    expect(page.locator(".notice")).to_contain_text("downloads it without a key until")
    link = page.evaluate("navigator.clipboard.readText()")
    signed = rf"^{re.escape(platform.url)}/v1/artifacts/{job_id}/report\.json\?key=\w+&expires=\d+&signature="
    assert re.match(signed, link)
    fetched = httpx.get(link)  # no key
    assert fetched.status_code == 200 and fetched.json()["identity"]["name"] == "reviews-pruned"
    assert_key_kept_secret(watched, platform)


def test_a_failed_registration_shows_its_code_and_the_model_it_kept(platform: Console, watched: Watched) -> None:
    page = watched.page
    sign_in(watched, platform, path=f"/ui/jobs/{platform.jobs['failed']}")
    expect(page.locator(".problem [data-field=error_code]")).to_have_text("registration_failed")
    expect(page.locator("[data-field=registry]")).to_contain_text("registration as reviews failed")
    expect(page.locator("tr[data-artifact='model.tar.gz']")).to_be_visible()
    attempts = page.locator("[data-field=attempts] li")
    expect(attempts).to_have_count(2)
    expect(attempts.nth(0)).to_contain_text("old-host:1:stopped")
    expect(attempts.nth(0)).to_contain_text("handed back: its worker shut down")
    expect(attempts.nth(1)).to_contain_text("failed")
    watched.shot("registration-failed")


def _named_columns_dataset(root: Path) -> Path:
    data = root / "sentences"
    data.mkdir(exist_ok=True)
    for split, n, seed in (("train", 60, 1), ("dev", 30, 2)):
        texts, labels = make_texts(n, num_classes=3, seed=seed)
        with (data / f"{split}.csv").open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["sentence", "category"])
            writer.writerows((text, ("neg", "neu", "pos")[int(y)]) for text, y in zip(texts, labels, strict=True))
    return data


def test_the_new_job_form_sets_columns_split_labels_name_and_registration(
    platform: Console, watched: Watched
) -> None:
    model, _ = tiny_inputs(platform.local_root)
    data = _named_columns_dataset(platform.local_root)
    page = watched.page
    sign_in(watched, platform, path="/ui/submit")
    page.locator("#model-uri").fill(f"file://{model}")
    page.locator("#dataset-uri").fill(f"file://{data}")
    page.get_by_label("Text column").fill("sentence")
    page.get_by_label("Label column").fill("category")
    page.get_by_label("Evaluation split").fill("dev")
    page.get_by_label("Recovery epochs").fill("1")
    page.get_by_label("Name (optional)").fill("sentences-pruned")
    page.get_by_label("Labels (optional)").fill("git/commit=4f2c9e1\nbranch=main")
    page.get_by_label("Register in the MLflow registry as (optional)").fill("sentences")
    watched.shot("submit-form-platform")
    page.get_by_role("button", name="Submit job").click()
    expect(page).to_have_url(re.compile(r"/ui/jobs/[0-9a-f]+$"))
    job = platform.job(page.url.rsplit("/", 1)[1])
    dataset = job["dataset"]
    assert (dataset["text_column"], dataset["label_column"], dataset["eval_split"]) == ("sentence", "category", "dev")
    assert job["labels"] == {"git/commit": "4f2c9e1", "branch": "main"} and job["name"] == "sentences-pruned"
    assert job["register"]["model_name"] == "sentences" and job["params"]["epochs"] == 1
    expect(page.locator("[data-field=name]")).to_have_text("sentences-pruned")
    expect(page.locator("[data-field=registry]")).to_contain_text("to be registered as sentences")
    assert_key_kept_secret(watched, platform)


def test_the_new_fields_still_fit_a_phone_screen(platform: Console, watched: Watched) -> None:
    page = watched.page
    page.set_viewport_size({"width": 390, "height": 844})
    sign_in(watched, platform)
    for path in ("/ui/", f"/ui/jobs/{platform.jobs['succeeded']}", f"/ui/jobs/{platform.jobs['failed']}",
                 "/ui/submit"):
        page.goto(platform.url + path)
        expect(page.locator("main h1").first).to_be_visible()
        page.wait_for_load_state("networkidle")
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= 390, f"{path} scrolls sideways at 390 px ({width} px wide)"
        watched.shot("phone-platform-" + (path.strip("/").replace("/", "-") or "root"))
