// What the console's SVG plots share: the colour scales, ticks, redrawing on resize, the tooltip.
//
// Colour is never the only carrier: the salience scale is viridis (its lightness rises monotonically,
// so it reads in greyscale), kept and pruned heads differ in lightness, clusters carry their number,
// and k* is a larger ring as well as a colour.

import { clear, h } from "./dom.js";

// matplotlib's viridis, sampled at nine points; interpolated linearly between them.
export const VIRIDIS = ["#440154", "#472d7b", "#3b528b", "#2c728e", "#21918c", "#28ae80", "#5ec962", "#addc30", "#fde725"];
// Paul Tol's "light" qualitative scheme: light enough for black cluster numbers on every colour.
export const CLUSTER_COLOURS = ["#77aadd", "#ee8866", "#eedd88", "#ffaabb", "#99ddff", "#44bb99", "#bbcc33", "#aaaa00", "#dddddd"];
export const KEPT_FILL = VIRIDIS[0];
export const SAFETY_FILL = VIRIDIS[4];
export const PRUNED_FILL = "#f1f1f1";

export function rgb(hex) {
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
export function inkOn(hex) {
  const [r, g, b] = rgb(hex).map((v) => {
    const c = v / 255;
    return c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4;
  });
  return 0.2126 * r + 0.7152 * g + 0.0722 * b > 0.25 ? "#000" : "#fff";
}

/** About `count` round tick values covering [lo, hi]. */
export function ticks(lo, hi, count = 5, integer = false) {
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
export function degreeRanges(degrees) {
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

/**
 * Rows for labels centred at `x` that never overlap: each goes on the first row whose last label ends
 * `gap` px before it starts (widths estimated at `charWidth` px a character), shifted to stay within
 * [minX, maxX]. Returns [{x, row}] in the order given, and the number of rows used.
 */
export function labelRows(labels, { minX, maxX, charWidth = 6.6, gap = 6 }) {
  const ends = [];
  const placed = labels.map(({ x, text }) => {
    const half = (text.length * charWidth) / 2;
    const cx = Math.min(Math.max(x, minX + half), maxX - half);
    let row = ends.findIndex((end) => end + gap <= cx - half);
    if (row < 0) row = ends.length;
    ends[row] = cx + half;
    return { x: cx, row };
  });
  return { placed, rows: Math.max(ends.length, 1) };
}

let measurer;

/**
 * The width in px of `text` in the page's font at `size` px and `weight`, as a canvas measures it (the
 * same shaping as an SVG text's); 0.7 em a character, about the widest bold digits of common fonts,
 * where no canvas can tell.
 */
export function textWidth(text, size, weight = 400) {
  if (measurer === undefined) measurer = document.createElement("canvas").getContext("2d");
  if (!measurer) return text.length * size * 0.7;
  measurer.font = `${weight} ${size}px ${getComputedStyle(document.documentElement).fontFamily}`;
  return measurer.measureText(text).width;
}

/** Whether the segment [a, b] passes through the box [left, top, right, bottom] (Liang–Barsky clipping). */
function crosses([ax, ay], [bx, by], [left, top, right, bottom]) {
  let t0 = 0;
  let t1 = 1;
  const dx = bx - ax;
  const dy = by - ay;
  for (const [p, q] of [[-dx, ax - left], [dx, right - ax], [-dy, ay - top], [dy, bottom - ay]]) {
    if (p === 0) {
      if (q < 0) return false;
    } else if (p < 0) {
      t0 = Math.max(t0, q / p);
    } else {
      t1 = Math.min(t1, q / p);
    }
    if (t0 > t1) return false;
  }
  return true;
}

/**
 * Where a label `width` x `height` px goes beside the point (x, y) so that it hides nothing: the first of
 * the spots `gap` px to its right or left, stepping 4 px at a time above then below it (starting `rise`
 * px above), whose box stays inside `bounds` and, `margin` px around it, clears every box of `avoid` and
 * every segment of `lines`. `guides`: segments (dashed lines) to keep clear too while some spot allows it. Boxes are
 * [left, top, right, bottom]; segments [[x, y], [x, y]]. Returns the box, and the `side` ("right" or
 * "left") the label stands on; the first spot when no spot is clear.
 */
export function placeLabel({ x, y, width, height, gap, rise, bounds, avoid = [], lines = [], guides = [], margin = 2 }) {
  const [minX, minY, maxX, maxY] = bounds;
  const spots = [];
  for (let d = rise; d <= maxY - minY + height; d += 4) {
    for (const dy of [-d, d]) {
      for (const side of ["right", "left"]) {
        const left = side === "right" ? x + gap : x - gap - width;
        const top = y + dy - height / 2;
        spots.push({ side, box: [left, top, left + width, top + height] });
      }
    }
  }
  const inside = ({ box: [l, t, r, b] }) => minX <= l && r <= maxX && minY <= t && b <= maxY;
  const overlaps = (a, b) => a[0] < b[2] && b[0] < a[2] && a[1] < b[3] && b[1] < a[3];
  // A margin around the box: the curve's stroke is 2 px wide, and a label needs air to be read.
  const clear = ([l, t, r, b], segments) => {
    const box = [l - margin, t - margin, r + margin, b + margin];
    return !avoid.some((other) => overlaps(box, other)) && !segments.some(([p, q]) => crosses(p, q, box));
  };
  const all = [...lines, ...guides];
  return spots.find((spot) => inside(spot) && clear(spot.box, all))
    || spots.find((spot) => inside(spot) && clear(spot.box, lines))
    || spots[0];
}

/** Re-draw `draw(width)` into `host` whenever its width changes. Returns a function that stops it. */
export function responsive(host, draw) {
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
export function tooltip(wrapper, id) {
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

/**
 * Put `svg` (and `rest`) in `plot` in place of what it holds. A redraw (a resize, a scrollbar appearing) must not
 * take the keyboard focus away from a plot being read: when the old SVG had it, the new one gets it.
 */
export function replaceKeepingFocus(plot, svg, ...rest) {
  const old = plot.querySelector("svg");
  const hadFocus = old !== null && document.activeElement === old;
  clear(plot, svg, ...rest);
  if (hadFocus) svg.focus({ preventScroll: true });
}

let uid = 0;

/** A page-unique id prefix for a plot's elements (tooltips, gradients). */
export function nextId(prefix) {
  uid += 1;
  return `${prefix}-${uid}`;
}
