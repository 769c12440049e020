"""``cahp export``: a checked ONNX (or int8 ONNX) directory from a pruned checkpoint, without the service.

The graph's logits must match PyTorch's within 1e-4 on the dataset's evaluation rows (``--data``) or on
generated token ids, or nothing is written (``export_parity_failed``, exit ``FAILED``). The engine's
torch and onnx code is imported only when the command runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.cli.dataset_flags import add_dataset_flags, dataset_options_from_args
from app.cli.exit_codes import ExitCode
from cahp_engine.errors import CahpError, InvalidInputError
from cahp_engine.models import DEFAULT_MAX_MODEL_PARAMS

if TYPE_CHECKING:
    from cahp_engine.export import CheckpointExport

#: The formats ``--format`` accepts (kept equal to ``cahp_engine.export._from_checkpoint.EXPORT_FORMATS`` by a test).
EXPORT_FORMATS = ("onnx", "onnx-int8")


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``export`` subcommand to an ``argparse`` subparsers object."""
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
    add_dataset_flags(p.add_argument_group("dataset"))
    p.add_argument("--max-model-params", type=int, default=DEFAULT_MAX_MODEL_PARAMS, metavar="N",
                   help="refuse a checkpoint whose architecture (before pruning) has more parameters than this, "
                   "counted from its config before it is loaded (default %(default)s)")
    p.add_argument("--samples", type=int, default=64, help="samples compared for parity (default 64)")
    p.add_argument("--seed", type=int, default=0, help="seeds the random token ids compared without --data "
                   "(default %(default)s)")
    p.add_argument("--latency-repeats", type=int, default=20, help="timed passes per runtime and batch size; "
                   "0 skips timing")
    p.add_argument("--json", action="store_true", help="print the result as JSON on stdout instead of a summary")
    p.set_defaults(func=export_command)
    return p


def export_command(args: argparse.Namespace) -> int:
    """Run ``cahp export``; returns the exit code (as ``cahp prune``'s)."""
    from cahp_engine.export import export_checkpoint

    try:
        options = dataset_options_from_args(args)
        result = export_checkpoint(
            args.checkpoint, args.output, fmt=args.format, dataset=args.data, dataset_options=options,
            overwrite=args.overwrite, samples=args.samples, seed=args.seed, latency_repeats=args.latency_repeats,
            max_model_params=args.max_model_params,
            log=None if args.json else (lambda line: print(f"[cahp] {line}", file=sys.stderr)),
        )
    except InvalidInputError as exc:
        print(f"cahp export: error: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    except CahpError as exc:
        print(f"cahp export: failed ({exc.code}): {exc}", file=sys.stderr)
        return ExitCode.FAILED
    except KeyboardInterrupt:
        print("cahp export: interrupted; nothing was written to the output directory", file=sys.stderr)
        return ExitCode.FAILED
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(format_export_summary(result))
    return ExitCode.OK


def format_export_summary(result: CheckpointExport) -> str:
    """The summary printed at the end of ``cahp export``, from its typed result."""
    onnx, parity = result.onnx, result.parity
    lines = [
        f"{result.format} export of {result.checkpoint} ({result.family}, heads per layer "
        f"{list(result.heads_per_layer)}) -> {result.output}",
        f"  inputs {', '.join(onnx.inputs)}; output logits; opset {onnx.opset}; dynamic batch_size and "
        "sequence_length",
        f"  parity: max |logit difference| {parity.max_abs_diff:.2e} on {parity.samples} {parity.source} "
        f"samples, padded right and left (threshold {parity.threshold:.0e})",
    ]
    int8 = result.int8
    if int8 is not None:
        lines.append(f"  int8: {int8.quantized_nodes} quantized products, {int8.size_bytes / 2**20:.1f} MiB "
                     f"(fp32 {int8.fp32_size_bytes / 2**20:.1f} MiB)")
        if int8.deviation is not None:
            dev = int8.deviation
            lines.append(f"  int8 vs PyTorch: max |logit difference| {dev.max_abs_diff:.3g}, same class on "
                         f"{dev.prediction_agreement:.1%} of runs")
    if result.accuracy:
        figures = ", ".join(f"{name} {m.accuracy:.4f}" for name, m in result.accuracy.items())
        lines.append(f"  accuracy on split '{result.eval_split}': {figures}")
    speed = result.speed
    if speed is not None:
        for row in speed.results:
            cells = ", ".join(
                f"{name} {lat.p50_ms:.2f} ms" + ("" if name == speed.baseline else f" (x{row.speedup[name]:.2f})")
                for name, lat in row.latency.items()
            )
            lines.append(f"  latency batch {row.batch_size:>2} x {speed.seq_len} tokens, CPU, "
                         f"{speed.threads} thread(s): {cells}")
    lines.append(f"  wall time {result.wall_s:.1f} s")
    return "\n".join(lines)
