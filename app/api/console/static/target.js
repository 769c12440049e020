// A speed or FLOPs target's record (the job's `target`, or report.json's): what it asked, predicted and
// measured, and the heads and neurons each layer kept, as a table and as a map beside the head map.
// The job page shows it from the job's state as soon as the run has decided it, and from the report
// once the job has ended.

import { clear, formatNumber, formatPercent, h, s } from "./dom.js";
import { KEPT_FILL, VIRIDIS, responsive, textWidth } from "./plot.js";

// Neurons in a hue of their own: the head map beside uses the kept heads' and layer safety's.
const NEURON_FILL = VIRIDIS[3];

/**
 * The target's headline and its table of heads and neurons per layer.
 *
 * @param {object} target a TargetRecord (the job's `target`, or report.json's)
 * @param {{source: string, note?: string}} options `source`: "job" (decided, the run goes on) or "report"
 */
export function targetSection(target, { source, note = "" }) {
  const asked = target.kind === "flops" ? `${formatPercent(target.target)} of the FLOPs`
    : `×${formatNumber(target.target, 2)} on ${target.runtime}`;
  const measured = target.measured_speedup === null || target.measured_speedup === undefined
    ? "not timed (a FLOPs target)" : `measured ×${formatNumber(target.measured_speedup, 2)}`;
  const latency = target.dense_ms === null || target.dense_ms === undefined ? ""
    : ` (median ${formatNumber(target.dense_ms, 2)} ms dense → ${formatNumber(target.pruned_ms, 2)} ms pruned on ${target.runtime})`;
  const headline = h("p", {}, `Target ${asked} at batch ${target.batch_size} × ${target.seq_len} tokens: predicted `
    + `×${formatNumber(target.predicted_speedup, 2)}, ${measured}${latency}; FLOPs kept ${formatPercent(target.flops_kept, 1)} `
    + `(reachable ×${formatNumber(target.reachable_speedup, 2)}).`);
  const rows = target.heads_per_layer.map((heads, layer) => h("tr", { dataset: { layer: String(layer) } },
    h("th", { scope: "row", "data-label": "Layer" }, String(layer)),
    h("td", { "data-label": "Heads" }, `${heads} of ${target.heads_total}`),
    h("td", { "data-label": "Neurons" }, `${target.neurons_per_layer[layer]} of ${target.neurons_total}`)));
  return h("div", { class: "target", dataset: { source } },
    note ? h("p", { class: "target-note muted" }, note) : null,
    headline, h("table", { class: "target-layers" },
      h("thead", {}, h("tr", {}, ["Layer", "Heads", "Neurons"].map((name) => h("th", { scope: "col" }, name)))),
      h("tbody", {}, rows)));
}

/**
 * Heads and feed-forward neurons kept in each layer, two bars a layer: the map drawn beside the head
 * map for a run that cut neurons (the console's layer_units.png).
 *
 * @param {object} target a TargetRecord
 * @returns {{element: HTMLElement, destroy: function()}}
 */
export function layerUnits(target) {
  const heads = target.heads_per_layer;
  const neurons = target.neurons_per_layer;
  const L = heads.length;
  const figure = h("figure", { class: "chart units" });
  const plot = h("div", { class: "plot" });
  figure.append(h("figcaption", {}, h("strong", {}, "Heads and neurons. "),
    `Kept in each layer, of ${target.heads_total} heads and ${target.neurons_total} feed-forward neurons.`), plot);
  const label = heads.map((n, l) => `layer ${l}: ${n} of ${target.heads_total} heads, `
    + `${neurons[l]} of ${target.neurons_total} neurons`).join("; ");
  const counts = heads.flatMap((n, l) => [`${n} heads`, `${neurons[l]} neurons`]);
  const draw = (width) => {
    const left = 56;
    // Room right of the bars for the longest count, as wide as the page's font draws it: BERT-base's
    // "3072 neurons" is wider than a fixed margin at a phone's 390 px.
    const right = 12 + Math.max(...counts.map((text) => textWidth(text, 12)));
    const bar = 12;
    const rowHeight = 2 * bar + 10;
    const height = L * rowHeight + 6;
    const span = Math.min(width, 560) - left - right;
    const svg = s("svg", { viewBox: `0 0 ${width} ${height}`, width, height, role: "img", "aria-label": label });
    heads.forEach((n, l) => {
      const y = 4 + l * rowHeight;
      const bars = [[n, target.heads_total, "heads", KEPT_FILL], [neurons[l], target.neurons_total, "neurons", NEURON_FILL]];
      svg.append(s("text", { x: left - 8, y: y + bar, "text-anchor": "end", "dominant-baseline": "middle" }, `layer ${l}`));
      bars.forEach(([kept, total, what, fill], i) => {
        const by = y + i * (bar + 2);
        svg.append(
          s("rect", { x: left, y: by, width: span, height: bar, class: "track" }),
          s("rect", { x: left, y: by, width: total ? (kept / total) * span : 0, height: bar, class: "bar", fill,
                      dataset: { layer: l, unit: what } }),
          s("text", { x: left + span + 8, y: by + bar / 2, "dominant-baseline": "middle", class: "unit-text" },
            `${kept} ${what}`));
      });
    });
    clear(plot, svg);
  };
  const stop = responsive(plot, draw);
  return { element: figure, destroy: stop };
}
