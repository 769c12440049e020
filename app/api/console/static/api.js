// The console's only door to the service: the /v1 API, with the signed-in key as a Bearer header.
//
// The key lives in sessionStorage (this tab, until it closes) and is sent only in the Authorization
// header: never in a URL, a cookie or a log line. Downloads go through fetch + blob for the same reason.

const KEY_ITEM = "cahp.apiKey";

/** The application's root URL ("/" or a proxy prefix), from where this module is served: <root>/ui/static/. */
export const ROOT = new URL("../../", import.meta.url);

export function storedKey() {
  return sessionStorage.getItem(KEY_ITEM);
}

export function storeKey(key) {
  sessionStorage.setItem(KEY_ITEM, key);
}

export function forgetKey() {
  sessionStorage.removeItem(KEY_ITEM);
}

/** An error answer of the API (application/problem+json), or a network failure (status 0). */
export class ApiError extends Error {
  constructor(status, problem) {
    super(problem.detail || problem.title || `HTTP ${status}`);
    this.name = "ApiError";
    this.status = status;
    this.code = problem.code || (status === 0 ? "network_error" : `http_${status}`);
    this.problem = problem;
  }
}

function url(path) {
  return new URL(path.replace(/^\//, ""), ROOT);
}

function headers(extra = {}, key = storedKey()) {
  const result = new Headers(extra);
  if (key) result.set("Authorization", `Bearer ${key}`);
  return result;
}

async function problemOf(response) {
  let problem = {};
  try {
    problem = await response.json();
  } catch {
    problem = { title: response.statusText };
  }
  const error = new ApiError(response.status, problem);
  if (response.status === 401) window.dispatchEvent(new CustomEvent("cahp:unauthenticated", { detail: error }));
  return error;
}

async function send(path, { method = "GET", body, signal, key, extraHeaders } = {}) {
  const init = { method, signal, headers: headers({ Accept: "application/json", ...extraHeaders }, key),
                 credentials: "omit", cache: "no-store" };
  if (body !== undefined) {
    init.headers.set("Content-Type", "application/json");
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(url(path), init);
  } catch (error) {
    if (error.name === "AbortError") throw error;
    throw new ApiError(0, { title: "The service did not answer", detail: String(error.message || error) });
  }
  if (!response.ok) throw await problemOf(response);
  return response;
}

/** GET/POST a JSON resource of the API; rejects with ApiError. `key` overrides the stored key. */
export async function api(path, options = {}) {
  const response = await send(path, options);
  return response.status === 204 ? null : response.json();
}

/**
 * Whether the service asks for a key: "open" (--no-auth), "ok" (`key` is accepted) or "refused".
 * Other failures (service down) reject.
 */
export async function probeAccess(key) {
  try {
    await api("v1/jobs?limit=1", { key });
    return key ? "ok" : "open";
  } catch (error) {
    if (error instanceof ApiError && error.status === 401) return "refused";
    throw error;
  }
}

/**
 * Open a server-sent event stream (text/event-stream) with the key as a header; resolves to the
 * Response once the stream has begun, or rejects with ApiError. `lastEventId` resumes a stream.
 */
export async function openStream(path, { signal, lastEventId } = {}) {
  const extraHeaders = { Accept: "text/event-stream" };
  if (lastEventId) extraHeaders["Last-Event-ID"] = lastEventId;
  return send(path, { signal, extraHeaders });
}

/** An artifact's bytes as a Blob (with the Authorization header, which a plain link cannot send). */
export async function fetchBlob(path, signal) {
  const response = await send(path, { signal, extraHeaders: { Accept: "*/*" } });
  return response.blob();
}

/** Save an artifact to the user's disk under `filename`. */
export async function download(path, filename) {
  const blob = await fetchBlob(path);
  const href = URL.createObjectURL(blob);
  const link = document.createElement("a");
  link.href = href;
  link.download = filename;
  link.hidden = true;
  document.body.append(link);
  link.click();
  link.remove();
  // The browser has taken the blob once the click is handled; free it on the next turn.
  setTimeout(() => URL.revokeObjectURL(href), 0);
}

/**
 * POST one file to /v1/uploads as the multipart field `file`, reporting progress (0..1).
 * XMLHttpRequest rather than fetch: fetch cannot report upload progress, and archives can be large.
 */
export function upload(file, onProgress = () => {}) {
  return new Promise((resolve, reject) => {
    const request = new XMLHttpRequest();
    request.open("POST", url("v1/uploads"));
    request.withCredentials = false;
    request.responseType = "json";
    request.setRequestHeader("Accept", "application/json");
    const key = storedKey();
    if (key) request.setRequestHeader("Authorization", `Bearer ${key}`);
    request.upload.addEventListener("progress", (event) => {
      if (event.lengthComputable) onProgress(event.loaded / event.total);
    });
    request.addEventListener("load", () => {
      if (request.status >= 200 && request.status < 300) {
        onProgress(1);
        resolve(request.response);
        return;
      }
      const problem = request.response || { title: request.statusText };
      const error = new ApiError(request.status, problem);
      if (request.status === 401) window.dispatchEvent(new CustomEvent("cahp:unauthenticated", { detail: error }));
      reject(error);
    });
    request.addEventListener("error", () => reject(new ApiError(0, { title: "The upload did not reach the service" })));
    request.addEventListener("abort", () => reject(new DOMException("upload aborted", "AbortError")));
    const form = new FormData();
    form.append("file", file, file.name);
    request.send(form);
  });
}
