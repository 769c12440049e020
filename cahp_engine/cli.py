"""``cahp prune``: the whole pipeline on one machine, from the command line; ``cahp export``: a
checked ONNX directory from a pruned checkpoint.

Exit codes: 0 success, 2 bad input (the message says what to change), 1 anything else.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from cahp_engine.config import PruningConfig
from cahp_engine.datasets_io import DatasetOptions
from cahp_engine.errors import CahpError, InvalidInputError, JobCancelledError

EXIT_OK, EXIT_ERROR, EXIT_BAD_INPUT = 0, 1, 2


def _fraction_or_count(text: str) -> int | float:
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a count like 2000 or a fraction like 0.5, got {text!r}") from None


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``prune`` (returned) and ``export`` subcommands to an ``argparse`` subparsers object."""
    p = subparsers.add_parser(
        "prune",
        help="prune the attention heads of a fine-tuned encoder classifier with CAHP",
        description="Select heads with CAHP, remove the others, fine-tune briefly, and write the pruned "
        "checkpoint, the MSS curve, the head map and a report to --output.",
    )
    p.add_argument("model", help="a local model directory or a Hugging Face hub id")
    p.add_argument("dataset", help="a directory of {split}.csv|.jsonl|.parquet files, a datasets save_to_disk "
                   "directory, or a hub dataset id")
    p.add_argument("--output", "-o", required=True, type=Path, help="directory for the artifacts")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty --output when the run succeeds")
    p.add_argument("--revision", help="hub revision of the model")
    d = p.add_argument_group("dataset")
    d.add_argument("--text-column", default="text")
    d.add_argument("--text-pair-column", default=None, help="second text of sentence-pair tasks (e.g. MNLI)")
    d.add_argument("--label-column", default="label")
    d.add_argument("--train-split", default="train")
    d.add_argument("--eval-split", default=None, help="default: the first of test, validation, dev")
    s = p.add_argument_group("selection")
    s.add_argument("--poly-degree", type=int, default=2, help="Kneedle polynomial degree (default 2)")
    s.add_argument("--heads-to-keep", type=int, default=None, help="fix the number of clusters; skips the knee")
    s.add_argument("--resolution", type=int, default=None, help="side B of the resized maps (default: 70th "
                   "percentile of training lengths)")
    s.add_argument("--calibration-fraction", type=float, default=0.25)
    s.add_argument("--signature-samples", type=_fraction_or_count, default=None, help="count or fraction "
                   "(default: the whole training split)")
    s.add_argument("--strategy", choices=("cahp", "salience", "random"), default="cahp")
    t = p.add_argument_group("fine-tuning")
    t.add_argument("--epochs", type=float, default=3.0, help="recovery epochs (default 3)")
    t.add_argument("--lr", type=float, default=2e-5, help="recovery learning rate (default 2e-5)")
    t.add_argument("--batch-size", type=int, default=32)
    t.add_argument("--dense-finetune", choices=("auto", "always", "never"), default="auto")
    t.add_argument("--dense-epochs", type=float, default=3.0)
    t.add_argument("--dense-lr", type=float, default=5e-5)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--latency-repeats", type=int, default=20)
    p.add_argument("--json", action="store_true", help="print the report as JSON on stdout instead of a summary")
    p.set_defaults(func=run_command)
    register_export(subparsers)
    return p


def config_from_args(args: argparse.Namespace) -> tuple[PruningConfig, DatasetOptions]:
    """Build the validated settings from parsed arguments (raises InvalidInputError subclasses)."""
    config = PruningConfig(
        poly_degree=args.poly_degree, heads_to_keep=args.heads_to_keep, resolution=args.resolution,
        calibration_fraction=args.calibration_fraction, signature_samples=args.signature_samples,
        strategy=args.strategy, seed=args.seed, batch_size=args.batch_size, epochs=args.epochs, lr=args.lr,
        dense_finetune=args.dense_finetune, dense_epochs=args.dense_epochs, dense_lr=args.dense_lr,
        device=args.device, latency_repeats=args.latency_repeats,
    )
    options = DatasetOptions(
        text_column=args.text_column, text_pair_column=args.text_pair_column, label_column=args.label_column,
        train_split=args.train_split, eval_split=args.eval_split,
    )
    return config, options


class _Bars:
    """One tqdm bar per stage on stderr when it is a terminal; one line per stage otherwise."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.tty = sys.stderr.isatty()
        self.stage: str | None = None
        self.bar: Any = None
        self.quarter = 0

    def __call__(self, stage: str, overall: float) -> None:
        if not self.enabled:
            return
        from tqdm import tqdm

        from cahp_engine.run import _STAGE_SPAN

        lo, hi = _STAGE_SPAN.get(stage, (0.0, 1.0))
        within = min(1.0, max(0.0, (overall - lo) / (hi - lo) if hi > lo else 1.0))
        if stage != self.stage:
            self.close()
            self.stage = stage
            self.quarter = 0
            if not self.tty:
                print(f"[cahp] stage {stage} ({overall:.0%} of the run done)", file=sys.stderr)
                return
            self.bar = tqdm(total=1000, desc=f"{stage:>16}", file=sys.stderr, leave=True,
                            bar_format="{desc} |{bar}| {percentage:3.0f}% {elapsed}")
        if self.bar is None:
            # Not a terminal: a line at each quarter of a stage instead of a redrawn bar.
            if int(within * 4) > self.quarter and within < 1.0:
                self.quarter = int(within * 4)
                print(f"[cahp] stage {stage}: {within:.0%}", file=sys.stderr)
            return
        self.bar.n = int(1000 * within)
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def run_command(args: argparse.Namespace) -> int:
    """Run ``cahp prune``; returns the exit code."""
    from cahp_engine.run import run_pruning

    bars = _Bars(enabled=not args.json)
    try:
        config, options = config_from_args(args)
        report = run_pruning(
            args.model, args.dataset, args.output, config, dataset_options=options, revision=args.revision,
            overwrite=args.overwrite, progress=bars,
            log=None if args.json else (lambda line: print(f"[cahp] {line}", file=sys.stderr)),
        )
    except InvalidInputError as exc:
        bars.close()
        print(f"cahp prune: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except JobCancelledError as exc:
        bars.close()
        print(f"cahp prune: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except CahpError as exc:
        bars.close()
        print(f"cahp prune: failed ({exc.code}): {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        bars.close()
        print("cahp prune: interrupted; nothing was written to the output directory", file=sys.stderr)
        return EXIT_ERROR
    bars.close()
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(format_summary(report, args.output))
    return EXIT_OK


def format_summary(report: dict[str, Any], output: Path) -> str:
    """The one-screen summary printed at the end of ``cahp prune``."""
    s = report["summary"]
    sel = report["selection"]
    m = report["metrics"]
    lines = [
        f"CAHP ({sel['strategy']}) on {report['model']['ref']} — {report['dataset']['ref']}",
        f"  k* = {s['k_star']} (polynomial degree {sel['poly_degree']}; knees by degree: "
        + ", ".join(f"d{d}={k}" for d, k in sel["knees_by_degree"].items()) + ")",
        f"  heads kept: {s['heads_kept']} of {s['heads_total']} ({s['retention']:.1%})",
    ]
    for layer, heads in sel["kept"].items():
        lines.append(f"    layer {int(layer):>2}: {len(heads):>2} kept  {heads}")
    lines += [
        f"  accuracy (eval split '{report['dataset']['eval_split']}'): dense {m['dense']['accuracy']:.4f}, "
        f"pruned before recovery {m['pruned_before_recovery']['accuracy']:.4f}, "
        f"after recovery {m['pruned']['accuracy']:.4f}",
        f"  macro-F1: dense {m['dense']['macro_f1']:.4f}, pruned {m['pruned']['macro_f1']:.4f}",
        f"  parameters: {report['parameters']['dense']['total']:,} -> {report['parameters']['pruned']['total']:,}",
    ]
    for row in report["speed"]["results"]:
        lines.append(
            f"  latency batch {row['batch_size']:>2} x {report['speed']['seq_len']} tokens on {report['device']}: "
            f"p50 {row['dense']['p50_ms']:.2f} ms -> {row['pruned']['p50_ms']:.2f} ms (x{row['speedup']:.2f})"
        )
    lines.append(f"  wall time {report['wall_time_s']:.1f} s; artifacts in {output}")
    for warning in report.get("warnings", []):
        lines.append(f"  warning: {warning}")
    return "\n".join(lines)


def register_export(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``export`` subcommand to an ``argparse`` subparsers object."""
    from cahp_engine.export_checkpoint import EXPORT_FORMATS

    p = subparsers.add_parser(
        "export",
        help="export a pruned checkpoint to ONNX (optionally int8), checked against PyTorch",
        description="Write PRUNED_DIR as an ONNX directory (model.onnx, config.json, tokenizer files, README.md) "
        "that onnxruntime loads without cahp. The graph's logits must match PyTorch's within 1e-4 on the "
        "dataset's evaluation rows (--data) or on random token ids; otherwise nothing is written.",
    )
    p.add_argument("checkpoint", metavar="PRUNED_DIR", help="a directory written by cahp prune (its model/) or "
                   "save_pruned")
    p.add_argument("--format", choices=EXPORT_FORMATS, default="onnx", help="onnx (float32, default) or onnx-int8 "
                   "(dynamic int8 quantization)")
    p.add_argument("--output", "-o", required=True, type=Path, help="directory to write")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty --output when the export succeeds")
    p.add_argument("--data", metavar="DATASET", default=None, help="dataset whose evaluation split gives the parity "
                   "rows and the accuracies (same forms as for prune)")
    d = p.add_argument_group("dataset")
    d.add_argument("--text-column", default="text")
    d.add_argument("--text-pair-column", default=None)
    d.add_argument("--label-column", default="label")
    d.add_argument("--train-split", default="train")
    d.add_argument("--eval-split", default=None, help="default: the first of test, validation, dev")
    p.add_argument("--samples", type=int, default=64, help="samples compared for parity (default 64)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--latency-repeats", type=int, default=20, help="timed passes per runtime and batch size; "
                   "0 skips timing")
    p.add_argument("--json", action="store_true", help="print the result as JSON on stdout instead of a summary")
    p.set_defaults(func=export_command)
    return p


def export_command(args: argparse.Namespace) -> int:
    """Run ``cahp export``; returns the exit code (as ``cahp prune``'s)."""
    from cahp_engine.export_checkpoint import export_checkpoint

    try:
        options = DatasetOptions(
            text_column=args.text_column, text_pair_column=args.text_pair_column, label_column=args.label_column,
            train_split=args.train_split, eval_split=args.eval_split,
        )
        result = export_checkpoint(
            args.checkpoint, args.output, fmt=args.format, dataset=args.data, dataset_options=options,
            overwrite=args.overwrite, samples=args.samples, seed=args.seed, latency_repeats=args.latency_repeats,
            log=None if args.json else (lambda line: print(f"[cahp] {line}", file=sys.stderr)),
        )
    except InvalidInputError as exc:
        print(f"cahp export: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except CahpError as exc:
        print(f"cahp export: failed ({exc.code}): {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("cahp export: interrupted; nothing was written to the output directory", file=sys.stderr)
        return EXIT_ERROR
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(format_export_summary(result.to_dict()))
    return EXIT_OK


def format_export_summary(result: dict[str, Any]) -> str:
    """The summary printed at the end of ``cahp export``, from ``CheckpointExport.to_dict()``."""
    onnx, parity = result["onnx"], result["parity"]
    lines = [
        f"{result['format']} export of {result['checkpoint']} ({result['family']}, heads per layer "
        f"{result['heads_per_layer']}) -> {result['output']}",
        f"  inputs {', '.join(onnx['inputs'])}; output logits; opset {onnx['opset']}; dynamic batch_size and "
        "sequence_length",
        f"  parity: max |logit difference| {parity['max_abs_diff']:.2e} on {parity['samples']} {parity['source']} "
        f"samples, padded right and left (threshold {parity['threshold']:.0e})",
    ]
    int8 = result.get("int8")
    if int8:
        lines.append(f"  int8: {int8['quantized_nodes']} quantized products, {int8['size_bytes'] / 2**20:.1f} MiB "
                     f"(fp32 {int8['fp32_size_bytes'] / 2**20:.1f} MiB)")
        if int8.get("deviation"):
            dev = int8["deviation"]
            lines.append(f"  int8 vs PyTorch: max |logit difference| {dev['max_abs_diff']:.3g}, same class on "
                         f"{dev['prediction_agreement']:.1%} of runs")
    if result.get("accuracy"):
        figures = ", ".join(f"{name} {m['accuracy']:.4f}" for name, m in result["accuracy"].items())
        lines.append(f"  accuracy on split '{result['eval_split']}': {figures}")
    speed = result.get("speed")
    if speed:
        for row in speed["results"]:
            cells = ", ".join(
                f"{name} {lat['p50_ms']:.2f} ms"
                + ("" if name == speed["baseline"] else f" (x{row['speedup'][name]:.2f})")
                for name, lat in row["latency"].items()
            )
            lines.append(f"  latency batch {row['batch_size']:>2} x {speed['seq_len']} tokens, CPU, "
                         f"{speed['threads']} thread(s): {cells}")
    lines.append(f"  wall time {result['wall_s']:.1f} s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry point (``python -m cahp_engine``) with the ``prune`` and ``export`` commands."""
    parser = argparse.ArgumentParser(prog="cahp")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    args = parser.parse_args(argv)
    return int(args.func(args))
