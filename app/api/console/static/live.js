// How the console hears about changes. Everything that stays live goes through this module.
//
// One job is followed through its event stream, `GET /v1/jobs/{id}/events` (server-sent events), read
// with fetch and a stream reader: EventSource cannot send the Authorization header, and the key must
// never go into a URL. The stream resumes after a drop with `Last-Event-ID` (the count of log lines
// received), so no line is shown twice. Should the stream not work (a proxy that buffers or blocks
// it, an older server), the page falls back to polling: one request at a time, every couple of
// seconds, paused while the tab is hidden, backing off while the service does not answer. The job
// list is polled. Either way the callers get the same calls: `onJob(job)` for each new state,
// `onLogs(lines)` for new log lines. A target run's allocation comes in the job's `target` as soon as
// the run has decided it; the stream also sends it alone (its `target` event, before the job's next
// state), which goes to `onTarget(target)`.

import { api, openStream } from "./api.js";

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

/** The events of a `text/event-stream` response body, as {id, event, data}, until it ends. */
async function* serverEvents(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value.replace(/\r\n?/g, "\n");
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        const event = { id: null, event: "message", data: [] };
        for (const line of block.split("\n")) {
          if (!line || line.startsWith(":")) continue;
          const colon = line.indexOf(":");
          const name = colon < 0 ? line : line.slice(0, colon);
          const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
          if (name === "id") event.id = value;
          else if (name === "event") event.event = value;
          else if (name === "data") event.data.push(value);
        }
        if (event.data.length) yield { ...event, data: event.data.join("\n") };
      }
    }
  } finally {
    reader.releaseLock();
  }
}

/** Follow one job by polling its state and log (the fallback when its event stream does not work). */
function pollJob(jobId, { onJob, onLogs, onError, intervalMs }) {
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
 * Follow one job: its state and its log, until it has finished and the log is read to the end.
 *
 * @param {string} jobId
 * @param {{onJob: function(object), onLogs: function(object[]), onTarget?: function(object), onError?: function(Error),
 *          intervalMs?: number}} handlers
 * @returns {{stop: function(), now: function()}}
 */
export function watchJob(jobId, { onJob, onLogs, onTarget, onError, intervalMs = 1500 }) {
  const id = encodeURIComponent(jobId);
  const controller = new AbortController();
  let stopped = false;
  let polling = null;
  let received = "0"; // log lines received so far: the stream's Last-Event-ID
  let fruitless = 0; // connections in a row that brought no event

  function stop() {
    stopped = true;
    controller.abort();
    polling?.stop();
  }

  function fallBack() {
    if (!stopped) polling = pollJob(jobId, { onJob, onLogs, onError, intervalMs });
  }

  async function follow() {
    while (!stopped) {
      let events = 0;
      try {
        const response = await openStream(`v1/jobs/${id}/events`, { signal: controller.signal, lastEventId: received });
        for await (const event of serverEvents(response)) {
          events += 1;
          fruitless = 0;
          if (event.id !== null) received = event.id;
          const data = JSON.parse(event.data);
          if (event.event === "log") {
            onLogs([data]);
          } else if (event.event === "target") {
            onTarget?.(data);
          } else if (["status", "stage", "progress"].includes(event.event)) {
            onJob(data);
            if (isFinished(data)) return stop();
          }
        }
        // The stream ended before the job did: the server is going away; reconnect shortly.
      } catch (error) {
        if (stopped || error.name === "AbortError") return;
        if (error.status === 404 || error.status === 401) return onError?.(error);
        onError?.(error);
      }
      if (events === 0 && ++fruitless >= 2) return fallBack();
      await new Promise((resolve) => setTimeout(resolve, Math.min(30000, intervalMs * 2 ** fruitless)));
    }
  }

  follow();
  return {
    stop,
    /** Read the job's state now (after a user action), whatever the stream is doing. */
    async now() {
      if (stopped) return;
      if (polling) return polling.now();
      try {
        onJob(await api(`v1/jobs/${id}`, { signal: controller.signal }));
      } catch (error) {
        if (error.name !== "AbortError") onError?.(error);
      }
    },
  };
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
