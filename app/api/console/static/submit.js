// The submit form: upload a model and a dataset archive (or name them by URI), say which columns and
// split to read, pick the degree, the epochs, the strategy, the recovery and optionally a speed target
// or an accuracy budget, name the model and label the job, submit. One Idempotency-Key per filled-in
// form, so a double click or a retry makes one job.
//
// The strategy and recovery choices and every default come from the API's own description of a job's
// settings (JobParams in /openapi.json: each choice's enum and its x-cahp-default), never a list kept
// here. A setting is set in one place: "More settings (JSON)" may name a key that has its own control
// only with the same value; a different one is refused, naming both. An empty speed-target or
// accuracy-drop field sets nothing, so the JSON box may set those.

import { api, ApiError, upload } from "./api.js";
import { clear, formatPercent, h } from "./dom.js";

const ARCHIVES = ".tar.gz,.tgz,.tar,.zip";

function idempotencyKey() {
  // crypto.randomUUID needs a secure context; getRandomValues works on plain http too (team mode).
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return `ui-${[...bytes].map((b) => b.toString(16).padStart(2, "0")).join("")}`;
}

let settingsSchema = null;

/** JobParams' properties from the API's OpenAPI document (read once per page load). */
async function jobSettings() {
  settingsSchema ??= api("openapi.json").then((spec) => spec.components.schemas.JobParams.properties)
    .catch((problem) => { settingsSchema = null; throw problem; });
  return settingsSchema;
}

/** Fill `select` with the choices of a setting's schema, the API's default selected and marked. */
function fillChoices(select, property) {
  const choices = (property.anyOf || [property]).flatMap((branch) => branch.enum || []);
  const fallback = property["x-cahp-default"];
  clear(select, ...choices.map((choice) => h("option", { value: choice, selected: choice === fallback },
    choice === fallback ? `${choice} (default)` : choice)));
  select.disabled = choices.length === 0;
}

function source(kind, label, hint) {
  const file = h("input", { type: "file", id: `${kind}-file`, accept: ARCHIVES, "aria-describedby": `${kind}-hint` });
  const uri = h("input", { type: "text", id: `${kind}-uri`, spellcheck: "false", autocomplete: "off",
                           placeholder: kind === "model" ? "hf://org/name" : "hf://datasets/org/name",
                           "aria-describedby": `${kind}-hint` });
  const bar = h("progress", { max: 1, value: 0, hidden: true, "aria-label": `${label} upload` });
  const barText = h("span", { class: "muted" });
  const fieldset = h("fieldset", {}, h("legend", {}, label),
    h("label", { for: `${kind}-file` }, "Archive to upload"), file,
    h("label", { for: `${kind}-uri` }, "or a reference"), uri,
    h("p", { id: `${kind}-hint`, class: "muted" }, hint),
    h("div", { class: "upload-progress" }, bar, barText));
  return { fieldset, file, uri, bar, barText };
}

export function submitView({ navigate }) {
  let key = idempotencyKey();
  const uploaded = new Map(); // "name:size:lastModified" -> upload:// URI, so a retry does not upload again
  const model = source("model", "Model",
    "A Hugging Face classifier directory (config.json, safetensors weights, tokenizer) as .tar.gz, .tgz, .tar or .zip.");
  const dataset = source("dataset", "Dataset",
    "A directory of train.csv and test.csv (or .jsonl/.parquet) with text and label columns, as an archive.");
  const text = h("input", { type: "text", id: "text-column", placeholder: "text", spellcheck: "false", autocomplete: "off" });
  const label = h("input", { type: "text", id: "label-column", placeholder: "label", spellcheck: "false", autocomplete: "off" });
  const evalSplit = h("input", { type: "text", id: "eval-split", placeholder: "test, validation, dev…", spellcheck: "false",
                                 autocomplete: "off", "aria-describedby": "eval-split-hint" });
  dataset.fieldset.append(
    h("div", { class: "pair" },
      h("div", {}, h("label", { for: "text-column" }, "Text column"), text),
      h("div", {}, h("label", { for: "label-column" }, "Label column"), label),
      h("div", {}, h("label", { for: "eval-split" }, "Evaluation split"), evalSplit)),
    h("p", { id: "eval-split-hint", class: "muted" },
      "Empty fields take the defaults: columns text and label, the first labelled split of test, validation, dev."));
  const name = h("input", { type: "text", id: "job-name", maxlength: 200, spellcheck: "false", autocomplete: "off",
                            placeholder: "sst5-minilm-pruned" });
  const labels = h("textarea", { id: "job-labels", rows: 2, spellcheck: "false", placeholder: "git/commit=4f2c9e1\nbranch=main",
                                 "aria-describedby": "job-labels-hint" });
  const register = h("input", { type: "text", id: "register-model", maxlength: 256, spellcheck: "false", autocomplete: "off",
                                "aria-describedby": "register-hint" });
  const degree = h("input", { type: "number", id: "poly-degree", min: 1, max: 10, step: 1, value: 2, required: true });
  const epochs = h("input", { type: "number", id: "epochs", min: 0, step: "any", value: 3, required: true });
  const strategy = h("select", { id: "strategy", disabled: true, "aria-describedby": "strategy-hint" });
  const recovery = h("select", { id: "recovery", disabled: true });
  const speedup = h("input", { type: "number", id: "target-speedup", min: 1, max: 1000, step: "any", placeholder: "none",
                               "aria-describedby": "targets-hint" });
  const accuracyDrop = h("input", { type: "number", id: "max-accuracy-drop", min: 0, max: 100, step: "any",
                                    placeholder: "none", "aria-describedby": "targets-hint" });
  const extra = h("textarea", { id: "extra-params", rows: 4, spellcheck: "false", placeholder: '{"seed": 42, "batch_size": 16}',
                                "aria-describedby": "extra-hint" });
  const error = h("div", { class: "error", role: "alert" });
  const status = h("p", { class: "muted", "aria-live": "polite" });
  const button = h("button", { type: "submit" }, "Submit job");
  const form = h("form", { class: "submit", novalidate: true },
    h("h1", {}, "New job"),
    model.fieldset, dataset.fieldset,
    h("fieldset", {}, h("legend", {}, "Settings"),
      h("div", { class: "pair" },
        h("div", {}, h("label", { for: "poly-degree" }, "Polynomial degree of the knee"), degree),
        h("div", {}, h("label", { for: "epochs" }, "Recovery epochs"), epochs)),
      h("div", { class: "pair" },
        h("div", {}, h("label", { for: "strategy" }, "Head-selection strategy"), strategy),
        h("div", {}, h("label", { for: "recovery" }, "Recovery"), recovery)),
      h("p", { id: "strategy-hint", class: "muted" }, ""),
      h("div", { class: "pair" },
        h("div", {}, h("label", { for: "target-speedup" }, "Target speed-up (×, optional)"), speedup),
        h("div", {}, h("label", { for: "max-accuracy-drop" }, "Max accuracy drop (points, optional)"), accuracyDrop)),
      h("p", { id: "targets-hint", class: "muted" },
        "Empty: none. A speed-up target prunes heads and neurons until the model is that many times faster; "
        + "an accuracy drop keeps the fewest heads within that many points of the dense model."),
      h("details", {}, h("summary", {}, "More settings (JSON)"),
        h("label", { for: "extra-params" }, "Any other cahp prune setting, in snake_case"), extra,
        h("p", { id: "extra-hint", class: "muted" },
          "A key that has its own field above may appear here only with the same value."))),
    h("fieldset", {}, h("legend", {}, "The pruned model"),
      h("label", { for: "job-name" }, "Name (optional)"), name,
      h("label", { for: "job-labels" }, "Labels (optional)"), labels,
      h("p", { id: "job-labels-hint", class: "muted" }, "One key=value a line, e.g. the commit that asked for the model."),
      h("label", { for: "register-model" }, "Register in the MLflow registry as (optional)"), register,
      h("p", { id: "register-hint", class: "muted" }, "A registered model's name: the server adds a new version of it.")),
    error, status, button);

  const strategyHint = form.querySelector("#strategy-hint");
  jobSettings().then((properties) => {
    fillChoices(strategy, properties.strategy);
    fillChoices(recovery, properties.recovery);
    // The degree and epochs fields start at the engine's defaults too, unless already edited.
    for (const [input, key] of [[degree, "poly_degree"], [epochs, "epochs"]]) {
      const fallback = properties[key]?.["x-cahp-default"];
      if (input.value === input.defaultValue && fallback !== undefined && fallback !== null) {
        input.value = String(fallback);
        input.defaultValue = String(fallback);
      }
    }
    strategyHint.textContent = properties.strategy.description || "";
  }).catch((problem) => {
    fail(`The service's settings could not be read (${problem.message}): strategy and recovery take its defaults.`);
  });

  function fail(message, problem) {
    const items = (problem?.errors || []).map((e) => h("li", {}, `${(e.loc || []).join(".")}: ${e.msg}`));
    clear(error, h("p", {}, message), items.length ? h("ul", {}, items) : null);
  }

  async function reference(part, label) {
    const chosen = part.file.files[0];
    const typed = part.uri.value.trim();
    if (chosen && typed) throw new Error(`${label}: choose a file or type a reference, not both.`);
    if (typed) return typed;
    if (!chosen) throw new Error(`${label}: choose an archive to upload, or type a reference.`);
    const id = `${chosen.name}:${chosen.size}:${chosen.lastModified}`;
    if (uploaded.has(id)) return uploaded.get(id);
    part.bar.hidden = false;
    const answer = await upload(chosen, (fraction) => {
      part.bar.value = fraction;
      part.barText.textContent = ` ${formatPercent(fraction)} of ${chosen.name}`;
    });
    part.barText.textContent = ` uploaded as ${answer.uri}`;
    uploaded.set(id, answer.uri);
    return answer.uri;
  }

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    clear(error);
    let params;
    try {
      params = extra.value.trim() ? JSON.parse(extra.value) : {};
      if (typeof params !== "object" || params === null || Array.isArray(params)) throw new Error("not an object");
    } catch (problem) {
      fail(`More settings must be one JSON object (${problem.message}).`);
      extra.focus();
      return;
    }
    const jobLabels = {};
    for (const line of labels.value.split("\n").map((l) => l.trim()).filter(Boolean)) {
      const at = line.indexOf("=");
      if (at < 1) {
        fail(`Labels take key=value, one a line; "${line}" has no key.`);
        labels.focus();
        return;
      }
      jobLabels[line.slice(0, at).trim()] = line.slice(at + 1).trim();
    }
    const chosen = {};
    for (const [key, input, label] of [["target_speedup", speedup, "Target speed-up"],
                                       ["max_accuracy_drop", accuracyDrop, "Max accuracy drop"]]) {
      if (input.validity.badInput) {
        fail(`${label} must be a number, or empty for none.`);
        input.focus();
        return;
      }
      if (input.value.trim() !== "") chosen[key] = Number(input.value);
    }
    for (const [key, select] of [["strategy", strategy], ["recovery", recovery]]) {
      if (!select.disabled && select.value) chosen[key] = select.value;
    }
    const degreeValue = Number(degree.value);
    const epochsValue = Number(epochs.value);
    if (!Number.isInteger(degreeValue) || degreeValue < 1 || degreeValue > 10) {
      fail("The polynomial degree must be an integer from 1 to 10.");
      degree.focus();
      return;
    }
    if (!(epochsValue >= 0) || epochs.value.trim() === "") {
      fail("Epochs must be a number >= 0.");
      epochs.focus();
      return;
    }
    Object.assign(chosen, { poly_degree: degreeValue, epochs: epochsValue });
    const conflicts = Object.keys(chosen).filter((key) => key in params && params[key] !== chosen[key]);
    if (conflicts.length) {
      const [key] = conflicts;
      fail(`${key} is ${JSON.stringify(chosen[key])} in its field and ${JSON.stringify(params[key])} in More settings: `
        + "set it in one place (change the field, or remove the key from More settings).");
      extra.focus();
      return;
    }
    button.disabled = true;
    try {
      status.textContent = "Uploading…";
      const modelUri = await reference(model, "Model");
      const datasetUri = await reference(dataset, "Dataset");
      status.textContent = "Submitting…";
      const datasetSpec = { uri: datasetUri };
      for (const [field, input] of [["text_column", text], ["label_column", label], ["eval_split", evalSplit]]) {
        if (input.value.trim()) datasetSpec[field] = input.value.trim();
      }
      const body = { model: { uri: modelUri }, dataset: datasetSpec,
                     params: { ...params, ...chosen } };
      if (name.value.trim()) body.name = name.value.trim();
      if (Object.keys(jobLabels).length) body.labels = jobLabels;
      if (register.value.trim()) body.register = { model_name: register.value.trim() };
      const job = await api("v1/jobs", { method: "POST", extraHeaders: { "Idempotency-Key": key }, body });
      key = idempotencyKey();
      navigate(`jobs/${encodeURIComponent(job.id)}`);
    } catch (problem) {
      status.textContent = "";
      if (problem instanceof ApiError) fail(`${problem.message} (${problem.code})`, problem.problem);
      else fail(problem.message || String(problem));
      // A refused submission may be fixed and sent again: that is a new request, with a new key.
      if (problem instanceof ApiError && problem.status === 422) key = idempotencyKey();
    } finally {
      button.disabled = false;
    }
  });

  return { element: form };
}
