// The jobs of the signed-in key, newest first, filtered by status, kept up to date by live.js.

import { api } from "./api.js";
import {
  clear, formatDuration, formatPercent, formatTime, h, labelChips, modelTitle, secondsBetween, statusBadge, timeElement,
} from "./dom.js";
import { isFinished, watchJobs } from "./live.js";

const STATUSES = ["queued", "running", "succeeded", "failed", "cancelled"];
const PAGE = 25;

/** Newest first: created_at descending, then id descending (the API's order). */
function newerFirst(a, b) {
  const byTime = Date.parse(b.created_at) - Date.parse(a.created_at);
  if (byTime) return byTime;
  if (a.id === b.id) return 0;
  return a.id < b.id ? 1 : -1;
}

function shortRef(uri) {
  if (!uri) return "–";
  const trimmed = uri.replace(/\/+$/, "");
  const [scheme] = trimmed.split("://");
  const tail = trimmed.split("/").pop();
  return scheme === trimmed ? tail : `${scheme}://…/${tail}`;
}

function duration(job) {
  if (job.started_at) return formatDuration(secondsBetween(job.started_at, job.finished_at));
  if (!isFinished(job)) return `waiting ${formatDuration(secondsBetween(job.created_at))}`;
  return "–";
}

export function jobsView(params, { navigate }) {
  const filter = STATUSES.includes(params.get("status")) ? params.get("status") : "";
  const jobs = new Map();
  const rows = new Map();
  let olderCursor = null;
  let loadedMore = false;
  let firstAnswer = false;

  const select = h("select", { id: "status-filter" },
    h("option", { value: "" }, "All statuses"),
    STATUSES.map((status) => h("option", { value: status, selected: status === filter }, status)));
  select.addEventListener("change", () => navigate(select.value ? `./?status=${select.value}` : "./", { replace: true }));
  const live = h("p", { class: "live muted", "aria-live": "polite" }, "Loading…");
  const body = h("tbody");
  const table = h("table", { class: "jobs" },
    h("caption", { class: "visually-hidden" }, "Jobs, newest first"),
    h("thead", {}, h("tr", {}, ["Job", "Status", "Model", "Progress", "Labels", "Created", "Duration"]
      .map((name) => h("th", { scope: "col" }, name)))),
    body);
  const empty = h("p", { class: "empty", hidden: true },
    filter ? `No ${filter} jobs.` : "No jobs yet. ", filter ? "" : h("a", { href: "submit", "data-nav": "" }, "Submit one."));
  const more = h("button", { type: "button", class: "secondary", hidden: true }, "Load older jobs");
  const element = h("section", { class: "jobs-view" },
    h("div", { class: "title-row" }, h("h1", {}, "Jobs"),
      h("a", { class: "button", href: "submit", "data-nav": "" }, "New job")),
    h("div", { class: "toolbar" }, h("label", { for: "status-filter" }, "Status"), select, live),
    h("div", { class: "table-wrap" }, table), empty, more);

  function cells(job) {
    const progress = h("span", { class: "progress-cell" },
      h("progress", { max: 1, value: job.progress, "aria-label": `progress of job ${job.id}` }),
      h("span", {}, formatPercent(job.progress)));
    const warnings = job.result?.warnings || [];
    // A failed row says why (its error code); a succeeded one whether its model is suspect.
    const status = [statusBadge(job.status, job.cancel_requested),
      job.error ? h("code", { class: "error-code", dataset: { field: "error_code" }, title: job.error.message },
        job.error.code) : null,
      warnings.length ? h("span", { class: "warn-badge", title: warnings.join("\n"), dataset: { field: "warnings" } },
        `⚠ ${warnings.length} warning${warnings.length > 1 ? "s" : ""}`) : null];
    const title = modelTitle(job);
    const named = job.name && (job.model_name || job.result?.base_model);
    const model = h("span", { class: "model-cell", title: job.model?.uri || "" },
      h("span", { class: "model-title" }, title === job.model?.uri ? shortRef(title) : title),
      named ? h("span", { class: "muted model-base" }, job.model_name || job.result?.base_model) : null);
    return [
      status,
      model,
      [progress, job.stage ? h("span", { class: "muted stage" }, job.stage) : null],
      labelChips(job.labels),
      timeElement(job.created_at),
      duration(job),
    ];
  }

  function row(job) {
    let tr = rows.get(job.id);
    const headers = ["Status", "Model", "Progress", "Labels", "Created", "Duration"];
    if (!tr) {
      // The link cell is made once, so that a focused link keeps its focus across updates.
      const link = h("a", { href: `jobs/${encodeURIComponent(job.id)}`, "data-nav": "", class: "mono", title: job.id },
        job.id.slice(0, 12));
      tr = h("tr", { dataset: { jobId: job.id } }, h("th", { scope: "row", "data-label": "Job" }, link),
        headers.map((label) => h("td", { "data-label": label })));
      rows.set(job.id, tr);
    }
    tr.dataset.status = job.status;
    cells(job).forEach((content, i) => clear(tr.cells[i + 1], content));
    return tr;
  }

  function redraw() {
    const ordered = [...jobs.values()].sort(newerFirst);
    for (const [id, tr] of rows) if (!jobs.has(id)) { tr.remove(); rows.delete(id); }
    ordered.forEach((job, i) => {
      const tr = row(job);
      if (body.children[i] !== tr) body.insertBefore(tr, body.children[i] || null);
    });
    // The Labels column shows once a job has labels (older servers have no such field).
    table.classList.toggle("no-labels", !ordered.some((job) => job.labels && Object.keys(job.labels).length));
    empty.hidden = !firstAnswer || ordered.length > 0;
    table.hidden = ordered.length === 0;
    more.hidden = !olderCursor;
  }

  function keep(job) {
    if (filter && job.status !== filter) jobs.delete(job.id);
    else jobs.set(job.id, job);
  }

  const watch = watchJobs({
    status: filter,
    limit: PAGE,
    active: () => [...jobs.values()].filter((job) => !isFinished(job)).map((job) => job.id),
    onPage(page) {
      firstAnswer = true;
      const oldest = page.data[page.data.length - 1];
      const fresh = new Set(page.data.map((job) => job.id));
      // Jobs in the range this page covers that it no longer holds have left the filter.
      for (const job of [...jobs.values()]) {
        if (!fresh.has(job.id) && (!page.next_cursor || !oldest || newerFirst(job, oldest) < 0)) jobs.delete(job.id);
      }
      page.data.forEach(keep);
      if (!loadedMore) olderCursor = page.next_cursor;
      live.textContent = `Live: updated ${formatTime(new Date().toISOString())}`;
      redraw();
    },
    onJob(job) {
      keep(job);
      redraw();
    },
    onError(error) {
      live.textContent = `The service did not answer (${error.message}); retrying…`;
    },
  });

  more.addEventListener("click", async () => {
    more.disabled = true;
    try {
      const query = new URLSearchParams({ limit: String(PAGE), cursor: olderCursor });
      if (filter) query.set("status", filter);
      const page = await api(`v1/jobs?${query}`);
      page.data.forEach(keep);
      olderCursor = page.next_cursor;
      loadedMore = true;
      redraw();
    } catch (error) {
      live.textContent = `Could not load older jobs: ${error.message}`;
    } finally {
      more.disabled = false;
    }
  });

  return { element, destroy: () => watch.stop() };
}
