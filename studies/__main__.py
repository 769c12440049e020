"""``python -m studies <name> [options]``: run one research experiment and save its figures under
studies/results/.

A study that runs for hours keeps what it finished in a resume cache under studies/results/cache/,
which git does not track: rerunning the same command on the same checkout resumes it. To carry a
study across checkouts (another session, another machine), commit its cache's JSON files on a study
branch on purpose (``git add -f studies/results/cache/<name>/*.json``); the model weights are never
committed, and the quality study retrains the dense model and checks it against the cached record.
"""

from __future__ import annotations

from bench.dispatch import run_named

STUDIES = {
    "quality": "studies.quality",
    "quality-causes": "studies.quality_causes",
    "distill-study": "studies.distill_study",
    "convergence-study": "studies.convergence_study",
    "mnli-synth": "studies.mnli_synth",
    "budget": "studies.budget_study",
    "agreement": "studies.agreement",
    "benchmarks": "studies.benchmarks",
}


def main() -> None:
    run_named(STUDIES, prog="python -m studies", other="repeatable measurements: python -m bench")


if __name__ == "__main__":
    main()
