// The result's plots, drawn as SVG from the job's JSON artifacts (mss_curve.json, head_map.json):
// the MSS curve, the layer x head map and the per-layer retention. No charting library.
//
// Colour is never the only carrier: the salience scale is viridis (its lightness rises monotonically,
// so it reads in greyscale), kept and pruned heads differ in lightness, clusters carry their number,
// and k* is a larger ring as well as a colour. Each plot can be read with the keyboard (arrow keys).

import { clear, formatNumber, h, s } from "./dom.js";

// matplotlib's viridis, sampled at nine points; interpolated linearly between them.
const VIRIDIS = ["#440154", "#472d7b", "#3b528b", "#2c728e", "#21918c", "#28ae80", "#5ec962", "#addc30", "#fde725"];
// Paul Tol's "light" qualitative scheme: light enough for black cluster numbers on every colour.
const CLUSTER_COLOURS = ["#77aadd", "#ee8866", "#eedd88", "#ffaabb", "#99ddff", "#44bb99", "#bbcc33", "#aaaa00", "#dddddd"];
const KEPT_FILL = VIRIDIS[0];
const SAFETY_FILL = VIRIDIS[4];
const PRUNED_FILL = "#f1f1f1";

function rgb(hex) {
  const n = Number.parseInt(hex.slice(1), 16);
  return [(n >> 16) & 255, (n >> 8) & 255, n & 255];
}

/** viridis(t) for t in [0, 1] as "#rrggbb". */
export function viridis(t) {
  const x = Math.min(1, Math.max(0, Number.isFinite(t) ? t : 0)) * (VIRIDIS.length - 1);
  const i = Math.min(VIRIDIS.length - 2, Math.floor(x));
  const a = rgb(VIRIDIS[i]);
  const b = rgb(VIRIDIS[i + 1]);
  const mix = a.map((v, j) => Math.round(v + (b[j] - v) * (x - i)));
  return `#${mix.map((v) => v.toString(16).padStart(2, "0")).join("")}`;
}

/** Black or white, whichever reads better on `hex`. */
function inkOn(hex) {
  const [r, g, b] = rgb(hex).map((v) => {
    const c = v / 255;
    return c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4;
  });
  return 0.2126 * r + 0.7152 * g + 0.0722 * b > 0.25 ? "#000" : "#fff";
}

/** About `count` round tick values covering [lo, hi]. */
function ticks(lo, hi, count = 5, integer = false) {
  if (!(hi > lo)) return [lo];
  const raw = (hi - lo) / count;
  const power = 10 ** Math.floor(Math.log10(raw));
  let step = [1, 2, 2.5, 5, 10].map((m) => m * power).find((m) => m >= raw) || 10 * power;
  if (integer) step = Math.max(1, Math.round(step));
  const result = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) result.push(Number(v.toFixed(10)));
  return result;
}

/** "2–6" for [2, 3, 4, 5, 6], "2, 4" for [2, 4]. */
function degreeRanges(degrees) {
  const sorted = [...degrees].sort((a, b) => a - b);
  const parts = [];
  for (let i = 0; i < sorted.length; i += 1) {
    let j = i;
    while (j + 1 < sorted.length && sorted[j + 1] === sorted[j] + 1) j += 1;
    parts.push(j > i + 1 ? `${sorted[i]}–${sorted[j]}` : sorted.slice(i, j + 1).join(", "));
    i = j;
  }
  return parts.join(", ");
}

/** Re-draw `draw(width)` into `host` whenever its width changes. Returns a function that stops it. */
function responsive(host, draw) {
  let width = 0;
  const redraw = () => {
    const next = Math.max(280, Math.floor(host.clientWidth || 640));
    if (next !== width) {
      width = next;
      draw(width);
    }
  };
  redraw();
  if (typeof ResizeObserver === "undefined") return () => {};
  let frame = 0;
  const observer = new ResizeObserver(() => {
    cancelAnimationFrame(frame);
    frame = requestAnimationFrame(redraw);
  });
  observer.observe(host);
  return () => observer.disconnect();
}

/** A tooltip floating over `wrapper` (position: relative), plus a live text readout for screen readers. */
function tooltip(wrapper, id) {
  const box = h("div", { class: "tooltip", role: "tooltip", id, hidden: true });
  const readout = h("p", { class: "readout", "aria-live": "polite" });
  wrapper.append(box);
  return {
    readout,
    /** Show `lines` next to the point (x, y) of `svg`, in the SVG's own units. */
    show(lines, svg, x, y) {
      clear(box, ...lines.map((line, i) => h(i ? "div" : "strong", {}, line)));
      box.hidden = false;
      readout.textContent = lines.join(" · ");
      const frame = svg.getBoundingClientRect();
      const host = wrapper.getBoundingClientRect();
      const k = frame.width / (svg.viewBox.baseVal.width || frame.width || 1);
      x = frame.left - host.left + x * k;
      y = frame.top - host.top + y * k;
      const maxLeft = wrapper.clientWidth - box.offsetWidth - 4;
      const left = Math.max(4, Math.min(maxLeft, x + 12));
      const top = y - box.offsetHeight - 10 < 0 ? y + 14 : y - box.offsetHeight - 10;
      box.style.left = `${left}px`;
      box.style.top = `${top}px`;
    },
    hide() {
      box.hidden = true;
    },
  };
}

let uid = 0;

/**
 * The Mean Simplified Silhouette against k, with the knee of each polynomial degree and k*.
 *
 * @param {object} curve the content of mss_curve.json
 * @returns {{element: HTMLElement, destroy: function()}}
 */
export function mssChart(curve) {
  const ks = curve.k || [];
  const mss = curve.mss || [];
  const figure = h("figure", { class: "chart mss" });
  if (!ks.length) {
    figure.append(h("p", { class: "muted" }, "No MSS curve: this run chose its heads without clustering."));
    return { element: figure, destroy() {} };
  }
  const kStar = curve.knee;
  const fixed = curve.fixed_heads_to_keep !== null && curve.fixed_heads_to_keep !== undefined;
  const chosenDegree = fixed ? null : curve.polynomial_degree;
  const kneesAt = new Map(); // k -> [degrees]
  for (const [degree, k] of Object.entries(curve.knees_by_degree || {})) {
    if (k === null || k === undefined) continue;
    if (!kneesAt.has(k)) kneesAt.set(k, []);
    kneesAt.get(k).push(Number(degree));
  }
  const id = `mss-${(uid += 1)}`;
  const plot = h("div", { class: "plot" });
  const tip = tooltip(plot, `${id}-tip`);
  const caption = h("figcaption", {},
    `Mean Simplified Silhouette of the FasterPAM partition for k = ${ks[0]}…${ks[ks.length - 1]}; dashed lines: the knee found at each polynomial degree; ringed: k* = ${kStar}`,
    fixed ? " (fixed by heads_to_keep)." : ` (degree ${chosenDegree}${curve.knee_found === false ? ", no knee found: fallback rule" : ""}).`,
    " Hover or focus the plot and use the arrow keys to read points.");
  figure.append(caption, plot, tip.readout, dataTable(ks, mss, kneesAt, kStar));

  let active = ks.indexOf(kStar) >= 0 ? ks.indexOf(kStar) : 0;
  let geometry = null;

  function describe(i) {
    const lines = [`k = ${ks[i]}`, `MSS = ${formatNumber(mss[i], 4)}`];
    if (kneesAt.has(ks[i])) lines.push(`knee at degree ${degreeRanges(kneesAt.get(ks[i]))}`);
    if (ks[i] === kStar) lines.push("k*: the number of clusters used");
    return lines;
  }

  function focusPoint(i, show = true) {
    active = Math.max(0, Math.min(ks.length - 1, i));
    if (!geometry) return;
    const { x, y, cursor, ring } = geometry;
    const cx = x(ks[active]);
    const cy = y(mss[active]);
    cursor.setAttribute("x1", cx);
    cursor.setAttribute("x2", cx);
    cursor.removeAttribute("visibility");
    ring.setAttribute("cx", cx);
    ring.setAttribute("cy", cy);
    ring.removeAttribute("visibility");
    if (show) tip.show(describe(active), geometry.svg, cx, cy);
  }

  function unfocus() {
    if (!geometry) return;
    geometry.cursor.setAttribute("visibility", "hidden");
    geometry.ring.setAttribute("visibility", "hidden");
    tip.hide();
  }

  function draw(width) {
    const height = Math.round(Math.min(340, Math.max(220, width * 0.45)));
    const m = { left: 66, right: 18, top: 34, bottom: 44 };
    const kLo = ks[0];
    const kHi = ks[ks.length - 1];
    let yLo = Math.min(...mss);
    let yHi = Math.max(...mss);
    const pad = (yHi - yLo) * 0.08 || 0.05;
    yLo -= pad;
    yHi += pad;
    const x = (k) => m.left + ((k - kLo) / (kHi - kLo || 1)) * (width - m.left - m.right);
    const y = (v) => m.top + (1 - (v - yLo) / (yHi - yLo)) * (height - m.top - m.bottom);
    const svg = s("svg", {
      viewBox: `0 0 ${width} ${height}`, width, height, tabindex: 0, role: "group", class: "focusable",
      "aria-label": `MSS curve, k from ${kLo} to ${kHi}, k* = ${kStar}. Arrow keys move between points.`,
      "aria-describedby": `${id}-tip`,
    });
    const axes = s("g", { class: "axes" });
    for (const t of ticks(yLo, yHi, 5)) {
      axes.append(s("line", { x1: m.left, x2: width - m.right, y1: y(t), y2: y(t), class: "grid" }),
        s("text", { x: m.left - 8, y: y(t), "text-anchor": "end", "dominant-baseline": "middle" }, t.toFixed(3)));
    }
    for (const t of ticks(kLo, kHi, Math.max(2, Math.floor(width / 70)), true)) {
      axes.append(s("line", { x1: x(t), x2: x(t), y1: height - m.bottom, y2: height - m.bottom + 5, class: "tick" }),
        s("text", { x: x(t), y: height - m.bottom + 18, "text-anchor": "middle" }, t));
    }
    axes.append(
      s("line", { x1: m.left, x2: width - m.right, y1: height - m.bottom, y2: height - m.bottom, class: "axis" }),
      s("text", { x: (m.left + width - m.right) / 2, y: height - 6, "text-anchor": "middle", class: "label" }, "k (number of clusters)"),
      s("text", { x: 14, y: (m.top + height - m.bottom) / 2, "text-anchor": "middle", class: "label",
                  transform: `rotate(-90 14 ${(m.top + height - m.bottom) / 2})` }, "MSS"));
    svg.append(axes);

    // Knees: one dashed line per distinct k, labelled with its degrees; labels step down when crowded.
    const knees = s("g", { class: "knees" });
    let lastX = -Infinity;
    let row = 0;
    for (const k of [...kneesAt.keys()].sort((a, b) => a - b)) {
      const kx = x(k);
      row = kx - lastX < 64 ? (row + 1) % 2 : 0;
      lastX = kx;
      const chosen = kneesAt.get(k).includes(chosenDegree);
      knees.append(
        s("line", { x1: kx, x2: kx, y1: m.top - 4 + row * 12, y2: height - m.bottom, class: chosen ? "knee chosen" : "knee" }),
        s("text", { x: kx, y: m.top - 8 + row * 12, "text-anchor": "middle", class: "knee-label" },
          `deg ${degreeRanges(kneesAt.get(k))}`));
    }
    svg.append(knees);

    const line = ks.map((k, i) => `${i ? "L" : "M"}${x(k).toFixed(1)},${y(mss[i]).toFixed(1)}`).join("");
    svg.append(s("path", { d: line, class: "curve" }));
    const points = s("g", { class: "points" });
    if (ks.length <= 80) for (let i = 0; i < ks.length; i += 1) points.append(s("circle", { cx: x(ks[i]), cy: y(mss[i]), r: 2.6 }));
    svg.append(points);
    const starIndex = ks.indexOf(kStar);
    if (starIndex >= 0) {
      const sx = x(kStar);
      const sy = y(mss[starIndex]);
      svg.append(
        s("circle", { cx: sx, cy: sy, r: 7.5, class: "kstar" }),
        s("text", { x: sx + 11, y: sy - 10, class: "kstar-label" }, `k* = ${kStar}`));
    }
    const cursor = s("line", { y1: m.top, y2: height - m.bottom, class: "cursor", visibility: "hidden" });
    const ring = s("circle", { r: 5, class: "ring", visibility: "hidden" });
    svg.append(cursor, ring);
    // One transparent layer takes the pointer: the nearest k to the pointer is the point read.
    const hit = s("rect", { x: m.left, y: m.top, width: width - m.left - m.right, height: height - m.top - m.bottom, class: "hit" });
    svg.append(hit);
    hit.addEventListener("pointermove", (event) => {
      const box = svg.getBoundingClientRect();
      const px = ((event.clientX - box.left) / box.width) * width;
      let best = 0;
      for (let i = 1; i < ks.length; i += 1) if (Math.abs(x(ks[i]) - px) < Math.abs(x(ks[best]) - px)) best = i;
      focusPoint(best);
    });
    hit.addEventListener("pointerleave", () => {
      if (document.activeElement !== svg) unfocus();
    });
    svg.addEventListener("focus", () => focusPoint(active));
    svg.addEventListener("blur", unfocus);
    svg.addEventListener("keydown", (event) => {
      const step = { ArrowRight: 1, ArrowUp: 1, ArrowLeft: -1, ArrowDown: -1 }[event.key];
      if (step) focusPoint(active + step);
      else if (event.key === "Home") focusPoint(0);
      else if (event.key === "End") focusPoint(ks.length - 1);
      else if (event.key === "Escape") unfocus();
      else return;
      event.preventDefault();
    });
    // The tooltip box stays in the plot, after the SVG, so it floats over the redrawn chart.
    clear(plot, svg, plot.querySelector(".tooltip"));
    geometry = { x, y, cursor, ring, svg };
  }

  const stop = responsive(plot, draw);
  return { element: figure, destroy: stop };
}

function dataTable(ks, mss, kneesAt, kStar) {
  const rows = ks.map((k, i) => h("tr", {},
    h("td", {}, k), h("td", {}, formatNumber(mss[i], 4)),
    h("td", {}, [kneesAt.has(k) ? `knee (degree ${degreeRanges(kneesAt.get(k))})` : "", k === kStar ? " k*" : ""].join(""))));
  return h("details", { class: "data" }, h("summary", {}, "Curve as a table"),
    h("table", {}, h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "k"), h("th", { scope: "col" }, "MSS"), h("th", { scope: "col" }, "mark"))),
      h("tbody", {}, rows)));
}

const MODES = [
  ["kept", "Kept / pruned"],
  ["salience", "Salience"],
  ["cluster", "Cluster"],
];

/**
 * The layer x head grid of head_map.json, switching between kept/pruned, salience and cluster.
 *
 * @param {object} map the content of head_map.json
 * @returns {{element: HTMLElement, destroy: function()}}
 */
export function headMap(map) {
  const L = map.num_layers;
  const H = map.num_heads;
  const keyOf = (l, hd) => l * H + hd;
  const kept = new Set();
  for (const [layer, heads] of Object.entries(map.kept || {})) for (const hd of heads) kept.add(keyOf(Number(layer), hd));
  const representatives = new Set((map.representatives || []).map(([l, hd]) => keyOf(l, hd)));
  const safety = new Set((map.layer_safety_added || []).map(([l, hd]) => keyOf(l, hd)));
  const medoids = new Set((map.medoids || []).map(([l, hd]) => keyOf(l, hd)));
  const id = `heads-${(uid += 1)}`;
  let mode = "kept";
  let active = null; // [layer, head]
  let cells = null; // rect elements, by key

  const figure = h("figure", { class: "chart heads" });
  const name = `${id}-mode`;
  const switcher = h("fieldset", { class: "modes" }, h("legend", {}, "Colour heads by"),
    MODES.map(([value, label]) => h("label", {},
      h("input", { type: "radio", name, value, checked: value === mode, onchange: () => setMode(value) }), ` ${label}`)));
  const plot = h("div", { class: "plot" });
  const tip = tooltip(plot, `${id}-tip`);
  const legend = h("div", { class: "legend" });
  figure.append(
    h("figcaption", {}, h("strong", {}, "Head map. "),
      `${L} layers × ${H} heads, strategy ${map.strategy}, k* = ${map.k_star}. `,
      "Hover a head, or focus the map and use the arrow keys, to read it."),
    switcher, plot, tip.readout, legend);

  function status(key) {
    if (safety.has(key)) return "safety";
    if (kept.has(key)) return "kept";
    return "pruned";
  }

  function fill(l, hd) {
    const key = keyOf(l, hd);
    if (mode === "salience") return viridis(map.salience[l][hd]);
    if (mode === "cluster") return CLUSTER_COLOURS[map.cluster[l][hd] % CLUSTER_COLOURS.length];
    return { safety: SAFETY_FILL, kept: KEPT_FILL, pruned: PRUNED_FILL }[status(key)];
  }

  function describe(l, hd) {
    const key = keyOf(l, hd);
    const cluster = map.cluster?.[l]?.[hd];
    const raw = map.salience_raw?.[l]?.[hd];
    const lines = [
      `Layer ${l} · head ${hd}`,
      `Salience ${formatNumber(map.salience[l][hd], 3)}${raw !== undefined ? ` (raw ${Number(raw).toExponential(2)})` : ""}`,
      `Cluster ${cluster}${medoids.has(key) ? " (its medoid)" : ""}`,
    ];
    if (safety.has(key)) lines.push("Kept for layer safety (its layer would be empty)");
    else if (representatives.has(key)) lines.push(`Kept: representative of cluster ${cluster}`);
    else if (kept.has(key)) lines.push("Kept");
    else lines.push("Pruned");
    return lines;
  }

  function paint() {
    if (!cells) return;
    for (let l = 0; l < L; l += 1) {
      for (let hd = 0; hd < H; hd += 1) {
        const { rect, label, mark } = cells[keyOf(l, hd)];
        const colour = fill(l, hd);
        rect.setAttribute("fill", colour);
        const showKept = mode !== "kept" && kept.has(keyOf(l, hd));
        mark.setAttribute("visibility", showKept ? "visible" : "hidden");
        label.setAttribute("fill", inkOn(colour));
        label.textContent = mode === "cluster" ? String(map.cluster[l][hd]) : mode === "kept" && safety.has(keyOf(l, hd)) ? "S" : "";
      }
    }
    drawLegend();
  }

  function drawLegend() {
    if (mode === "salience") {
      const gradient = `${id}-ramp`;
      clear(legend,
        s("svg", { viewBox: "0 0 240 36", width: 240, height: 36, "aria-hidden": "true" },
          s("defs", {}, s("linearGradient", { id: gradient },
            VIRIDIS.map((colour, i) => s("stop", { offset: `${(100 * i) / (VIRIDIS.length - 1)}%`, "stop-color": colour })))),
          s("rect", { x: 4, y: 2, width: 232, height: 14, fill: `url(#${gradient})` }),
          ["0", "0.5", "1"].map((t, i) => s("text", { x: 4 + i * 116, y: 30, "text-anchor": ["start", "middle", "end"][i] }, t))),
        h("span", {}, "salience (min–max normalised); outlined: kept heads"));
      return;
    }
    const swatch = (colour, text, extra = "") => h("span", { class: "item" },
      s("svg", { viewBox: "0 0 16 16", width: 16, height: 16, "aria-hidden": "true" },
        s("rect", { x: 1, y: 1, width: 14, height: 14, fill: colour, class: "swatch" }),
        extra ? s("text", { x: 8, y: 12, "text-anchor": "middle", fill: inkOn(colour), class: "swatch-text" }, extra) : null),
      text);
    if (mode === "cluster") {
      clear(legend, h("span", {}, "the number in each head is its cluster id; outlined: kept heads"));
    } else {
      clear(legend, swatch(KEPT_FILL, "kept (representative)"), swatch(SAFETY_FILL, "kept for layer safety", "S"),
        swatch(PRUNED_FILL, "pruned"));
    }
  }

  function setMode(next) {
    mode = next;
    paint();
    if (active) show(...active);
  }

  function show(l, hd) {
    active = [l, hd];
    if (!cells) return;
    const { rect } = cells[keyOf(l, hd)];
    const x = Number(rect.getAttribute("x"));
    const y = Number(rect.getAttribute("y"));
    const size = Number(rect.getAttribute("width"));
    const focus = plot.querySelector(".cell-focus");
    focus.setAttribute("x", x - 1.5);
    focus.setAttribute("y", y - 1.5);
    focus.setAttribute("width", size + 3);
    focus.setAttribute("height", size + 3);
    focus.setAttribute("visibility", "visible");
    tip.show(describe(l, hd), plot.querySelector("svg"), x + size / 2, y);
  }

  function hide() {
    const focus = plot.querySelector(".cell-focus");
    focus?.setAttribute("visibility", "hidden");
    tip.hide();
  }

  function draw(width) {
    const left = 56;
    const top = 34;
    const size = Math.floor(Math.min(44, Math.max(12, (width - left - 8) / H)));
    const gap = size >= 20 ? 2 : 1;
    const svgWidth = left + H * size + 8;
    const svgHeight = top + L * size + 6;
    const svg = s("svg", {
      viewBox: `0 0 ${svgWidth} ${svgHeight}`, width: svgWidth, height: svgHeight, tabindex: 0, role: "group",
      class: "focusable", "aria-label": `Head map, ${L} layers by ${H} heads. Arrow keys move between heads.`,
      "aria-describedby": `${id}-tip`,
    });
    svg.append(s("text", { x: left, y: 12, class: "label" }, "head →"),
      s("text", { x: 4, y: top - 8, class: "label" }, "layer ↓"));
    const step = size < 18 ? Math.ceil(18 / size) : 1;
    for (let hd = 0; hd < H; hd += step) svg.append(s("text", { x: left + hd * size + size / 2, y: top - 8, "text-anchor": "middle" }, hd));
    cells = [];
    const grid = s("g", { class: "cells" });
    for (let l = 0; l < L; l += 1) {
      svg.append(s("text", { x: left - 8, y: top + l * size + size / 2, "text-anchor": "end", "dominant-baseline": "middle" }, l));
      for (let hd = 0; hd < H; hd += 1) {
        const x = left + hd * size;
        const y = top + l * size;
        const rect = s("rect", { x: x + gap / 2, y: y + gap / 2, width: size - gap, height: size - gap, class: "cell",
                                 dataset: { layer: l, head: hd } });
        const mark = s("g", { class: "kept-mark", visibility: "hidden" },
          s("rect", { x: x + gap / 2 + 1, y: y + gap / 2 + 1, width: size - gap - 2, height: size - gap - 2, class: "outer" }),
          s("rect", { x: x + gap / 2 + 2.5, y: y + gap / 2 + 2.5, width: size - gap - 5, height: size - gap - 5, class: "inner" }));
        const label = s("text", { x: x + size / 2, y: y + size / 2, "text-anchor": "middle", "dominant-baseline": "central",
                                  class: "cell-text", "font-size": Math.max(8, Math.min(14, size * 0.45)) });
        cells[keyOf(l, hd)] = { rect, label, mark };
        rect.addEventListener("pointerenter", () => show(l, hd));
        grid.append(rect, mark, label);
      }
    }
    grid.addEventListener("pointerleave", () => {
      if (document.activeElement !== svg) hide();
    });
    svg.append(grid, s("rect", { class: "cell-focus", visibility: "hidden" }));
    svg.addEventListener("focus", () => show(...(active || [0, 0])));
    svg.addEventListener("blur", hide);
    svg.addEventListener("keydown", (event) => {
      const [l, hd] = active || [0, 0];
      const move = { ArrowRight: [0, 1], ArrowLeft: [0, -1], ArrowDown: [1, 0], ArrowUp: [-1, 0] }[event.key];
      if (move) show(Math.max(0, Math.min(L - 1, l + move[0])), Math.max(0, Math.min(H - 1, hd + move[1])));
      else if (event.key === "Home") show(l, 0);
      else if (event.key === "End") show(l, H - 1);
      else if (event.key === "Escape") hide();
      else return;
      event.preventDefault();
    });
    const box = plot.querySelector(".tooltip");
    clear(plot, svg, box);
    paint();
    if (active && document.activeElement === svg) show(...active);
  }

  const stop = responsive(plot, draw);
  return { element: figure, destroy: stop };
}

/**
 * The share of heads kept in each layer, as horizontal bars.
 *
 * @param {object} map the content of head_map.json
 */
export function layerRetention(map) {
  const L = map.num_layers;
  const H = map.num_heads;
  const figure = h("figure", { class: "chart retention" });
  const plot = h("div", { class: "plot" });
  const rows = [];
  for (let l = 0; l < L; l += 1) rows.push((map.kept?.[String(l)] || []).length);
  figure.append(h("figcaption", {}, h("strong", {}, "Layer retention. "), "Heads kept in each layer."), plot);
  const draw = (width) => {
    const left = 56;
    const right = 70;
    const bar = 18;
    const height = L * (bar + 6) + 8;
    const scale = (Math.min(width, 560) - left - right) / H;
    const svg = s("svg", { viewBox: `0 0 ${width} ${height}`, width, height, role: "img",
                           "aria-label": rows.map((n, l) => `layer ${l}: ${n} of ${H}`).join("; ") });
    rows.forEach((n, l) => {
      const y = 4 + l * (bar + 6);
      svg.append(
        s("text", { x: left - 8, y: y + bar / 2, "text-anchor": "end", "dominant-baseline": "middle" }, `layer ${l}`),
        s("rect", { x: left, y, width: H * scale, height: bar, class: "track" }),
        s("rect", { x: left, y, width: n * scale, height: bar, class: "bar", fill: KEPT_FILL }),
        s("text", { x: left + H * scale + 8, y: y + bar / 2, "dominant-baseline": "middle" }, `${n} / ${H}`));
    });
    clear(plot, svg);
  };
  const stop = responsive(plot, draw);
  return { element: figure, destroy: stop };
}
