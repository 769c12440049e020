"""The submit form's strategy, recovery, speed-target and accuracy-drop controls, in a real headless Chromium.

The choices come from the API's description of a job's settings (``/openapi.json``), so the select lists
what the engine registers; the job the form makes carries what was picked; and a key set both in a control
and in "More settings (JSON)" with another value is refused, naming both, before anything is sent.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from playwright.sync_api import expect

from cahp_engine.config import DEFAULTS, RECOVERY_MODES, STRATEGIES
from tests.ui.console import Console, console, tiny_inputs
from tests.ui.pages import Watched, sign_in

#: What the form is given in its JSON box besides its own controls: a tiny job, never run here.
EXTRA = '{"dense_finetune": "never", "untrained_dense": "warn", "max_length": 32, "seed": 0}'


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    with console(tmp_path_factory.mktemp("console-submit")) as served:
        yield served


def _open_form(watched: Watched, live: Console) -> None:
    sign_in(watched, live, path="/ui/submit")
    expect(watched.page.get_by_role("heading", name="New job")).to_be_visible()
    # The choices are filled from the API's settings once they are read: the select is enabled then.
    expect(watched.page.locator("#strategy")).to_be_enabled()


def _fill_inputs(watched: Watched, live: Console) -> None:
    model, data = tiny_inputs(live.local_root)
    watched.page.locator("#model-uri").fill(f"file://{model}")
    watched.page.locator("#dataset-uri").fill(f"file://{data}")


def _jobs(live: Console) -> list[str]:
    with live.client() as client:
        return [job["id"] for job in client.get("/v1/jobs").json()["data"]]


def test_the_strategy_select_lists_every_registered_strategy_with_the_apis_default(
        live: Console, watched: Watched) -> None:
    _open_form(watched, live)
    page = watched.page
    assert page.locator("#strategy option").evaluate_all("options => options.map(o => o.value)") == list(STRATEGIES)
    assert "cahp-layer-salience" in STRATEGIES
    assert page.locator("#recovery option").evaluate_all("options => options.map(o => o.value)") == \
        list(RECOVERY_MODES)
    # The API's defaults are the ones shown, and marked.
    expect(page.locator("#strategy")).to_have_value(DEFAULTS["strategy"])
    expect(page.locator("#recovery")).to_have_value(DEFAULTS["recovery"])
    expect(page.locator("#strategy option:checked")).to_have_text(f"{DEFAULTS['strategy']} (default)")
    expect(page.locator("#poly-degree")).to_have_value(str(DEFAULTS["poly_degree"]))
    expect(page.locator("#epochs")).to_have_value(f"{DEFAULTS['epochs']:g}")
    expect(page.locator("#target-speedup")).to_have_value("")
    expect(page.locator("#max-accuracy-drop")).to_have_value("")
    watched.shot("submit-settings")


def test_the_job_made_by_the_form_carries_the_strategy_recovery_and_speed_target_picked(
        live: Console, watched: Watched) -> None:
    _open_form(watched, live)
    _fill_inputs(watched, live)
    page = watched.page
    page.get_by_label("Head-selection strategy").select_option("cahp-layer-salience")
    page.get_by_label("Recovery", exact=True).select_option("reconstruct+finetune")
    page.get_by_label("Target speed-up").fill("1.5")
    page.locator("summary", has_text="More settings").click()
    page.get_by_label("Any other cahp prune setting").fill(EXTRA)
    page.get_by_role("button", name="Submit job").click()
    expect(page).to_have_url(re.compile(r"/ui/jobs/[0-9a-f]+$"))
    job = live.job(page.url.rsplit("/", 1)[1])
    assert job["params"]["strategy"] == "cahp-layer-salience"
    assert job["params"]["recovery"] == "reconstruct+finetune"
    assert job["params"]["target_speedup"] == 1.5
    assert job["params"]["max_accuracy_drop"] is None  # left empty: none
    assert job["params"]["dense_finetune"] == "never"
    expect(page.locator("[data-field=params] summary")).to_contain_text(
        "strategy cahp-layer-salience, recovery reconstruct+finetune")
    watched.shot("submitted-settings")


def test_a_key_set_in_a_control_and_in_the_json_box_to_another_value_is_refused(
        live: Console, watched: Watched) -> None:
    before = _jobs(live)
    _open_form(watched, live)
    _fill_inputs(watched, live)
    page = watched.page
    page.get_by_label("Head-selection strategy").select_option("random")
    page.locator("summary", has_text="More settings").click()
    page.get_by_label("Any other cahp prune setting").fill('{"strategy": "salience", "max_length": 32}')
    page.get_by_role("button", name="Submit job").click()
    expect(page.get_by_role("alert")).to_contain_text(
        'strategy is "random" in its field and "salience" in More settings: set it in one place')
    expect(page).to_have_url(f"{live.url}/ui/submit")
    assert _jobs(live) == before
    # The same value in both places is no conflict; an empty optional field leaves the key to the JSON box.
    page.get_by_label("Any other cahp prune setting").fill(
        '{"strategy": "random", "max_accuracy_drop": 2.5, "dense_finetune": "never", "untrained_dense": "warn", '
        '"max_length": 32}')
    page.get_by_role("button", name="Submit job").click()
    expect(page).to_have_url(re.compile(r"/ui/jobs/[0-9a-f]+$"))
    job = live.job(page.url.rsplit("/", 1)[1])
    assert (job["params"]["strategy"], job["params"]["max_accuracy_drop"]) == ("random", 2.5)
