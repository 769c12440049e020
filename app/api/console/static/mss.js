// The MSS curve of mss_curve.json as SVG: the Mean Simplified Silhouette against k, the knee of each
// polynomial degree as a dashed line, k* ringed. Read by pointer or arrow keys; also as a table.

import { clear, formatNumber, h, s } from "./dom.js";
import { degreeRanges, labelRows, nextId, placeLabel, replaceKeepingFocus, responsive, textWidth, ticks, tooltip } from "./plot.js";

// Pixels between two rows of knee labels: more than their 11 px text's box (13 px), so rows never touch.
const LABEL_ROW = 15;
// The curve's points, and k*'s ring with half its 3 px stroke.
const POINT_R = 2.6;
const STAR_R = 9;
// k*'s label (12 px, bold; .plot svg and .kstar-label in app.css) as a box 16 px tall with its baseline
// 4 px above the bottom.
const STAR_FONT = 12;
const STAR_HEIGHT = 16;
const STAR_DESCENT = 4;

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
  const id = nextId("mss");
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
    const m = { left: 66, right: 18, top: 34, bottom: 44 };
    const kLo = ks[0];
    const kHi = ks[ks.length - 1];
    const kneeKs = [...kneesAt.keys()].sort((a, b) => a - b);
    const kneeX = (k) => m.left + ((k - kLo) / (kHi - kLo || 1)) * (width - m.left - m.right);
    // The knees' labels in as many rows as they need not to overlap (a phone's 390 px included); the
    // plot starts below the last row.
    const { placed, rows } = labelRows(kneeKs.map((k) => ({ x: kneeX(k), text: `deg ${degreeRanges(kneesAt.get(k))}` })),
      { minX: 0, maxX: width });
    m.top += LABEL_ROW * (rows - 1);
    const height = Math.round(Math.min(340, Math.max(220, width * 0.45))) + LABEL_ROW * (rows - 1);
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

    // Knees: one dashed line per distinct k, labelled with its degrees, each label on its own row when crowded.
    const knees = s("g", { class: "knees" });
    kneeKs.forEach((k, i) => {
      const kx = x(k);
      const { x: lx, row } = placed[i];
      const top = m.top - LABEL_ROW * (rows - 1) + row * LABEL_ROW;
      const chosen = kneesAt.get(k).includes(chosenDegree);
      knees.append(
        s("line", { x1: kx, x2: kx, y1: top - 4, y2: height - m.bottom, class: chosen ? "knee chosen" : "knee" }),
        s("text", { x: lx, y: top - 8, "text-anchor": "middle", class: "knee-label",
                    dataset: { row } }, `deg ${degreeRanges(kneesAt.get(k))}`));
    });
    svg.append(knees);

    const line = ks.map((k, i) => `${i ? "L" : "M"}${x(k).toFixed(1)},${y(mss[i]).toFixed(1)}`).join("");
    svg.append(s("path", { d: line, class: "curve" }));
    const points = s("g", { class: "points" });
    if (ks.length <= 80) for (let i = 0; i < ks.length; i += 1) points.append(s("circle", { cx: x(ks[i]), cy: y(mss[i]), r: POINT_R }));
    svg.append(points);
    const starIndex = ks.indexOf(kStar);
    if (starIndex >= 0) svg.append(...kStarMark(kStar, x(kStar), y(mss[starIndex]), { ks, mss, x, y, kneeKs, width, height, m }));
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
    svg.addEventListener("blur", () => {
      if (svg.isConnected) unfocus(); // a redrawn-away SVG's blur must not hide its successor's readout
    });
    svg.addEventListener("keydown", (event) => {
      const step = { ArrowRight: 1, ArrowUp: 1, ArrowLeft: -1, ArrowDown: -1 }[event.key];
      if (step) focusPoint(active + step);
      else if (event.key === "Home") focusPoint(0);
      else if (event.key === "End") focusPoint(ks.length - 1);
      else if (event.key === "Escape") unfocus();
      else return;
      event.preventDefault();
    });
    geometry = { x, y, cursor, ring, svg };
    // The tooltip box stays in the plot, after the SVG, so it floats over the redrawn chart.
    replaceKeepingFocus(plot, svg, plot.querySelector(".tooltip"));
  }

  const stop = responsive(plot, draw);
  return { element: figure, destroy: stop };
}

/**
 * k*'s ring and its label, the label beside the ring where it hides no point of the curve, no stretch of
 * its line and (where there is room) no knee's dashed line: on a phone the curve's next points stand
 * where a label at a fixed offset would go.
 */
function kStarMark(kStar, sx, sy, { ks, mss, x, y, kneeKs, width, height, m }) {
  const text = `k* = ${kStar}`;
  const centres = ks.map((k, i) => [x(k), y(mss[i])]);
  const spot = placeLabel({
    x: sx, y: sy, width: textWidth(text, STAR_FONT, 700), height: STAR_HEIGHT, gap: 11, rise: 14,
    bounds: [m.left, m.top, width - m.right, height - m.bottom],
    avoid: [[sx - STAR_R, sy - STAR_R, sx + STAR_R, sy + STAR_R],
      ...centres.map(([cx, cy]) => [cx - POINT_R, cy - POINT_R, cx + POINT_R, cy + POINT_R])],
    lines: centres.slice(1).map((end, i) => [centres[i], end]),
    guides: kneeKs.map((k) => [[x(k), m.top], [x(k), height - m.bottom]]),
  });
  const [left, , right, bottom] = spot.box;
  return [
    s("circle", { cx: sx, cy: sy, r: 7.5, class: "kstar" }),
    s("text", { x: spot.side === "right" ? left : right, y: bottom - STAR_DESCENT, "text-anchor": spot.side === "right" ? "start" : "end",
                class: "kstar-label", dataset: { side: spot.side } }, text),
  ];
}

function dataTable(ks, mss, kneesAt, kStar) {
  const rows = ks.map((k, i) => h("tr", {},
    h("td", {}, k), h("td", {}, formatNumber(mss[i], 4)),
    h("td", {}, [kneesAt.has(k) ? `knee (degree ${degreeRanges(kneesAt.get(k))})` : "", k === kStar ? " k*" : ""].join(""))));
  return h("details", { class: "data" }, h("summary", {}, "Curve as a table"),
    h("table", {}, h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "k"), h("th", { scope: "col" }, "MSS"), h("th", { scope: "col" }, "mark"))),
      h("tbody", {}, rows)));
}
