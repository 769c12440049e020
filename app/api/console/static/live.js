// How the console hears about changes. Everything that stays live goes through this module.
//
// Today the API has no event stream, so both functions poll: one request at a time, every couple of
// seconds, paused while the tab is hidden, backing off while the service does not answer. When the API
// gains `GET /v1/jobs/{id}/events` (server-sent events), `watchJob` reads that stream instead (with
// fetch and a stream reader, since EventSource cannot send the Authorization header) and calls the same
// callbacks: `onJob(job)` for each new state, `onLogs(lines)` for new log lines. Callers do not change.

import { api } from "./api.js";

const FINISHED = new Set(["succeeded", "failed", "cancelled"]);
const LOG_PAGE = 1000; // the API's largest log page

export function isFinished(job) {
  return FINISHED.has(job.status);
}

/**
 * Call `step(signal)` now and then again `intervalMs` after each end, until it returns true or `stop()`.
 * Errors go to `onError` and slow the next try down (doubling, at most 30 s).
 */
function repeat(step, { intervalMs, onError }) {
  let stopped = false;
  let timer = null;
  let running = false;
  let failures = 0;
  let controller = null;

  async function tick() {
    timer = null;
    if (stopped || running) return;
    if (document.hidden) return; // visibilitychange resumes it
    running = true;
    controller = new AbortController();
    let done = false;
    try {
      done = (await step(controller.signal)) === true;
      failures = 0;
    } catch (error) {
      if (error.name === "AbortError" || stopped) return;
      failures += 1;
      onError?.(error);
    } finally {
      running = false;
    }
    if (done) stop();
    else schedule();
  }

  function schedule() {
    if (stopped || timer !== null) return;
    const delay = failures ? Math.min(30000, intervalMs * 2 ** failures) : intervalMs;
    timer = setTimeout(tick, delay);
  }

  function onVisibility() {
    if (!document.hidden && timer === null && !running) tick();
  }

  function stop() {
    stopped = true;
    if (timer !== null) clearTimeout(timer);
    timer = null;
    controller?.abort();
    document.removeEventListener("visibilitychange", onVisibility);
  }

  document.addEventListener("visibilitychange", onVisibility);
  tick();
  return {
    stop,
    /** Run a step now rather than at the next tick (after a user action). */
    now() {
      if (stopped) return;
      if (timer !== null) clearTimeout(timer);
      timer = null;
      tick();
    },
  };
}

/**
 * Follow one job: its state and its log, until it has finished and the log is read to the end.
 *
 * @param {string} jobId
 * @param {{onJob: function(object), onLogs: function(object[]), onError?: function(Error), intervalMs?: number}} handlers
 * @returns {{stop: function(), now: function()}}
 */
export function watchJob(jobId, { onJob, onLogs, onError, intervalMs = 1500 }) {
  const id = encodeURIComponent(jobId);
  let offset = 0;
  return repeat(async (signal) => {
    const job = await api(`v1/jobs/${id}`, { signal });
    onJob(job);
    // Read the log to its current end; lines written before the job finished are all there once it has.
    for (;;) {
      const page = await api(`v1/jobs/${id}/logs?offset=${offset}&limit=${LOG_PAGE}`, { signal });
      if (page.data.length) onLogs(page.data);
      offset = page.next_offset;
      if (page.data.length < LOG_PAGE) break;
    }
    return isFinished(job);
  }, { intervalMs, onError });
}

/**
 * Follow the first page of this key's jobs (newest first, optionally one status), and any other job
 * the page shows that is still active (`active()` gives their ids).
 *
 * @returns {{stop: function(), now: function()}}
 */
export function watchJobs({ status, limit = 25, active = () => [], onPage, onJob, onError, intervalMs = 3000 }) {
  const query = new URLSearchParams({ limit: String(limit) });
  if (status) query.set("status", status);
  return repeat(async (signal) => {
    const page = await api(`v1/jobs?${query}`, { signal });
    onPage(page);
    const seen = new Set(page.data.map((job) => job.id));
    for (const id of active()) {
      if (!seen.has(id)) onJob(await api(`v1/jobs/${encodeURIComponent(id)}`, { signal }));
    }
    return false;
  }, { intervalMs, onError });
}
