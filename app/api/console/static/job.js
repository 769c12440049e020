// One job: live state and log, then (once it has succeeded) its summary, plots and artifacts; or the
// error of a failed job. The state comes from live.js; the result from the job's JSON artifacts.

import { api, ApiError, download } from "./api.js";
import { headMap, layerRetention } from "./heads.js";
import { mssChart } from "./mss.js";
import { latencyTable } from "./runtimes.js";
import { layerUnits, targetSection } from "./target.js";
import {
  clear, formatBytes, formatCount, formatDuration, formatNumber, formatPercent, formatSpeedup, formatTime, h,
  labelChips, secondsBetween, statusBadge, timeElement,
} from "./dom.js";
import { isFinished, watchJob } from "./live.js";

function field(name, label, ...value) {
  return [h("dt", {}, label), h("dd", { dataset: { field: name } }, ...value)];
}

function change(dense, pruned, format) {
  if (dense === null || dense === undefined || pruned === null || pruned === undefined) return format(pruned ?? dense);
  return `${format(dense)} → ${format(pruned)}`;
}

function points(dense, pruned) {
  if (dense === null || dense === undefined || pruned === null || pruned === undefined) return "";
  const delta = 100 * (pruned - dense);
  return ` (${delta >= 0 ? "+" : "−"}${Math.abs(delta).toFixed(1)} pts)`;
}

function reduction(dense, pruned) {
  if (!dense || pruned === null || pruned === undefined) return "";
  return ` (−${formatPercent(1 - pruned / dense, 1)})`;
}

/** The headline figures, from report.json when there is one, else from the job's result. */
function summary(job, report, curve) {
  const result = job.result || {};
  const sel = report?.selection || {};
  const metrics = report?.metrics || {};
  const params = report?.parameters || {};
  const kept = result.heads_kept ?? sel.heads_kept;
  const total = result.heads_total ?? sel.heads_total;
  const kStar = result.k_star ?? sel.k_star;
  const fixed = curve ? curve.fixed_heads_to_keep !== null && curve.fixed_heads_to_keep !== undefined
    : job.params?.heads_to_keep !== null && job.params?.heads_to_keep !== undefined;
  const degree = sel.poly_degree ?? curve?.polynomial_degree ?? job.params?.poly_degree;
  const knee = fixed ? "fixed by heads_to_keep"
    : `knee at degree ${degree}${(sel.knee_found ?? curve?.knee_found) === false ? " (none found: fallback rule)" : ""}`;
  const dense = metrics.dense || {};
  const pruned = metrics.pruned || {};
  const denseAcc = dense.accuracy ?? result.dense_accuracy;
  const prunedAcc = pruned.accuracy ?? result.pruned_accuracy;
  const pct = (x) => formatPercent(x, 1);
  // One measurement per job: the report's speed and the summary are the same timing rounds.
  const speed = (report?.speed?.results || []).map((entry) =>
    h("div", {}, `${formatSpeedup(entry.speedup, entry.speedup_low, entry.speedup_high)} at batch ${entry.batch_size}`,
      h("span", { class: "muted" }, ` (p50 ${formatNumber(entry.dense?.p50_ms, 2)} → ${formatNumber(entry.pruned?.p50_ms, 2)} ms)`)));
  const speedNote = report?.speed ? `${report.speed.device}, sequence length ${report.speed.seq_len}, PyTorch` : "";
  return h("dl", { class: "summary" },
    field("heads", "Heads kept", `${kept ?? "–"} of ${total ?? "–"}`,
      h("span", { class: "muted" }, ` (${formatPercent(kept / total)})`)),
    field("k_star", "k*", h("strong", {}, kStar ?? "–"), h("span", { class: "muted" }, ` · ${knee}`)),
    field("accuracy", "Accuracy", change(denseAcc, prunedAcc, pct), h("span", { class: "muted" }, points(denseAcc, prunedAcc))),
    field("macro_f1", "Macro-F1", change(dense.macro_f1, pruned.macro_f1, (x) => formatNumber(x, 3))),
    field("parameters", "Parameters",
      h("div", {}, `${change(params.dense?.total, params.pruned?.total, formatCount)}${reduction(params.dense?.total, params.pruned?.total)}`),
      params.dense ? h("div", { class: "muted" }, `attention ${change(params.dense?.attention, params.pruned?.attention, formatCount)}`) : null),
    field("speedup", "Speed-up", speed.length ? speed : formatSpeedup(result.speedup, result.speedup_low,
      result.speedup_high), speedNote ? h("div", { class: "muted" }, speedNote) : null),
    deployable(result, report),
    report?.dataset ? field("dataset_rows", "Evaluated on", `${report.dataset.eval_rows} rows of ${report.dataset.eval_split}`) : null,
    report?.wall_time_s ? field("wall_time", "Run time", formatDuration(report.wall_time_s)) : null);
}

/** The ONNX and int8 directories as a deployer takes them: accuracy, macro-F1, parity, speed. */
function deployable(result, report) {
  const pct = (x) => formatPercent(x, 1);
  const onnx = report?.export?.onnx;
  const int8 = report?.export?.onnx_int8;
  const rows = [];
  if (result.onnx_max_abs_diff !== null && result.onnx_max_abs_diff !== undefined) {
    rows.push(field("onnx", "ONNX (onnx/)",
      h("div", {}, `accuracy ${pct(result.onnx_accuracy)}, macro-F1 ${formatNumber(result.onnx_macro_f1, 3)}`),
      h("div", {}, `max |logit difference| from PyTorch ${Number(result.onnx_max_abs_diff).toExponential(1)}`,
        onnx?.parity ? h("span", { class: "muted" }, ` (same class on ${pct(onnx.parity.prediction_agreement)})`) : null),
      h("div", {}, `${formatSpeedup(result.onnx_speedup, result.onnx_speedup_low, result.onnx_speedup_high)} `,
        h("span", { class: "muted" }, "against dense PyTorch, CPU, batch 32"))));
  }
  if (result.int8_accuracy !== null && result.int8_accuracy !== undefined) {
    rows.push(field("int8", "int8 (onnx-int8/)",
      h("div", {}, `accuracy ${pct(result.int8_accuracy)}, macro-F1 ${formatNumber(result.int8_macro_f1, 3)}`),
      h("div", {}, `max |logit difference| from PyTorch ${formatNumber(result.int8_max_abs_diff, 4)}`,
        int8?.deviation ? h("span", { class: "muted" }, ` (same class on ${pct(int8.deviation.prediction_agreement)})`) : null),
      h("div", {}, `${formatSpeedup(result.int8_speedup, result.int8_speedup_low, result.int8_speedup_high)} `,
        h("span", { class: "muted" }, "against dense PyTorch, CPU, batch 32"))));
  }
  return rows;
}

/** Quality warnings first, where nobody deploying the model can miss them. */
function qualityWarnings(result) {
  const warnings = result?.warnings || [];
  if (!warnings.length) return null;
  return h("div", { class: "quality", role: "alert", dataset: { field: "warnings" } },
    h("h2", {}, "Warnings: read before deploying"),
    h("ul", {}, warnings.map((warning) => h("li", {}, warning))));
}

async function copyLink(artifact, say) {
  const until = formatTime(artifact.signed_url_expires_at);
  try {
    await navigator.clipboard.writeText(artifact.signed_url);
    say(`Copied a link to ${artifact.name} that downloads it without a key until ${until}.`);
  } catch {
    // Without clipboard access (plain http), show the link to copy by hand.
    say(`A link to ${artifact.name}, without a key, until ${until}: ${artifact.signed_url}`);
  }
}

function artifactTable(jobId, manifest, onError) {
  const rows = manifest.map((artifact) => {
    const button = h("button", { type: "button", class: "secondary", "aria-label": `Download ${artifact.name}` }, "Download");
    button.addEventListener("click", async () => {
      button.disabled = true;
      try {
        await download(`v1/jobs/${encodeURIComponent(jobId)}/artifacts/${encodeURIComponent(artifact.name)}`, artifact.name);
      } catch (error) {
        onError(`Could not download ${artifact.name}: ${error.message}`);
      } finally {
        button.disabled = false;
      }
    });
    const link = artifact.signed_url ? h("button", { type: "button", class: "secondary",
      "aria-label": `Copy a link to ${artifact.name} that needs no key` }, "Copy link") : null;
    link?.addEventListener("click", () => copyLink(artifact, onError));
    return h("tr", { dataset: { artifact: artifact.name } },
      h("th", { scope: "row", "data-label": "Name" }, h("code", {}, artifact.name)),
      h("td", { "data-label": "Size", title: `${artifact.size} bytes` }, formatBytes(artifact.size)),
      h("td", { "data-label": "sha256" }, h("code", { class: "hash" }, artifact.sha256)),
      h("td", { "data-label": "", class: "actions" }, button, link));
  });
  return h("table", { class: "artifacts" },
    h("thead", {}, h("tr", {}, ["Name", "Size", "sha256", ""].map((name) => h("th", { scope: "col" }, name)))),
    h("tbody", {}, rows));
}

function registration(job) {
  const done = job.registration;
  if (!done && !job.register) return null;
  if (!done) return field("registry", "Registry", `to be registered as ${job.register.model_name}`);
  if (done.status === "registered") {
    return field("registry", "Registry", h("code", {}, done.model_uri),
      h("span", { class: "muted" }, ` (MLflow run ${done.run_id})`));
  }
  return field("registry", "Registry", h("span", { class: "error" }, `registration as ${done.model_name} failed: `),
    done.error || "");
}

// Why an attempt ended, in words (AttemptPublic.end).
const ATTEMPT_ENDS = {
  completed: "completed", failed: "failed", cancelled: "cancelled",
  handed_back: "handed back: its worker shut down", lost: "its worker was lost",
};

function attemptList(attempts) {
  return h("ol", { class: "attempts" }, ...attempts.map((a) => h("li", { dataset: { attempt: a.number } },
    `${formatTime(a.started_at)} – ${a.ended_at ? formatTime(a.ended_at) : "running"} · `,
    h("code", { class: "muted" }, a.worker),
    a.end ? ` · ${ATTEMPT_ENDS[a.end] || a.end}` : "",
    a.resumed_from ? ` · resumed from ${a.resumed_from}` : "")));
}

export function jobView(jobId) {
  let job = null;
  let resultShown = false;
  let liveTarget = ""; // the target record shown from the job's state, as JSON: redrawn only when it changes
  let pendingTarget = null; // a target event that came before the job's first state
  const destroyers = [];

  const title = h("h1", {}, "Job ", h("code", { class: "job-id" }, jobId));
  const named = h("p", { class: "job-name", dataset: { field: "name" }, hidden: true });
  const badge = h("span", { class: "badge-slot" });
  const cancel = h("button", { type: "button", class: "danger", hidden: true }, "Cancel job");
  const notice = h("p", { class: "notice", role: "status", hidden: true });
  const problem = h("div", { class: "problem", role: "alert", hidden: true });
  const progress = h("progress", { max: 1, value: 0, "aria-labelledby": "job-progress-label" });
  const progressText = h("span", { id: "job-progress-label" });
  const meta = h("dl", { class: "meta" });
  const result = h("div", { class: "result" });
  // A target run's allocation, from the job's state as soon as the run has decided it (before recovery);
  // the result's section, from the report, takes its place once the job has ended.
  const decided = h("section", { class: "decided-target", hidden: true });
  const logList = h("ol", { class: "log-lines" });
  const log = h("div", { class: "log", tabindex: 0, role: "log", "aria-label": "Job log" }, logList);
  const logEmpty = h("p", { class: "muted" }, "No log lines yet.");
  const element = h("section", { class: "job-view" },
    h("p", {}, h("a", { href: "./", "data-nav": "" }, "← All jobs")),
    h("div", { class: "title-row" }, title, badge, cancel),
    named, notice, problem,
    h("div", { class: "progress-row" }, progress, progressText),
    meta, decided, result,
    h("section", { class: "log-section" }, h("h2", {}, "Log"), logEmpty, log));

  function say(text) {
    notice.textContent = text;
    notice.hidden = !text;
  }

  function showJob(next) {
    job = next;
    clear(badge, statusBadge(job.status, job.cancel_requested));
    progress.value = job.progress;
    const stage = job.stage ? ` · ${job.stage}` : "";
    // eta_s: what the running attempt still needs at its measured pace (null until it is known).
    const eta = job.eta_s !== null && job.eta_s !== undefined && !isFinished(job) ? ` · about ${formatDuration(job.eta_s)} left` : "";
    progressText.textContent = `${formatPercent(job.progress)}${stage}${eta}${job.cancel_requested && !isFinished(job) ? " · cancel requested, stopping at the next step" : ""}`;
    const runFor = job.started_at ? formatDuration(secondsBetween(job.started_at, job.finished_at)) : "–";
    clear(meta,
      field("status", "Status", job.status),
      field("stage", "Stage", job.stage || "–"),
      field("created", "Created", timeElement(job.created_at), h("span", { class: "muted" }, ` (${formatTime(job.created_at)})`)),
      field("started", "Started", job.started_at ? formatTime(job.started_at) : "–"),
      field("finished", "Finished", job.finished_at ? formatTime(job.finished_at) : "–"),
      field("duration", "Duration", runFor),
      job.attempts?.length ? field("attempts", "Attempts", attemptList(job.attempts)) : null,
      field("model", "Model", job.model_name ? h("strong", {}, job.model_name) : null, job.model_name ? " " : null,
        h("code", { class: job.model_name ? "muted" : "" }, job.model?.uri), job.model?.revision ? ` @ ${job.model.revision}` : ""),
      field("dataset", "Dataset", job.dataset_name ? h("strong", {}, job.dataset_name) : null,
        job.dataset_name ? " " : null, h("code", { class: job.dataset_name ? "muted" : "" }, job.dataset?.uri)),
      registration(job),
      job.labels && Object.keys(job.labels).length ? field("labels", "Labels", labelChips(job.labels)) : null,
      field("params", "Settings", h("details", {}, h("summary", {}, `degree ${job.params?.poly_degree ?? "–"}, epochs ${job.params?.epochs ?? "–"}, strategy ${job.params?.strategy ?? "–"}, recovery ${job.params?.recovery ?? "–"}`),
        h("pre", { class: "params" }, JSON.stringify(job.params, null, 2)))));
    cancel.hidden = isFinished(job) || job.cancel_requested;
    named.textContent = job.name || "";
    named.hidden = !job.name;
    if (job.error) {
      const heading = job.status === "cancelled" ? "Cancelled" : "Failed";
      clear(problem, h("h2", {}, `${heading}: `, h("code", { dataset: { field: "error_code" } }, job.error.code)),
        h("p", { dataset: { field: "error_message" } }, job.error.message));
      problem.hidden = false;
    } else {
      problem.hidden = true;
    }
    // A job whose registration failed has a model too: its result and artifacts are shown.
    if ((job.status === "succeeded" || (job.status === "failed" && job.result)) && !resultShown) {
      resultShown = true;
      showResult();
    }
    showDecided(job.target);
  }

  /** The target as decided (the job's `target`, or the event stream's `target` event), until the result replaces it. */
  function showDecided(target) {
    pendingTarget = target ?? pendingTarget;
    target = pendingTarget;
    if (!job || resultShown || !target) return; // showResult removes it once the report's figures are drawn
    const note = isFinished(job) ? "Decided before the job ended; it left no report to measure it against."
      : "Decided while the run goes on (recovery follows); the final report's figures replace these when the job ends.";
    const shown = JSON.stringify([target, note]);
    if (shown === liveTarget) return;
    liveTarget = shown;
    drawDecided(target, note);
  }

  function drawDecided(target, note) {
    clear(decided, h("h2", {}, "Heads and neurons per layer"), targetSection(target, { source: "job", note }));
    decided.hidden = false;
  }

  function appendLogs(lines) {
    const atBottom = log.scrollHeight - log.scrollTop - log.clientHeight < 16;
    for (const line of lines) {
      logList.append(h("li", {}, h("time", { datetime: line.time, title: formatTime(line.time) },
        new Date(line.time).toLocaleTimeString("en-GB", { hour12: false })), " ", h("span", {}, line.message)));
    }
    logEmpty.hidden = logList.children.length > 0;
    if (atBottom) log.scrollTop = log.scrollHeight;
  }

  async function showResult() {
    clear(result, h("p", { class: "muted" }, "Loading the result…"));
    const base = `v1/jobs/${encodeURIComponent(jobId)}/artifacts`;
    let manifest = [];
    try {
      manifest = (await api(base)).data;
    } catch (error) {
      clear(result, h("p", { class: "error" }, `Could not list the artifacts: ${error.message}`));
      if (pendingTarget && !decided.hidden) {
        // The job has ended: the figures decided during the run stay, without the promise of a report.
        drawDecided(pendingTarget, "Decided during the run; the final report could not be read to replace these figures.");
      }
      return;
    }
    const names = new Set(manifest.map((artifact) => artifact.name));
    const read = (name) => (names.has(name) ? api(`${base}/${name}`) : Promise.resolve(null));
    const [report, curve, map] = (await Promise.allSettled([read("report.json"), read("mss_curve.json"), read("head_map.json")]))
      .map((settled) => (settled.status === "fulfilled" ? settled.value : null));
    const target = report?.target ?? job.target ?? null;
    const parts = [qualityWarnings(job.result), h("h2", {}, "Result"), summary(job, report, curve)];
    if (curve) {
      const chart = mssChart(curve);
      destroyers.push(chart.destroy);
      parts.push(h("h2", {}, "MSS curve"), chart.element);
    }
    if (map) {
      const grid = headMap(map);
      const retention = layerRetention(map);
      destroyers.push(grid.destroy, retention.destroy);
      // A target run cut feed-forward neurons too: their map goes beside the head map, under the retention.
      const units = target ? layerUnits(target) : null;
      if (units) destroyers.push(units.destroy);
      parts.push(h("h2", {}, "Heads"), h("div", { class: "side-by-side" }, grid.element,
        h("div", {}, retention.element, units?.element)));
    }
    if (target) parts.push(h("h2", {}, "Heads and neurons per layer"), targetSection(target, { source: "report" }));
    if (report?.export?.speed?.results?.length) parts.push(h("h2", {}, "Latency by runtime"), latencyTable(report.export.speed));
    parts.push(h("h2", {}, "Artifacts"), manifest.length ? artifactTable(jobId, manifest, say) : h("p", { class: "muted" }, "None stored."));
    clear(result, ...parts);
    clear(decided);
    decided.hidden = true;
  }

  cancel.addEventListener("click", async () => {
    cancel.disabled = true;
    try {
      showJob(await api(`v1/jobs/${encodeURIComponent(jobId)}/cancel`, { method: "POST" }));
      watch.now();
      say("");
    } catch (error) {
      say(`Could not cancel: ${error.message}`);
    } finally {
      cancel.disabled = false;
    }
  });

  const watch = watchJob(jobId, {
    onJob(next) {
      say("");
      showJob(next);
    },
    onLogs: appendLogs,
    onTarget: showDecided,
    onError(error) {
      if (error instanceof ApiError && error.status === 404) {
        watch.stop();
        clear(element, h("h1", {}, "No such job"),
          h("p", {}, `No job ${jobId} belongs to this key. `, h("a", { href: "./", "data-nav": "" }, "Back to the jobs.")));
        return;
      }
      say(`The service did not answer (${error.message}); retrying…`);
    },
  });

  return {
    element,
    destroy() {
      watch.stop();
      for (const destroy of destroyers) destroy();
    },
  };
}
