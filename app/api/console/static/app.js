// The console's entry point: finds out whether a key is needed, signs in, and routes between views.
//
// Routes (relative to the page's <base>, normally /ui/): "" the jobs, "jobs/{id}" one job, "submit"
// the form. Links are real links; a click on one is handled here without reloading the page.

import { ApiError, forgetKey, probeAccess, storedKey, storeKey } from "./api.js";
import { clear, h } from "./dom.js";
import { jobView } from "./job.js";
import { jobsView } from "./jobs.js";
import { submitView } from "./submit.js";

const view = document.getElementById("view");
const who = document.getElementById("who");
const base = new URL(document.baseURI);
let access = null; // "open" (no key needed) or "key"
let cleanup = () => {};

/** The route of `url`: its path below the base, split into parts. */
function routeOf(url) {
  const path = url.pathname.startsWith(base.pathname) ? url.pathname.slice(base.pathname.length) : "";
  return path.split("/").filter(Boolean).map(decodeURIComponent);
}

export function navigate(href, { replace = false } = {}) {
  const url = new URL(href, base);
  if (replace) history.replaceState(null, "", url);
  else history.pushState(null, "", url);
  render({ focus: true });
}

function render({ focus = false } = {}) {
  cleanup();
  cleanup = () => {};
  const url = new URL(location.href);
  const parts = routeOf(url);
  for (const link of document.querySelectorAll("header nav a")) {
    const target = routeOf(new URL(link.href));
    const current = target.length ? parts[0] === target[0] : parts.length === 0 || parts[0] === "jobs";
    if (current) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  let shown;
  if (parts.length === 0) shown = jobsView(url.searchParams, { navigate });
  else if (parts[0] === "jobs" && parts.length === 2) shown = jobView(parts[1], { navigate });
  else if (parts[0] === "submit" && parts.length === 1) shown = submitView({ navigate });
  else shown = { element: h("section", {}, h("h1", {}, "Not found"), h("p", {}, "This page does not exist. ", h("a", { href: "./", "data-nav": "" }, "Back to the jobs."))) };
  clear(view, shown.element);
  cleanup = shown.destroy || (() => {});
  if (focus) {
    view.focus({ preventScroll: true });
    window.scrollTo(0, 0);
  }
}

function showIdentity() {
  if (access === "open") {
    clear(who, h("span", { class: "muted", title: "The server runs with --no-auth on a loopback address" }, "local mode, no key"));
  } else if (storedKey()) {
    clear(who, h("span", { class: "muted" }, "signed in"), " ",
      h("button", { type: "button", class: "link", onclick: signOut }, "Sign out"));
  } else {
    clear(who);
  }
}

function signOut() {
  forgetKey();
  cleanup();
  showIdentity();
  showSignIn();
}

function showSignIn(message = "") {
  cleanup();
  cleanup = () => {};
  const input = h("input", { id: "api-key", type: "password", autocomplete: "off", spellcheck: "false",
                             required: true, "aria-describedby": "api-key-help" });
  const error = h("p", { class: "error", role: "alert" }, message);
  const submit = h("button", { type: "submit" }, "Sign in");
  // No `name` on the input and a handler that always prevents the default: the key cannot travel in a
  // form submission (the page's CSP also forbids form submissions altogether).
  const form = h("form", { class: "signin", novalidate: true },
    h("h1", {}, "Sign in"),
    h("label", { for: "api-key" }, "API key"),
    input,
    h("p", { id: "api-key-help", class: "muted" },
      "The key from ", h("code", {}, "cahp keys create --name NAME"),
      ". It is kept in this tab only (sessionStorage) and sent as the Authorization header."),
    error, submit);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const key = input.value.trim();
    if (!key) {
      error.textContent = "Enter an API key.";
      input.focus();
      return;
    }
    submit.disabled = true;
    try {
      const answer = await probeAccess(key);
      if (answer === "refused") {
        error.textContent = "The service refused this key: check it, or create one with cahp keys create.";
        input.select();
        return;
      }
      storeKey(key);
      input.value = "";
      access = "key";
      showIdentity();
      render({ focus: true });
    } catch (failure) {
      error.textContent = failure instanceof ApiError ? failure.message : String(failure);
    } finally {
      submit.disabled = false;
    }
  });
  clear(view, form);
  input.focus();
}

document.addEventListener("click", (event) => {
  const link = event.target.closest("a[data-nav]");
  if (!link || event.defaultPrevented || event.button !== 0 || event.metaKey || event.ctrlKey || event.shiftKey || event.altKey) return;
  if (access === null) return;
  event.preventDefault();
  navigate(link.href);
});

// The skip link's "#view" resolves against <base> (/ui/), not the page shown: on a job's page a plain
// fragment link would load the job list. Move the focus instead of navigating.
document.querySelector("a.skip")?.addEventListener("click", (event) => {
  event.preventDefault();
  view.focus();
});

window.addEventListener("popstate", () => {
  if (access !== null) render();
});

// A 401 while signed in: the key was revoked. (Refusals while signing in are handled by the form.)
window.addEventListener("cahp:unauthenticated", () => {
  if (access !== "key") return;
  forgetKey();
  access = null;
  showIdentity();
  showSignIn("The service no longer accepts this key (revoked?). Sign in again.");
});

async function start() {
  try {
    const key = storedKey();
    const answer = await probeAccess(key || null);
    if (answer === "open") access = "open";
    else if (answer === "ok") access = "key";
    if (access === null) {
      if (key) forgetKey();
      showIdentity();
      showSignIn(key ? "The service refused the stored key. Sign in again." : "");
      return;
    }
    showIdentity();
    render();
  } catch (failure) {
    clear(view, h("section", {}, h("h1", {}, "The service does not answer"),
      h("p", { class: "error", role: "alert" }, failure instanceof ApiError ? failure.message : String(failure)),
      h("button", { type: "button", onclick: () => start() }, "Try again")));
  }
}

start();
