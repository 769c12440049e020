// The head map of head_map.json as SVG: a layer x head grid coloured by kept / salience / cluster
// (and, for a consensus strategy, by how many of the runs it combined kept each head), read by pointer
// or arrow keys; and the share of heads kept in each layer.

import { clear, formatNumber, h, s } from "./dom.js";
import {
  CLUSTER_COLOURS, KEPT_FILL, PRUNED_FILL, SAFETY_FILL, VIRIDIS, inkOn, nextId, replaceKeepingFocus, responsive, tooltip, viridis,
} from "./plot.js";

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
  const consensus = map.consensus || null;
  const modes = consensus ? [...MODES, ["consensus", "Consensus runs"]] : MODES;
  const id = nextId("heads");
  let mode = "kept";
  let active = null; // [layer, head]
  let cells = null; // rect elements, by key

  const figure = h("figure", { class: "chart heads" });
  const name = `${id}-mode`;
  const switcher = h("fieldset", { class: "modes" }, h("legend", {}, "Colour heads by"),
    modes.map(([value, label]) => h("label", {},
      h("input", { type: "radio", name, value, checked: value === mode, onchange: () => setMode(value) }), ` ${label}`)));
  const plot = h("div", { class: "plot" });
  const tip = tooltip(plot, `${id}-tip`);
  const legend = h("div", { class: "legend" });
  figure.append(
    h("figcaption", {}, h("strong", {}, "Head map. "),
      `${L} layers × ${H} heads, strategy ${map.strategy}, k* = ${map.k_star}. `,
      consensus ? `A consensus of ${consensus.runs} runs of CAHP (the full analysis and ${consensus.runs - 1} `
        + `leave-one-shard-out ones), which agreed at a mean Jaccard of ${formatNumber(consensus.mean_jaccard, 2)}. ` : null,
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
    if (mode === "consensus") return viridis(consensus.kept_frequency[l][hd]);
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
    if (consensus) {
      const share = consensus.kept_frequency[l][hd];
      lines.push(`Kept by ${Math.round(share * consensus.runs)} of ${consensus.runs} runs of CAHP`);
    }
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
    if (mode === "salience" || mode === "consensus") {
      const gradient = `${id}-ramp`;
      clear(legend,
        s("svg", { viewBox: "0 0 240 36", width: 240, height: 36, "aria-hidden": "true" },
          s("defs", {}, s("linearGradient", { id: gradient },
            VIRIDIS.map((colour, i) => s("stop", { offset: `${(100 * i) / (VIRIDIS.length - 1)}%`, "stop-color": colour })))),
          s("rect", { x: 4, y: 2, width: 232, height: 14, fill: `url(#${gradient})` }),
          ["0", "0.5", "1"].map((t, i) => s("text", { x: 4 + i * 116, y: 30, "text-anchor": ["start", "middle", "end"][i] }, t))),
        h("span", {}, mode === "salience" ? "salience (min–max normalised); outlined: kept heads"
          : `share of the ${consensus.runs} runs of CAHP that kept the head; outlined: kept by the consensus`));
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
    svg.addEventListener("blur", () => {
      if (svg.isConnected) hide(); // a redrawn-away SVG's blur must not hide its successor's tooltip
    });
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
    paint();
    replaceKeepingFocus(plot, svg, plot.querySelector(".tooltip"));
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
