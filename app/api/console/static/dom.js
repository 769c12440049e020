// Small DOM and formatting helpers. Text from the service is always set as text, never parsed as HTML.

const SVG_NS = "http://www.w3.org/2000/svg";

function build(element, attrs, children) {
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on") && typeof value === "function") element.addEventListener(name.slice(2), value);
    else if (name === "dataset") Object.assign(element.dataset, value);
    else element.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    element.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return element;
}

/** An HTML element: h("a", {href: "x"}, "text", otherNode). */
export function h(tag, attrs, ...children) {
  return build(document.createElement(tag), attrs, children);
}

/** An SVG element. */
export function s(tag, attrs, ...children) {
  return build(document.createElementNS(SVG_NS, tag), attrs, children);
}

export function clear(element, ...children) {
  element.replaceChildren();
  return build(element, {}, children);
}

const BYTE_UNITS = ["B", "KiB", "MiB", "GiB", "TiB"];

export function formatBytes(n) {
  if (n === null || n === undefined) return "–";
  let value = n;
  let unit = 0;
  while (value >= 1024 && unit < BYTE_UNITS.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${unit ? value.toFixed(value < 10 ? 1 : 0) : value} ${BYTE_UNITS[unit]}`;
}

export function formatCount(n) {
  if (n === null || n === undefined) return "–";
  if (Math.abs(n) >= 1e6) return `${(n / 1e6).toFixed(2)} M`;
  if (Math.abs(n) >= 1e4) return `${(n / 1e3).toFixed(1)} k`;
  return n.toLocaleString("en");
}

export function formatPercent(fraction, digits = 0) {
  if (fraction === null || fraction === undefined || !Number.isFinite(fraction)) return "–";
  return `${(100 * fraction).toFixed(digits)}%`;
}

export function formatNumber(x, digits = 3) {
  if (x === null || x === undefined || Number.isNaN(x)) return "–";
  return Number(x).toFixed(digits);
}

export function formatDuration(seconds) {
  if (seconds === null || seconds === undefined || seconds < 0) return "–";
  if (seconds < 60) return `${seconds.toFixed(seconds < 10 ? 1 : 0)} s`;
  const minutes = Math.floor(seconds / 60);
  if (minutes < 60) return `${minutes} min ${Math.round(seconds % 60)} s`;
  const hours = Math.floor(minutes / 60);
  return `${hours} h ${minutes % 60} min`;
}

/** Seconds between two ISO times (the second defaults to now), or null. */
export function secondsBetween(start, end) {
  if (!start) return null;
  return ((end ? Date.parse(end) : Date.now()) - Date.parse(start)) / 1000;
}

export function formatRelative(iso) {
  if (!iso) return "–";
  const seconds = (Date.now() - Date.parse(iso)) / 1000;
  if (seconds < 45) return "just now";
  if (seconds < 3600) return `${Math.round(seconds / 60)} min ago`;
  if (seconds < 86400) return `${Math.round(seconds / 3600)} h ago`;
  return new Date(iso).toLocaleDateString("en-CA");
}

export function formatTime(iso) {
  if (!iso) return "–";
  return new Date(iso).toLocaleString("en-CA", { hour12: false });
}

/** A <time> showing `iso` relative to now, with the absolute time as its tooltip. */
export function timeElement(iso) {
  if (!iso) return h("span", { class: "muted" }, "–");
  return h("time", { datetime: iso, title: formatTime(iso) }, formatRelative(iso));
}

/** A job's labels, when the API gives it any: an object {name: value} or a list of strings. */
export function labelChips(labels) {
  if (!labels) return [];
  const entries = Array.isArray(labels)
    ? labels.map((label) => String(label))
    : Object.entries(labels).map(([name, value]) => (value === "" || value === null ? name : `${name}=${value}`));
  return entries.map((text) => h("span", { class: "chip" }, text));
}

export function statusBadge(status, cancelRequested = false) {
  const text = cancelRequested && status === "running" ? "cancelling" : status;
  return h("span", { class: `status status-${status}`, dataset: { status } }, text);
}

/**
 * A speed-up with its 95 % interval; one whose interval holds ×1 is inside its own noise and reads
 * "no measurable change" (never a slowdown). The same rule as the model cards and `cahp prune`.
 */
export function formatSpeedup(value, low, high) {
  if (value === null || value === undefined) return "–";
  const x = (v) => `×${Number(v).toFixed(2)}`;
  if (low === null || low === undefined || high === null || high === undefined) return x(value);
  if (low <= 1 && 1 <= high) return `no measurable change (${x(value)}, 95 % interval ${x(low)}–${x(high)})`;
  return `${x(value)} (95 % interval ${x(low)}–${x(high)})`;
}

/** What to call a job's model: the name given at submit, else the model's name, else its reference. */
export function modelTitle(job) {
  return job.name || job.model_name || job.result?.base_model || job.model?.uri || "–";
}
