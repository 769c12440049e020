"""The console in a real headless Chromium, against the real app and jobs run by the real worker.

Each test saves screenshots under its ``tmp_path`` and, where it signs in, checks that the key never
reached a URL, a cookie or the server log. The ``watched`` fixture fails a test on any script error
or Content-Security-Policy violation in the page.
"""

from __future__ import annotations

import hashlib
import re
import tarfile
from pathlib import Path

from playwright.sync_api import expect

from tests.support.helpers import tar_directory
from tests.ui.console import Console, console, running_job, tiny_inputs
from tests.ui.pages import Watched, assert_key_kept_secret, sign_in
from worker.runner import Outcome, execute_job


def _artifact_json(live: Console, job_id: str, name: str) -> dict:
    with live.client() as client:
        answer: dict = client.get(f"/v1/jobs/{job_id}/artifacts/{name}").json()
    return answer


def test_sign_in_then_read_a_finished_jobs_k_star_accuracy_and_mss_curve(served: Console, watched: Watched) -> None:
    job_id = served.jobs["succeeded"]
    result = served.job(job_id)["result"]
    curve = _artifact_json(served, job_id, "mss_curve.json")
    page = watched.page
    sign_in(watched, served)
    row = page.locator(f"tr[data-job-id='{job_id}']")
    expect(row).to_contain_text("succeeded")
    expect(page.locator(f"tr[data-job-id='{served.jobs['failed']}']")).to_contain_text("failed")
    watched.shot("jobs")
    row.get_by_role("link").click()
    expect(page).to_have_url(f"{served.url}/ui/jobs/{job_id}")
    summary = page.locator("dl.summary")
    expect(summary.locator("[data-field=k_star]")).to_contain_text(str(result["k_star"]))
    expect(summary.locator("[data-field=k_star]")).to_contain_text(f"degree {curve['polynomial_degree']}")
    expect(summary.locator("[data-field=accuracy]")).to_contain_text(f"{100 * result['pruned_accuracy']:.1f}%")
    expect(summary.locator("[data-field=heads]")).to_contain_text(f"{result['heads_kept']} of {result['heads_total']}")
    # The speed-up with its interval (or "no measurable change" when that holds 1), at batch 32.
    expect(summary.locator("[data-field=speedup]")).to_contain_text(f"×{result['speedup']:.2f}")
    expect(summary.locator("[data-field=speedup]")).to_contain_text("at batch 32")
    report = _artifact_json(served, job_id, "report.json")
    dense, pruned = report["metrics"]["dense"], report["metrics"]["pruned"]
    expect(summary.locator("[data-field=accuracy]")).to_contain_text(
        f"{100 * dense['accuracy']:.1f}% → {100 * pruned['accuracy']:.1f}%")
    expect(summary.locator("[data-field=macro_f1]")).to_have_text(
        re.compile(re.escape(f"{dense['macro_f1']:.3f} → {pruned['macro_f1']:.3f}")))
    share = 1 - report["parameters"]["pruned"]["total"] / report["parameters"]["dense"]["total"]
    expect(summary.locator("[data-field=parameters]")).to_contain_text(f"(−{100 * share:.1f}%)")
    # Layer retention: one bar per layer, read by its label.
    grid = _artifact_json(served, job_id, "head_map.json")
    expect(page.locator("figure.retention svg")).to_have_attribute("aria-label", "; ".join(
        f"layer {layer}: {len(grid['kept'].get(str(layer), []))} of {grid['num_heads']}"
        for layer in range(grid["num_layers"])))
    expect(page.locator("[data-field=labels]")).to_have_count(0)  # a job without labels shows no empty row
    # The knee of every degree is marked and k* is ringed; hovering k* reads its k and MSS.
    chart = page.locator("figure.mss")
    expect(chart.locator(".kstar-label")).to_have_text(f"k* = {result['k_star']}")
    assert chart.locator("line.knee").count() == len(set(curve["knees_by_degree"].values()))
    chart.locator("circle.kstar").scroll_into_view_if_needed()
    box = chart.locator("circle.kstar").bounding_box()
    assert box is not None
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    i = curve["k"].index(result["k_star"])
    tooltip = chart.get_by_role("tooltip")
    expect(tooltip).to_contain_text(f"k = {result['k_star']}")
    expect(tooltip).to_contain_text(f"MSS = {curve['mss'][i]:.4f}")
    watched.shot("finished-job")
    assert_key_kept_secret(watched, served)


def test_hovering_a_head_shows_its_layer_index_salience_cluster_and_why_it_was_kept(
    served: Console, watched: Watched
) -> None:
    job_id = served.jobs["succeeded"]
    heads = _artifact_json(served, job_id, "head_map.json")
    layer, head = heads["representatives"][0]
    page = watched.page
    sign_in(watched, served, path=f"/ui/jobs/{job_id}")  # a deep link survives signing in
    grid = page.locator("figure.heads")
    grid.locator(f"rect.cell[data-layer='{layer}'][data-head='{head}']").hover()
    tooltip = grid.get_by_role("tooltip")
    expect(tooltip).to_contain_text(f"Layer {layer} · head {head}")
    expect(tooltip).to_contain_text(f"Salience {heads['salience'][layer][head]:.3f}")
    expect(tooltip).to_contain_text(f"Cluster {heads['cluster'][layer][head]}")
    expect(tooltip).to_contain_text("representative")
    watched.shot("head-tooltip")
    # A pruned head says so; the colour switch shows the salience scale and the cluster numbers.
    kept = {(int(l_), h_) for l_, hs in heads["kept"].items() for h_ in hs}
    pruned = next((l_, h_) for l_ in range(heads["num_layers"]) for h_ in range(heads["num_heads"])
                  if (l_, h_) not in kept)
    grid.locator(f"rect.cell[data-layer='{pruned[0]}'][data-head='{pruned[1]}']").hover()
    expect(tooltip).to_contain_text("Pruned")
    grid.get_by_label("Salience").check()
    expect(grid.locator(".legend")).to_contain_text("salience")
    grid.get_by_label("Cluster").check()
    label = grid.locator(f"rect.cell[data-layer='{layer}'][data-head='{head}'] + g + text")
    expect(label).to_have_text(str(heads["cluster"][layer][head]))
    watched.shot("head-clusters")
    assert_key_kept_secret(watched, served)


def test_the_plots_can_be_read_with_the_keyboard_alone(served: Console, watched: Watched) -> None:
    job_id = served.jobs["succeeded"]
    page = watched.page
    sign_in(watched, served)
    # Tab from the top of the page to the job's link and open it with Enter.
    link = page.locator(f"tr[data-job-id='{job_id}'] a")
    expect(link).to_be_visible()
    for _ in range(30):
        page.keyboard.press("Tab")
        if link.evaluate("element => element === document.activeElement"):
            break
    page.keyboard.press("Enter")
    expect(page).to_have_url(f"{served.url}/ui/jobs/{job_id}")
    # The skip link moves the focus to the content and keeps this page (its "#view" resolves against <base>).
    page.locator("a.skip").focus()
    page.keyboard.press("Enter")
    expect(page.locator("main#view")).to_be_focused()
    expect(page).to_have_url(f"{served.url}/ui/jobs/{job_id}")
    grid = page.locator("figure.heads svg.focusable")
    grid.focus()
    tooltip = page.locator("figure.heads").get_by_role("tooltip")
    expect(tooltip).to_contain_text("Layer 0 · head 0")
    page.keyboard.press("ArrowRight")
    expect(tooltip).to_contain_text("Layer 0 · head 1")
    # A resize redraws the plot (a new SVG); the reader keeps the focus, the head being read and its tooltip.
    page.set_viewport_size({"width": 1000, "height": 900})
    expect(grid).to_be_focused()
    expect(tooltip).to_contain_text("Layer 0 · head 1")
    page.keyboard.press("ArrowDown")
    expect(tooltip).to_contain_text("Layer 1 · head 1")
    curve = page.locator("figure.mss svg.focusable")
    curve.focus()
    page.keyboard.press("Home")
    curve_tip = page.locator("figure.mss").get_by_role("tooltip")
    expect(curve_tip).to_contain_text("k = 2")
    page.set_viewport_size({"width": 1280, "height": 900})
    expect(curve).to_be_focused()
    page.keyboard.press("ArrowRight")
    expect(curve_tip).to_contain_text("k = 3")
    watched.shot("keyboard")
    assert_key_kept_secret(watched, served)


def test_a_failed_job_shows_its_error_code_and_message_and_the_filter_finds_it(
    served: Console, watched: Watched
) -> None:
    job_id = served.jobs["failed"]
    page = watched.page
    sign_in(watched, served)
    page.get_by_label("Status").select_option("failed")
    expect(page).to_have_url(re.compile(r"/ui/\?status=failed$"))
    rows = page.locator("table.jobs tbody tr")
    expect(rows).to_have_count(1)
    expect(rows.first).to_have_attribute("data-job-id", job_id)
    rows.first.get_by_role("link").click()
    problem = page.get_by_role("alert")
    expect(problem.locator("[data-field=error_code]")).to_have_text("invalid_dataset")
    expect(problem.locator("[data-field=error_message]")).to_contain_text("label")
    expect(page.get_by_role("button", name="Cancel job")).to_be_hidden()
    expect(page.get_by_role("log")).to_contain_text("failed: invalid_dataset")
    watched.shot("failed-job")
    assert_key_kept_secret(watched, served)


def test_cancel_a_running_job_from_its_page(served: Console, watched: Watched) -> None:
    page = watched.page
    with running_job(served) as running:
        sign_in(watched, served, path=f"/ui/jobs/{running.job_id}")
        expect(page.locator("[data-field=status]")).to_have_text("running")
        expect(page.locator("[data-field=stage]")).to_have_text("recovery")
        watched.shot("running-job")
        page.get_by_role("button", name="Cancel job").click()
        expect(page.locator("[data-field=status]")).to_have_text("cancelled")
        expect(page.locator("[data-field=error_code]")).to_have_text("cancelled")
        expect(page.get_by_role("button", name="Cancel job")).to_be_hidden()
        expect(page.get_by_role("log")).to_contain_text("cancelled on request")
        watched.shot("cancelled-job")
        running.thread.join(120)
        assert running.outcome == [Outcome.cancelled]
    assert_key_kept_secret(watched, served)


def test_downloads_send_the_key_as_a_header_and_match_the_manifest(served: Console, watched: Watched) -> None:
    job_id = served.jobs["succeeded"]
    with served.client() as client:
        manifest = {a["name"]: a for a in client.get(f"/v1/jobs/{job_id}/artifacts").json()["data"]}
    page = watched.page
    sign_in(watched, served, path=f"/ui/jobs/{job_id}")
    row = page.locator("tr[data-artifact='mss_curve.json']")
    expect(row).to_contain_text(manifest["mss_curve.json"]["sha256"])
    with page.expect_download() as started:
        row.get_by_role("button", name="Download mss_curve.json").click()
    download = started.value
    assert download.suggested_filename == "mss_curve.json"
    saved = Path(download.path())
    assert hashlib.sha256(saved.read_bytes()).hexdigest() == manifest["mss_curve.json"]["sha256"]
    assert download.url.startswith("blob:")
    watched.shot("artifacts")
    assert_key_kept_secret(watched, served)


def test_submit_archives_from_the_form_and_follow_the_job_to_its_head_map(
    served: Console, watched: Watched, tmp_path: Path
) -> None:
    model, data = tiny_inputs(served.local_root)
    model_archive = tar_directory(model, tmp_path / "model.tar.gz")
    data_archive = tar_directory(data, tmp_path / "data.tar.gz")
    with tarfile.open(model_archive) as tar:
        assert any(name.endswith("config.json") for name in tar.getnames())
    page = watched.page
    sign_in(watched, served)
    page.get_by_role("link", name="New job").first.click()
    expect(page).to_have_url(f"{served.url}/ui/submit")
    page.locator("#model-file").set_input_files(model_archive)
    page.locator("#dataset-file").set_input_files(data_archive)
    page.get_by_label("Polynomial degree of the knee").fill("3")
    page.get_by_label("Recovery epochs").fill("1")
    page.locator("summary", has_text="More settings").click()
    page.get_by_label("Any other cahp prune setting").fill(
        '{"dense_finetune": "never", "untrained_dense": "warn", "batch_size": 16, "max_length": 32, "seed": 0}')
    watched.shot("submit-form")
    page.get_by_role("button", name="Submit job").click()
    expect(page).to_have_url(re.compile(r"/ui/jobs/[0-9a-f]+$"))
    job_id = page.url.rsplit("/", 1)[1]
    expect(page.locator("[data-field=status]")).to_have_text("queued")
    job = served.job(job_id)
    assert job["model"]["uri"].startswith("upload://") and job["dataset"]["uri"].startswith("upload://")
    assert job["params"]["poly_degree"] == 3 and job["params"]["epochs"] == 1
    # A worker takes the job; the open page follows it to the end and draws the result.
    assert execute_job(job_id=job_id, context=served.worker()) is Outcome.succeeded
    expect(page.locator("[data-field=status]")).to_have_text("succeeded")
    expect(page.locator("figure.heads rect.cell")).to_have_count(8)
    expect(page.locator("[data-field=k_star]")).to_contain_text("degree 3")
    watched.shot("submitted-job")
    assert_key_kept_secret(watched, served)


def test_pages_fit_a_phone_screen(served: Console, watched: Watched) -> None:
    page = watched.page
    page.set_viewport_size({"width": 390, "height": 844})
    sign_in(watched, served, path=f"/ui/jobs/{served.jobs['succeeded']}")
    expect(page.locator("figure.heads rect.cell").first).to_be_visible()
    # The MSS curve's degree labels at this width: tests/ui/test_console_mss_labels.py (a curve whose knees crowd).
    for path in (f"/ui/jobs/{served.jobs['succeeded']}", "/ui/", "/ui/submit", f"/ui/jobs/{served.jobs['failed']}"):
        page.goto(served.url + path)
        expect(page.locator("main h1").first).to_be_visible()
        page.wait_for_load_state("networkidle")
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= 390, f"{path} scrolls sideways at 390 px ({width} px wide)"
        watched.shot("phone-" + (path.strip("/").replace("/", "-") or "root"))
    assert_key_kept_secret(watched, served)


def test_with_no_auth_the_console_opens_without_signing_in(watched: Watched, tmp_path: Path) -> None:
    with console(tmp_path, no_auth=True) as live:
        model, data = tiny_inputs(live.local_root)
        job_id = live.submit({"model": {"uri": f"file://{model}"}, "dataset": {"uri": f"file://{data}"},
                              "labels": {"branch": "main"},
                              "params": {"epochs": 1, "dense_finetune": "never", "untrained_dense": "warn",
                                         "max_length": 32, "export": "none"}})
        page = watched.page
        page.goto(live.url + "/ui")
        expect(page.get_by_text("local mode, no key")).to_be_visible()
        expect(page.locator(f"tr[data-job-id='{job_id}']")).to_contain_text("queued")
        expect(page.locator(f"tr[data-job-id='{job_id}'] td[data-label=Labels]")).to_have_text("branch=main")
        expect(page.get_by_role("heading", name="Sign in")).to_have_count(0)
        watched.shot("no-auth")
        # The list follows the jobs without a reload: a newer job comes in on top, and the first one's
        # row turns succeeded once the worker has run it.
        newer = live.submit({"model": {"uri": f"file://{model}"}, "dataset": {"uri": f"file://{data}"}})
        expect(page.locator("tbody tr").first).to_have_attribute("data-job-id", newer)
        expect(page.locator("tbody tr").nth(1)).to_have_attribute("data-job-id", job_id)
        assert execute_job(job_id=job_id, context=live.worker()) is Outcome.succeeded
        expect(page.locator(f"tr[data-job-id='{job_id}']")).to_contain_text("succeeded", timeout=15_000)
        watched.shot("no-auth-live")
