"""``cahp prune``: the whole pipeline on one machine, from the command line, without the service.

The run's settings are one flag each, made from their declarations in the engine
(:data:`cahp_engine.config.SETTINGS`: flag, default, help, choices, how the text is read), so the
command, the library and the job API cannot disagree. The engine's torch code is imported only when
the command runs. Exit codes: ``OK``, ``USAGE`` for bad input (the message says what to change),
``FAILED`` for anything else (:class:`app.cli.exit_codes.ExitCode`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.cli.dataset_flags import add_dataset_flags, dataset_options_from_args
from app.cli.exit_codes import ExitCode
from cahp_engine.config import Options, PruningConfig, Setting, settings_for
from cahp_engine.data import DEFAULT_MAX_ROWS, DatasetOptions
from cahp_engine.errors import AccuracyBudgetError, CahpError, InvalidInputError, JobCancelledError
from cahp_engine.export import describe_speedup
from cahp_engine.models import DEFAULT_MAX_MODEL_PARAMS
from cahp_engine.progress import STAGE_SPAN, StagePlan, stage_plan

if TYPE_CHECKING:
    from cahp_engine.run import RunIdentity, RunReport

#: The ``--help`` sections of the settings, in order (a setting without a group is a general option).
GROUPS = ("selection", "fine-tuning", "accuracy budget", "speed target", "deployment")


def _argparse_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """``parse`` with its ValueError's message shown by argparse as it is."""

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return convert


def add_setting_flag(group: Any, setting: Setting) -> None:
    """The flag of one setting: its name, default, help and the reading of its text from the declaration."""
    options: dict[str, Any] = {"dest": setting.name, "default": setting.default}
    if isinstance(setting.rule, Options):
        options["choices"] = setting.rule.values
    elif setting.parse is not None:
        options["type"] = _argparse_type(setting.parse)
    else:
        options["type"] = setting.from_text  # int or float: argparse's own "invalid int value" message
    if setting.metavar:
        options["metavar"] = setting.metavar
    default = setting.default
    shown = ",".join(map(str, default)) if isinstance(default, tuple) else "%(default)s"
    group.add_argument(setting.flag, help=setting.help_with_default(shown), **options)


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
    p.add_argument("--name", type=_name, metavar="NAME",
                   help="what to call the pruned model: the model cards' title and report.json's identity.name "
                   "(default: the cards say `<base model> (CAHP-pruned, k/N heads)`)")
    p.add_argument("--label", action="append", type=_label, default=[], metavar="KEY=VALUE", dest="labels",
                   help="a label of the run, e.g. --label git/commit=$(git rev-parse --short HEAD) (repeatable; "
                   "the job service's label rules and limit): in report.json's identity and the model cards")
    p.add_argument("--max-model-params", type=int, default=DEFAULT_MAX_MODEL_PARAMS, metavar="N",
                   help="refuse a model with more parameters than this, counted from its config before it is "
                   "loaded (default %(default)s)")
    d = p.add_argument_group("dataset")
    add_dataset_flags(d)
    d.add_argument("--max-dataset-rows", type=int, default=DEFAULT_MAX_ROWS, metavar="N",
                   help="refuse a split with more rows than this, before reading it (default %(default)s)")
    groups = {name: p.add_argument_group(name) for name in GROUPS}
    for setting in settings_for("cli"):
        add_setting_flag(groups[setting.group] if setting.group else p, setting)
    p.add_argument("--json", action="store_true", help="print the report as JSON on stdout instead of a summary")
    p.set_defaults(func=run_command)
    return p


def _name(text: str) -> str:
    """``--name``: 1 to 200 characters, as a job's ``name``."""
    name = text.strip()
    if not name or len(name) > 200:
        raise argparse.ArgumentTypeError(f"must be 1 to 200 characters, got {len(name)}")
    return name


def _label(text: str) -> tuple[str, str]:
    """``--label KEY=VALUE``, checked by the rules of a job's labels."""
    from app.core.errors import InvalidRequestError  # not at import: client commands load no service code
    from app.core.labels import check_label

    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"takes KEY=VALUE, got {text[:80]!r}")
    try:
        check_label(key, value)
    except InvalidRequestError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return key, value


def identity_from_args(args: argparse.Namespace) -> RunIdentity:
    """The run's identity from ``--name`` and ``--label`` (a later ``--label`` of a key wins)."""
    from app.core.errors import InvalidRequestError
    from app.core.labels import check_labels
    from cahp_engine.run import RunIdentity

    try:
        labels = check_labels(dict(args.labels))
    except InvalidRequestError as exc:
        raise InvalidInputError(f"--label: {exc}") from None
    return RunIdentity(name=args.name, labels=labels)


def config_from_args(args: argparse.Namespace) -> tuple[PruningConfig, DatasetOptions]:
    """Build the validated settings from parsed arguments (raises InvalidInputError subclasses)."""
    config = PruningConfig(**{setting.name: getattr(args, setting.name) for setting in settings_for("cli")})
    options = dataset_options_from_args(args)
    return config, options


class _Bars:
    """One tqdm bar per stage on stderr when it is a terminal; one line per stage otherwise."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.spans = STAGE_SPAN
        self.tty = sys.stderr.isatty()
        self.stage: str | None = None
        self.bar: Any = None
        self.quarter = 0

    def __call__(self, stage: str, overall: float) -> None:
        if not self.enabled:
            return
        from tqdm import tqdm

        lo, hi = self.spans.get(stage, (0.0, 1.0))
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

    def replan(self, plan: StagePlan) -> None:
        """The spans the run places its stages in once its rows are known (the engine's ``plan`` hook)."""
        self.spans = plan.spans

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def run_command(args: argparse.Namespace) -> int:
    """Run ``cahp prune``; returns the exit code."""
    from cahp_engine.run import RunHooks, RunRequest, run_pruning

    bars = _Bars(enabled=not args.json)
    try:
        config, options = config_from_args(args)
        identity = identity_from_args(args)
        bars.spans = stage_plan(config).spans  # the spans run_pruning places this run's stages in
        request = RunRequest(
            model_ref=args.model, dataset_ref=args.dataset, output_dir=args.output, config=config,
            dataset_options=options, identity=identity, revision=args.revision, overwrite=args.overwrite,
            max_dataset_rows=args.max_dataset_rows, max_model_params=args.max_model_params,
        )
        report = run_pruning(request, RunHooks(
            progress=bars, plan=bars.replan,
            log=None if args.json else (lambda line: print(f"[cahp] {line}", file=sys.stderr)),
        ))
    except InvalidInputError as exc:
        bars.close()
        print(f"cahp prune: error: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    except JobCancelledError as exc:
        bars.close()
        print(f"cahp prune: {exc}", file=sys.stderr)
        return ExitCode.FAILED
    except AccuracyBudgetError as exc:
        bars.close()
        print(f"cahp prune: failed ({exc.code}): {exc}", file=sys.stderr)
        print(f"cahp prune: the candidates' report and plots are in {args.output} (report.json has "
              '"status": "failed")', file=sys.stderr)
        return ExitCode.FAILED
    except CahpError as exc:
        bars.close()
        print(f"cahp prune: failed ({exc.code}): {exc}", file=sys.stderr)
        return ExitCode.FAILED
    except KeyboardInterrupt:
        bars.close()
        print("cahp prune: interrupted; nothing was written to the output directory", file=sys.stderr)
        return ExitCode.FAILED
    bars.close()
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(format_summary(report, args.output))
    return ExitCode.OK


def format_summary(report: RunReport, output: Path) -> str:
    """The one-screen summary printed at the end of ``cahp prune``."""
    s, sel, m, speed = report.summary, report.selection, report.metrics, report.speed
    lines = [
        f"CAHP ({sel.strategy}) on {report.model.ref} — {report.dataset.ref}",
        (f"  k* = {s.k_star} ("
         + ("chosen by the accuracy budget" if report.budget is not None else f"polynomial degree {sel.poly_degree}")
         if report.target is None else f"  {s.k_star} heads chosen within the target's per-layer counts (")
        + ("; knees by degree: " if report.target is None else "the knees, not used: ")
        + ", ".join(f"d{d}={k}" for d, k in sel.knees_by_degree.items()) + ")",
        f"  heads kept: {s.heads_kept} of {s.heads_total} ({s.retention:.1%})",
    ]
    ident = report.identity
    if ident is not None and (ident.name or ident.labels):
        named = [f"name: {ident.name}"] if ident.name else []
        named += [f"labels: {' '.join(f'{k}={v}' for k, v in sorted(ident.labels.items()))}"] if ident.labels else []
        lines.insert(1, "  " + "; ".join(named))
    for layer, heads in sel.kept.items():
        lines.append(f"    layer {layer:>2}: {len(heads):>2} kept  {list(heads)}")
    for what, record in (("signature", sel.signature_sampling), ("calibration", sel.calibration_sampling)):
        if record is not None:
            lines.append(f"  {what} samples: {record.samples} of {record.available} ({record.reason})")
    if sel.stability is not None:
        lines.append(f"  stability: mean Jaccard {sel.stability.mean_jaccard:.2f} of the kept heads over "
                     f"{sel.stability.shards} leave-one-shard-out selections (k* {list(sel.stability.k_stars)})")
    lines += [
        f"  accuracy (eval split '{report.dataset.eval_split}'): dense {m.dense.accuracy:.4f}, "
        f"pruned before recovery {m.pruned_before_recovery.accuracy:.4f}, "
        f"after recovery {m.pruned.accuracy:.4f}",
        f"  macro-F1: dense {m.dense.macro_f1:.4f}, pruned {m.pruned.macro_f1:.4f}",
        *_recovery_lines(report),
        f"  parameters: {report.parameters.dense.total:,} -> {report.parameters.pruned.total:,}",
    ]
    for row in speed.results:
        lines.append(
            f"  latency batch {row.batch_size:>2} x {speed.seq_len} tokens on {speed.device}: "
            f"p50 {row.dense.p50_ms:.2f} ms -> {row.pruned.p50_ms:.2f} ms "
            f"({describe_speedup(row.speedup, row.speedup_low, row.speedup_high)})"
        )
    lines += _budget_lines(report)
    if report.target is not None:
        lines += ["  " + report.target.headline(), *("    " + line for line in report.target.layer_lines())]
    lines += _export_lines(report)
    lines.append(f"  wall time {report.wall_time_s:.1f} s; artifacts in {output}")
    flagged = report.quality.messages if report.quality is not None else ()
    for warning in report.warnings:
        lines.append(f"  {'QUALITY WARNING' if warning in flagged else 'warning'}: {warning}")
    return "\n".join(lines)


def _recovery_lines(report: RunReport) -> list[str]:
    """The recovery's recipe, and what it kept of its validation curve."""
    r = report.recovery
    how = f"distillation (alpha {r.alpha:g}, T {r.temperature:g})" if r.loss == "distill" else "cross-entropy"
    if r.class_weights is not None:
        how += ", class-balanced"
    lines = [f"  recovery: {r.epochs:g} epochs, {how}, {r.wall_s:.1f} s"]
    v = report.validation
    if v is None or not r.validation or r.best_epoch is None:
        return lines
    where = f"{v.rows} rows carved from '{v.split}'" if v.carved else f"split '{v.split}', {v.rows} rows"
    dense = v.dense.accuracy if v.metric == "accuracy" else v.dense.macro_f1
    curve = ", ".join(f"{p.epoch:g}: {p.score:.4f}" + ("*" if p.step == r.best_step else "") for p in r.validation)
    lines.append(f"  validation {v.metric} ({where}; dense {dense:.4f}) by epoch: {curve}")
    end = (f"stopped early: {r.early_stopping_patience} evaluation(s) without gain" if r.stopped_early
           else "trained every epoch")
    lines.append(f"    kept the weights of epoch {r.best_epoch:g} (*); {end}")
    return lines


def _budget_lines(report: RunReport) -> list[str]:
    """What the summary says of an accuracy budget's search."""
    b = report.budget
    if b is None:
        return []
    where = f"{b.validation_rows} rows carved from '{b.split}'" if b.carved else f"split '{b.split}'"
    strict = "" if b.confidence is None else f", upper bound at {b.confidence:g} within P"
    lines = [f"  accuracy budget: validation {b.metric} within {b.max_accuracy_drop:g} points of the dense "
             f"{b.dense_validation:.4f} (>= {b.threshold:.4f}{strict}) on {where}; strategies "
             f"{', '.join(b.strategies)}; "
             + (f"the fastest of speed targets {list(b.targets)}" if b.objective == "speed"
                else f"head counts {list(b.ladder)}")]
    for c in b.candidates:
        best = c.accuracy_best if b.metric == "accuracy" else c.macro_f1_best
        speed = "" if c.target_speedup is None else f"target x{c.target_speedup:g} "
        lines.append(f"    round {c.round}: {speed}{c.heads_kept:>4} heads {c.strategy:<10} best {best:.4f} after "
                     f"{c.epochs:g} epoch(s), drop {c.drop.drop:+.2f} points (95 % {c.drop.low:+.2f} to "
                     f"{c.drop.high:+.2f}): {c.stopped}" + ("  <- chosen" if c.chosen else ""))
    if b.skipped:
        lines.append(f"    {len(b.skipped)} more not scored by the search (report.json: budget.skipped, with why)")
    if b.chosen_target is not None:
        lines.append(f"    chosen: target x{b.chosen_target:g}, {b.chosen} heads (the speed target record below)")
    elif b.chosen is not None:
        margin = "" if b.strategy_margin is None else (
            f", {b.strategy_margin:+.2f} points against the other strategies at that head count")
        lines.append(f"    chosen: {b.chosen} heads by {b.chosen_strategy}{margin}")
    if b.cost_vs_single_run is not None and b.epochs_trained == 0:
        lines.append(f"    {len(b.candidates)} candidates scored after reconstruction, none fine-tuned; search "
                     f"{b.search_seconds:.1f} s = x{b.cost_vs_single_run:.2f} one candidate's reconstruction and "
                     "scoring (a single run's recovery)")
    elif b.cost_vs_single_run is not None:
        lines.append(f"    {len(b.candidates)} candidates, {b.epochs_trained:g} recovery epochs in all; search "
                     f"{b.search_seconds:.1f} s + the chosen one's last epochs {b.final_recovery_seconds:.1f} s "
                     f"= x{b.cost_vs_single_run:.2f} a single run's recovery")
    return lines


def _export_lines(report: RunReport) -> list[str]:
    """What the summary says of ``onnx/`` and ``onnx-int8/``."""
    export, s = report.export, report.summary
    if export.onnx is None:
        return ["  ONNX export: off (--export none)"]
    accuracy = f"accuracy {s.onnx_accuracy:.4f}; " if s.onnx_accuracy is not None else ""
    lines = [f"  ONNX (onnx/): {accuracy}max |logit difference| from PyTorch {s.onnx_max_abs_diff:.2e}"
             + (f"; onnxruntime {describe_speedup(s.onnx_speedup, s.onnx_speedup_low, s.onnx_speedup_high)} "
                "against dense PyTorch (CPU, batch 32)" if s.onnx_speedup else "")]
    if export.onnx_int8 is not None:
        accuracy = f"accuracy {s.int8_accuracy:.4f}" if s.int8_accuracy is not None else "accuracy not measured"
        deviation = f"; max |logit difference| {s.int8_max_abs_diff:.2g}" if s.int8_max_abs_diff is not None else ""
        lines.append(f"  int8 (onnx-int8/): {accuracy}{deviation}"
                     + (f"; {describe_speedup(s.int8_speedup, s.int8_speedup_low, s.int8_speedup_high)} against "
                        "dense PyTorch (CPU, batch 32)" if s.int8_speedup else ""))
    return lines
