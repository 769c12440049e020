"""A worker process killed with SIGKILL in recovery: the next attempt resumes from the last epoch's saved state.

A real ``cahp worker`` (Celery's prefork pool) on the real Redis runs a job with dense fine-tuning and
a long recovery, saving each epoch to the artifact store. Once recovery has saved an epoch, the
process running the job is killed. The next attempt must take the saved stages instead of computing
them again (its log says so, and never fine-tunes the dense model nor selects), go on from the saved
step, and end with the model an uninterrupted run of the same settings makes.
"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import torch
from safetensors.torch import load, load_file

from app.core.params import run_config
from cahp_engine.data import DatasetOptions
from cahp_engine.run import RunRequest, run_pruning
from tests.support.helpers import TINY_PARAMS
from tests.support.stack import TERMINAL, Stack, holder_pid, kill

STACK_SETTINGS = {"max_attempts": 3, "checkpoint_interval_s": 0.0}
#: Dense fine-tuning on (a saved stage of its own), and enough recovery epochs to be killed in the middle.
PARAMS = {"dense_finetune": "always", "dense_epochs": 1, "epochs": 6, "batch_size": 2, "recovery_loss": "distill",
          "latency_repeats": 1, "latency_warmup": 0}


def _index(stack: Stack, job_id: str) -> dict:
    path = stack.settings.data_dir / "artifacts" / "jobs" / job_id / "checkpoints" / "index.json"
    try:
        return dict(json.loads(path.read_text()))
    except (FileNotFoundError, ValueError):
        return {}


def test_a_job_killed_in_recovery_resumes_from_its_last_epoch_and_ends_as_an_uninterrupted_run(
    stack: Stack, tmp_path: Path,
) -> None:
    worker = stack.start_worker("prefork", pool="prefork")
    stack.wait_ready(worker)
    job_id = stack.submit(**PARAMS)

    first = stack.wait_row(job_id, lambda r: r["stage"] == "recovery" and "recovery_training" in _index(stack, job_id)
                           or r["status"] in TERMINAL, timeout=240, what="recovery to save its first epoch")
    assert first["status"] == "running" and first["attempts"] == 1, f"the job ended before it could be killed: {first}"
    kill(holder_pid(first))

    done = stack.wait_row(job_id, lambda r: r["status"] in TERMINAL, timeout=stack.settings.takeover_bound_s + 300,
                          what="the second attempt to end")
    assert done["status"] == "succeeded" and done["attempts"] == 2, done

    text = "\n".join(message for _, message in stack.logs(job_id))
    second = text[text.index("attempt 2 on worker"):]
    assert "resuming from the checkpoints of an earlier attempt: dense, pruned, recovery_training, selection" \
        in second
    assert "the fine-tuned dense model saved by an earlier attempt" in second
    assert "selection: saved by an earlier attempt" in second
    assert "recovery: going on from step " in second
    resumed_at = int(second.split("recovery: going on from step ")[1].split()[0])
    assert 0 < resumed_at < 6 * 30  # an epoch (30 steps) or more was kept, and some were left to do
    assert "dense fine-tuning (" not in second and "selecting heads" not in second
    # The job's history: the killed attempt ended as lost, the next went on from the step it saved.
    job = stack.client.get(f"/v1/jobs/{job_id}").json()
    assert [(a["number"], a["worker"], a["end"], a["resumed_from"]) for a in job["attempts"]] == [
        (1, first["worker_id"], "lost", None),
        (2, done["worker_id"], "completed", f"recovery_training step {resumed_at}")], job["attempts"]
    assert job["started_at"] == job["attempts"][0]["started_at"]
    # The resume state is gone with the job's end; its artifacts are attempt 2's.
    assert _index(stack, job_id) == {}
    assert all(key.startswith(f"jobs/{job_id}/2/") for key in stack.artifact_keys(job_id))

    # The same run, never interrupted, in this process.
    model, data = (uri.removeprefix("file://") for uri in stack.inputs())
    config = run_config({**TINY_PARAMS, **PARAMS}, device="cpu")
    whole = run_pruning(RunRequest(model_ref=model, dataset_ref=data, output_dir=tmp_path / "whole", config=config,
                                   dataset_options=DatasetOptions()))
    job = stack.client.get(f"/v1/jobs/{job_id}").json()
    assert job["result"]["pruned_accuracy"] == whole.summary.pruned_accuracy
    assert job["result"]["heads_kept"] == whole.summary.heads_kept
    archive = stack.client.get(f"/v1/jobs/{job_id}/artifacts/model.tar.gz").content
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("model.safetensors"))
        handle = tar.extractfile(member)
        assert handle is not None
        resumed = load(handle.read())
    uninterrupted = load_file(str(tmp_path / "whole" / "model" / "model.safetensors"))
    assert resumed.keys() == uninterrupted.keys()
    for name, tensor in resumed.items():
        torch.testing.assert_close(tensor, uninterrupted[name], rtol=1e-5, atol=1e-6, msg=name)
