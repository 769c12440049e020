"""The README's CI step, run twice against a real ``cahp serve``, as a re-run pipeline does.

The second run must upload nothing (the directories pack to the same bytes, which the server already
holds for this key), send the same body, print the same job id and exit 0; its ``cahp download``
finds every file already there and fetches none again. ``cahp submit --check`` checks without queuing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from sqlalchemy import create_engine, text

from app.core.settings import Settings
from tests.support.helpers import write_tiny_dataset, write_tiny_model
from tests.support.processes import serving

#: The README's CI block (section "In CI, and for the platform that takes the model"), with settings that
#: keep a tiny job to seconds added to its --param; its gate (`--fail-on`) is run on its own below, since
#: this random tiny model is bad on purpose.
CI_STEP = """
set -e
JOB=$(cahp submit --model ./my-model --dataset ./my-dataset --param epochs=1 \\
        --param dense_finetune=never --param untrained_dense=warn --param export=none --param max_length=32 \\
        --label git/commit=$CI_COMMIT_SHA --label branch=$CI_COMMIT_BRANCH \\
        --idempotency-key "$CI_PIPELINE_ID-prune") && cahp wait "$JOB" --follow --timeout 14400
cahp download "$JOB" -o pruned/                      # resumes if cut off; checks every sha256
echo "$JOB" > job-id
"""


def test_the_readme_ci_step_run_twice_uploads_once_and_answers_the_same_job(tmp_path: Path) -> None:
    with serving(tmp_path) as served:
        workspace = tmp_path / "checkout"
        write_tiny_model(workspace / "my-model")
        write_tiny_dataset(workspace / "my-dataset")
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        (bin_dir / "cahp").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m app.cli "$@"\n')
        (bin_dir / "cahp").chmod(0o755)
        ci_env = {**os.environ, "CAHP_URL": served.url, "CAHP_API_KEY": served.key, "CI_COMMIT_SHA": "4f2c9e1",
                  "CI_COMMIT_BRANCH": "main", "CI_PIPELINE_ID": "8812",
                  "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
                  "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        runs = []
        for _ in range(2):
            done = subprocess.run(["bash", "-c", CI_STEP], cwd=workspace, env=ci_env, capture_output=True, text=True,
                                  timeout=600)
            assert done.returncode == 0, done.stdout + done.stderr + served.logs()[-3000:]
            runs.append((done, (workspace / "job-id").read_text().strip(),
                         {p.name: p.stat().st_mtime_ns for p in (workspace / "pruned").iterdir()}))
        (first, first_job, first_files), (second, second_job, second_files) = runs

        assert second_job == first_job and len(first_job) == 32
        assert "my-model uploaded as upload://" in first.stderr and "my-dataset uploaded as upload://" in first.stderr
        assert "my-model is already uploaded (same sha256); nothing sent" in second.stderr
        assert "my-dataset is already uploaded (same sha256); nothing sent" in second.stderr
        database = create_engine(Settings(data_dir=served.data_dir).resolved_database_url)
        with database.connect() as connection:
            assert connection.execute(text("SELECT count(*) FROM uploads")).scalar_one() == 2
            assert connection.execute(text("SELECT count(*) FROM jobs")).scalar_one() == 1
        database.dispose()
        # The second download found every file whole and checked: none was written again.
        assert second_files == first_files and "model.tar.gz" in first_files

        # The README's gate: this random tiny model scores near chance, so the step fails (exit 6), naming why;
        # a code it does not have lets it pass; a misspelt code is refused with the nearest.
        shown = subprocess.run(["cahp", "wait", first_job, "--json", "--quiet"], cwd=workspace, env=ci_env,
                               capture_output=True, text=True, timeout=120)
        result = json.loads(shown.stdout)["result"]
        assert len(result["warning_codes"]) == len(result["warnings"]) and "near_chance" in result["warning_codes"]
        assert "[near_chance]" in shown.stderr
        gate = subprocess.run(["cahp", "wait", first_job, "--fail-on", "class_lost,near_chance,accuracy_drop"],
                              cwd=workspace, env=ci_env, capture_output=True, text=True, timeout=120)
        assert gate.returncode == 6 and "it was told to fail on" in gate.stderr and "near_chance" in gate.stderr
        assert subprocess.run(["cahp", "wait", first_job, "--fail-on-warnings"], cwd=workspace, env=ci_env,
                              capture_output=True, timeout=120).returncode == 6
        assert subprocess.run(["cahp", "wait", first_job, "--fail-on", "int8_accuracy_drop"], cwd=workspace,
                              env=ci_env, capture_output=True, timeout=120).returncode == 0  # export=none: no int8
        misspelt = subprocess.run(["cahp", "wait", first_job, "--fail-on", "near_chanse"], cwd=workspace, env=ci_env,
                                  capture_output=True, text=True, timeout=120)
        assert misspelt.returncode == 2 and "did you mean near_chance?" in misspelt.stderr

        # `cahp submit --check`: the same checks, nothing queued; a wrong column is refused with what to change.
        checked = subprocess.run(["cahp", "submit", "--check", "--model", "./my-model", "--dataset", "./my-dataset"],
                                 cwd=workspace, env=ci_env, capture_output=True, text=True, timeout=120)
        assert checked.returncode == 0, checked.stderr
        assert "checked model: bert config" in checked.stdout and "checked dataset:" in checked.stdout
        wrong = subprocess.run(["cahp", "submit", "--check", "--model", "./my-model", "--dataset", "./my-dataset",
                                "--label-column", "sentiment"], cwd=workspace, env=ci_env, capture_output=True,
                               text=True, timeout=120)
        assert wrong.returncode == 2 and wrong.stdout == ""
        assert "has no column 'sentiment'" in wrong.stderr and "Set `label_column`" in wrong.stderr
        database = create_engine(Settings(data_dir=served.data_dir).resolved_database_url)
        with database.connect() as connection:
            assert connection.execute(text("SELECT count(*) FROM jobs")).scalar_one() == 1
        database.dispose()
