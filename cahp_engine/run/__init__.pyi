"""A whole pruning run: the steps in order, the accuracy budget, the typed report, plots and artifacts.

Reading order: ``_request`` and ``_hooks`` (what a run is asked, what it reports back) -> ``_run``
(``run_pruning``: the stages in order) -> ``_steps`` (load, dense fine-tune, select, prune, recover,
evaluate) -> ``_resume`` and ``_live`` (resuming an earlier run's stages; the log of long stages)
-> ``_holdout`` (the validation split recovery judges on) -> ``_candidates`` (one candidate of an
accuracy budget, recovered) -> ``_executors`` and ``_candidate_inputs`` (who runs the candidates; their
inputs rebuilt in a pool's worker) -> ``_budget`` (the budget's search instead of a knee; ``_judged`` and
``_scoring`` when it is judged after reconstruction; ``_fastest`` for the fastest model within it) -> ``_deploy``
(ONNX, int8, cards) -> ``_artifacts`` and ``_plots`` (the files) -> ``_records`` (the report's records;
a missed budget's report) -> ``_identity`` and ``_quality`` (what the model is, how it was made,
whether it is broken) -> ``_completion`` (the report's last facts) -> ``_report``
(``RunReport``, what ``report.json`` holds)."""

from ._artifacts import ARTIFACT_FILES
from ._candidate_inputs import candidate_inputs
from ._candidates import CandidateResult, CandidateRun, CandidateSpec, SearchInputs, recover_candidate
from ._executors import CANDIDATE_FILES, CandidateExecutor, InTurn, load_candidate, save_candidate
from ._holdout import carve
from ._hooks import RunHooks
from ._identity import Identity, Recipe, RunIdentity
from ._plots import HeadMap, MssPlot, plot_head_map, plot_layer_retention, plot_mss_curve
from ._quality import QualityFlag, QualityRecord
from ._report import FailedRunMetrics, FailedRunReport, RunError, RunReport, RunSummary
from ._request import RunRequest
from ._resume import DirectoryResumeStore, ResumeStore, resume_point
from ._run import run_pruning
from ._target_record import TargetRecord
from ._warning_codes import WARNING_CODES

__all__ = [
    "ARTIFACT_FILES", "CANDIDATE_FILES", "candidate_inputs", "CandidateExecutor", "CandidateResult", "CandidateRun",
    "CandidateSpec", "carve",
    "DirectoryResumeStore", "ResumeStore", "resume_point",
    "FailedRunMetrics", "FailedRunReport", "HeadMap", "Identity", "InTurn", "load_candidate", "MssPlot",
    "plot_head_map", "plot_layer_retention", "plot_mss_curve", "QualityFlag", "QualityRecord", "Recipe",
    "recover_candidate", "run_pruning", "RunError", "RunHooks", "RunIdentity", "RunReport", "RunRequest",
    "RunSummary", "save_candidate",
    "SearchInputs", "TargetRecord", "WARNING_CODES",
]
