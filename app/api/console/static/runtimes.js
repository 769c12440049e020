// The run's one speed measurement as a deployer reads it: the median latency of every runtime it timed
// (dense and pruned PyTorch, and onnxruntime's graphs when the run exported them), against dense PyTorch,
// at each batch size (report.json's export.speed).

import { formatNumber, formatSpeedup, h } from "./dom.js";

// What the engine calls each timed candidate (cahp_engine/run/_deploy.py), in words.
const RUNTIMES = {
  torch_dense: "PyTorch, dense",
  torch_pruned: "PyTorch, pruned",
  onnx_dense: "onnxruntime, dense",
  onnx_pruned: "onnxruntime, pruned",
  onnx_int8_pruned: "onnxruntime int8, pruned",
};

/**
 * One row per batch size and runtime: its median (p50) latency and its speed-up over the baseline.
 *
 * @param {object} speed report.json's `export.speed`
 */
export function latencyTable(speed) {
  const baseline = RUNTIMES[speed.baseline] || speed.baseline;
  const rows = [];
  for (const result of speed.results || []) {
    for (const name of Object.keys(speed.runtimes || result.latency || {})) {
      const latency = result.latency?.[name];
      if (!latency) continue;
      const against = name === speed.baseline ? "the baseline"
        : formatSpeedup(result.speedup?.[name], result.speedup_low?.[name], result.speedup_high?.[name]);
      rows.push(h("tr", { dataset: { runtime: name, batch: String(result.batch_size) } },
        h("th", { scope: "row", "data-label": "Runtime" }, RUNTIMES[name] || name),
        h("td", { "data-label": "Batch" }, String(result.batch_size)),
        h("td", { "data-label": "Median" }, `${formatNumber(latency.p50_ms, 2)} ms`),
        h("td", { "data-label": "Speed-up" }, against)));
    }
  }
  return h("div", { class: "latency" },
    h("p", { class: "muted" }, `Speed-ups against ${baseline}; ${speed.device}, sequence length ${speed.seq_len}, `
      + `${speed.threads} ${speed.threads === 1 ? "thread" : "threads"}; every runtime timed in the same interleaved `
      + `rounds (${speed.repeats} repeats).`),
    h("table", { class: "latency-table" },
      h("thead", {}, h("tr", {}, ["Runtime", "Batch", "Median", `Speed-up against ${baseline}`].map((name) => h("th", { scope: "col" }, name)))),
      h("tbody", {}, rows)));
}
