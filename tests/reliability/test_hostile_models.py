"""A key holder's model archive whose ``config.json`` declares far more than its weights hold.

A loader that trusts the config allocates what it declares before it finds that the weights do not
fit: a 100 KB archive declaring BERT with hidden size 1536, 24 layers and a 100k vocabulary took a
worker from 0.9 to 4.2 GB, one declaring DeBERTa with hidden size 65536 asked for a single 17 GB
tensor, and every redelivery of the killed job did it again. Here each such model is loaded in a
child process whose address space is capped at 1.5 GiB above what importing the engine took; it must
be refused as ``model_not_loadable``, by a message that says what does not fit, without growing the
process. A control shows that the cap is tight enough: transformers, trusting the same configs, runs
into it.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest
import safetensors.torch
import torch
import transformers as tf
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from app.cli import main as cahp
from app.cli.exit_codes import ExitCode
from app.core.db import Job, make_session_factory
from app.core.settings import Settings
from app.core.storage import open_store
from cahp_engine._torch import num_parameters
from cahp_engine.errors import InvalidInputError, ModelLoadError
from cahp_engine.models import DEFAULT_MAX_MODEL_PARAMS, load_classifier, prune_heads, save_pruned
from tests.support import jobs
from tests.support.helpers import job_body, write_tiny_dataset, write_tiny_model
from tests.support.tiny_models import make_classifier, make_config, make_tokenizer
from worker.runner import Outcome, WorkerContext, execute_job

ROOT = Path(__file__).resolve().parents[2]
#: Address space the child may add to what importing the engine and loading honest tiny models took.
CAP_BYTES = 3 * 2**29  # 1.5 GiB
#: What a refusal may cost the process, at most.
REFUSAL_BYTES = 200 * 2**20

#: The audit's archive: BERT with hidden size 1536, 24 layers, 100k vocabulary (3.3 GB in float32).
DEEP = {"hidden_size": 1536, "num_hidden_layers": 24, "num_attention_heads": 16, "intermediate_size": 6144,
        "vocab_size": 100_000}
#: The same widths with the two layers the weights have: every tensor is of another shape.
WIDE = {**DEEP, "num_hidden_layers": 2}
#: DeBERTa with hidden size 65536: 4.3e10 parameters, one 17 GB tensor per projection.
HUGE = {"hidden_size": 65536, "num_attention_heads": 16, "intermediate_size": 65536}


def _hostile(directory: Path, family: str = "bert", *, drop: tuple[str, ...] = (), **config: Any) -> Path:
    """A tiny model of ``family`` whose config.json is then rewritten with ``config`` (and ``drop`` removed)."""
    write_tiny_model(directory, family=family)
    return _rewrite(directory, drop, config)


def _hostile_pruned(directory: Path, **config: Any) -> Path:
    """A pruned tiny BERT (2 layers of 4 heads, 1 and 0 kept) whose config.json is then rewritten."""
    model = make_classifier("bert")
    prune_heads(model, {0: [1], 1: []})
    save_pruned(model, make_tokenizer(), directory)
    return _rewrite(directory, (), config)


def _rewrite(directory: Path, drop: tuple[str, ...], values: dict[str, Any]) -> Path:
    config = json.loads((directory / "config.json").read_text())
    for key in drop:
        config.pop(key, None)
    config.update(values)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def _hub_cache(cache: Path, repo: str, source: Path) -> None:
    """Lay ``source`` out in ``cache`` as huggingface_hub does, so the hub id resolves offline."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    root = cache / f"models--{repo.replace('/', '--')}"
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(commit)
    snapshot = root / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for path in source.iterdir():
        (snapshot / path.name).write_bytes(path.read_bytes())


# --- loading under an address-space cap, in a child process ----------------------------------------------

_CHILD = r'''
import contextlib, gc, io, json, resource, sys
import transformers
import cahp_engine.export._from_checkpoint
from app.cli import main as cahp
from cahp_engine.models._checkpoint import load_pruned
from cahp_engine.models import load_classifier

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024

spec = json.load(sys.stdin)
for ref in spec["warm"]:  # honest models, so that the modules transformers imports lazily are in
    load_classifier(ref)
gc.collect()
baseline = status("VmSize")
resource.setrlimit(resource.RLIMIT_AS, (baseline + spec["cap"],) * 2)
results = {}
for case in spec["cases"]:
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")  # resets the peak (VmHWM) to what the process holds now
    before = status("VmRSS")
    outcome = {"error": None, "code": None, "message": "", "exit": None}
    try:
        if case["call"] == "load_classifier":
            load_classifier(case["ref"], **case["kwargs"])
        elif case["call"] == "load_pruned":
            load_pruned(case["ref"])
        elif case["call"] == "trusting":
            transformers.AutoModelForSequenceClassification.from_pretrained(case["ref"], **case["kwargs"])
        else:
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                outcome["exit"] = cahp(case["argv"])
            outcome["message"] = err.getvalue()
    except BaseException as exc:
        outcome.update(error=type(exc).__name__, code=getattr(exc, "code", None), message=str(exc)[:2000])
    outcome["grew"] = status("VmHWM") - before
    results[case["id"]] = outcome
    gc.collect()
print(json.dumps({"baseline": baseline, "results": results}))
'''


def _under_cap(cases: list[dict[str, Any]], warm: list[str]) -> dict[str, Any]:
    spec = {"cap": CAP_BYTES, "warm": warm, "cases": cases}
    out = subprocess.run([sys.executable, "-c", _CHILD], cwd=ROOT, input=json.dumps(spec), capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


#: case id -> (what is called, a fragment of the refusal)
REFUSED = {
    "deep": ("load_classifier", "config.json declares 24 layers (`num_hidden_layers`) but its weights hold 2"),
    "wide": ("load_classifier", "bert.embeddings.word_embeddings.weight: weights (33, 32), config (100000, 1536)"),
    "over_limit": ("load_classifier", f"parameters, more than the limit of {DEFAULT_MAX_MODEL_PARAMS:,}"),
    "very_deep": ("load_classifier", "config.json declares 1000 layers"),
    "layer_list": ("load_classifier", "config.json declares 1000000000 layers"),
    "labels": ("load_classifier", "`num_labels` in config.json must be an integer in [1, 100,000]"),
    "positions": ("load_classifier", "buffer elements that no weight file holds"),
    "float64": ("load_classifier", "`dtype` in config.json must be one of float32, float16, bfloat16"),
    "hub": ("load_classifier", "config.json declares 24 layers"),
    "pruned_wide": ("load_pruned", "do not match the architecture"),
    "pruned_over_limit": ("load_pruned", "parameters, more than the limit of"),
    "export": ("cahp", "do not match the architecture"),
}


@pytest.fixture
def api_key(alice: str) -> str:
    """The client is alice's."""
    return alice


@pytest.fixture(scope="module")
def capped(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every hostile model of :data:`REFUSED`, and the trusting control, loaded in one capped child."""
    root = tmp_path_factory.mktemp("hostile-models")
    refs = {
        "deep": _hostile(root / "deep", **DEEP),
        "wide": _hostile(root / "wide", **WIDE),
        "over_limit": _hostile(root / "over-limit", "deberta-v2", **HUGE),
        "very_deep": _hostile(root / "very-deep", "deberta-v2", **HUGE, num_hidden_layers=1000),
        # Without layer_types, ModernBERT's config builds a list of num_hidden_layers entries while it is parsed.
        "layer_list": _hostile(root / "layer-list", "modernbert", drop=("layer_types",), num_hidden_layers=10**9),
        # Without id2label, transformers builds a table of num_labels entries while it parses the config.
        "labels": _hostile(root / "labels", drop=("id2label", "label2id"), num_labels=10**9),
        # DeBERTa-v3 has no position embeddings, yet a position_ids buffer of max_position_embeddings.
        "positions": _hostile(root / "positions", "deberta-v2", max_position_embeddings=10**9),
        # Built in the config's dtype, a float16 file would take four times its size.
        "float64": _hostile(root / "float64", dtype="float64"),
        "pruned_wide": _hostile_pruned(root / "pruned-wide", hidden_size=4096, intermediate_size=16384,
                                       vocab_size=100_000),
        "pruned_over_limit": _hostile_pruned(root / "pruned-over-limit", **{**HUGE, "num_attention_heads": 4}),
    }
    _hub_cache(root / "hub", "attacker/bomb", refs["deep"])
    honest = [str(write_tiny_model(root / f"honest-{family}", family=family))
              for family in ("bert", "deberta-v2", "modernbert")]
    honest.append(str(_hostile_pruned(root / "honest-pruned")))
    cases: list[dict[str, Any]] = []
    for case, (call, _) in REFUSED.items():
        # The worker passes the dataset's classes; cahp export passes none (the config's count counts then).
        kwargs: dict[str, Any] = {"num_labels": 3} if case not in ("labels",) else {}
        if case == "hub":
            cases.append({"id": case, "call": call, "ref": "attacker/bomb",
                          "kwargs": {**kwargs, "cache_dir": str(root / "hub")}})
        elif case == "export":
            cases.append({"id": case, "call": call, "argv": ["export", str(refs["pruned_wide"]), "-o",
                                                              str(root / "export-out"), "--latency-repeats", "0"]})
        else:
            cases.append({"id": case, "call": call, "ref": str(refs[case]), "kwargs": kwargs})
    # The control, last: a loader that trusts the config runs into the cap with the same archives.
    for case in ("deep", "over_limit"):
        cases.append({"id": f"trusting_{case}", "call": "trusting", "ref": str(refs[case]),
                      "kwargs": {"num_labels": 3, "ignore_mismatched_sizes": True}})
    return _under_cap(cases, honest)


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_config_that_declares_more_than_its_weights_is_refused_before_it_allocates(
    case: str, capped: dict[str, Any]
) -> None:
    outcome = capped["results"][case]
    fragment = REFUSED[case][1]
    if case == "export":
        assert outcome["exit"] == ExitCode.USAGE, outcome
    else:
        assert (outcome["error"], outcome["code"]) == ("ModelLoadError", "model_not_loadable"), outcome
    assert fragment in outcome["message"], outcome
    assert "allocate memory" not in outcome["message"], outcome  # torch's "can't allocate memory"
    assert outcome["grew"] < REFUSAL_BYTES, outcome


@pytest.mark.parametrize("case", ["deep", "over_limit"])
def test_the_cap_is_tight_enough_that_a_loader_trusting_the_config_runs_into_it(
    case: str, capped: dict[str, Any]
) -> None:
    outcome = capped["results"][f"trusting_{case}"]
    assert outcome["error"] in ("RuntimeError", "MemoryError", "OutOfMemoryError"), outcome
    assert outcome["error"] == "MemoryError" or "allocate memory" in outcome["message"], outcome


# --- through the service ------------------------------------------------------------------------------


def _context(settings: Settings, engine: Engine) -> WorkerContext:
    return WorkerContext(settings=settings, sessions=make_session_factory(engine), store=open_store(settings),
                         worker_id="attacked-worker")


def _status(key: str) -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def _attempts(engine: Engine, job_id: str) -> int:
    with make_session_factory(engine)() as session:
        job = session.get(Job, job_id)
        assert job is not None
        return int(job.attempts)


def test_the_audits_archive_fails_its_job_as_model_not_loadable_once_without_allocating(
    client: TestClient, settings: Settings, engine: Engine, tmp_path: Path
) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(_hostile(tmp_path / "deep", **DEEP), arcname="model")
    assert len(buffer.getvalue()) < 200_000
    model = client.post("/v1/uploads", files={"file": ("model.tar.gz", buffer.getvalue())}).json()["uri"]
    data = f"file://{write_tiny_dataset(settings.allowed_local_roots[0] / 'data')}"
    # Submit refuses it from the headers read at upload, with the worker's words...
    refused = client.post("/v1/jobs", json=job_body(model, data))
    assert refused.status_code == 422 and refused.json()["code"] == "model_not_loadable", refused.text
    assert "declares 24 layers (`num_hidden_layers`) but its weights hold 2" in refused.json()["detail"]
    # ... and the worker, given such a job all the same (recorded before submit checked models), refuses
    # it without allocating what the config declares.
    job_id = jobs.record(engine, job_body(model, data))

    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")
    before = _status("VmRSS")
    assert execute_job(job_id=job_id, context=_context(settings, engine)) is Outcome.failed
    assert _status("VmHWM") - before < 2 * REFUSAL_BYTES

    error = client.get(f"/v1/jobs/{job_id}").json()["error"]
    assert error["code"] == "model_not_loadable", error
    assert "declares 24 layers (`num_hidden_layers`) but its weights hold 2" in error["message"], error
    assert str(settings.data_dir) not in error["message"]
    # A refusal is the model's fault: the job ends on its first attempt and a redelivery does nothing.
    assert _attempts(engine, job_id) == 1
    assert execute_job(job_id=job_id, context=_context(settings, engine)) is Outcome.skipped
    assert _attempts(engine, job_id) == 1


def test_a_model_over_the_parameter_limit_is_refused_naming_its_count_and_the_setting(
    client: TestClient, settings: Settings, engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    local = settings.allowed_local_roots[0]
    model = write_tiny_model(local / "model")
    count = num_parameters(make_classifier("bert"))
    data = f"file://{write_tiny_dataset(local / 'data')}"
    job_id = client.post("/v1/jobs", json=job_body(f"file://{model}", data)).json()["id"]
    # The limit is the worker's setting, read from CAHP_MAX_MODEL_PARAMS and handed to the worker it starts.
    monkeypatch.setenv("CAHP_MAX_MODEL_PARAMS", "1000")
    limited = Settings(**settings.model_dump(exclude={"max_model_params"}))
    assert limited.max_model_params == 1000
    assert limited.child_environment()["CAHP_MAX_MODEL_PARAMS"] == "1000"

    assert execute_job(job_id=job_id, context=_context(limited, engine)) is Outcome.failed
    error = client.get(f"/v1/jobs/{job_id}").json()["error"]
    assert error["code"] == "model_not_loadable", error
    assert f"declares {count:,} parameters, more than the limit of 1,000" in error["message"], error
    assert "CAHP_MAX_MODEL_PARAMS" in error["message"]
    assert _attempts(engine, job_id) == 1

    # cahp prune takes the same limit as a flag, and its default lets the model through.
    with pytest.raises(ModelLoadError, match=f"declares {count:,} parameters.*--max-model-params"):
        load_classifier(str(model), max_params=count - 1)
    assert load_classifier(str(model), max_params=count).classifier_trained
    code = cahp(["prune", str(model), str(local / "data"), "-o", str(tmp_path / "out"), "--max-model-params",
                 "1000", "--dense-finetune", "never", "--untrained-dense", "warn", "--export", "none", "--json"])
    assert code == ExitCode.USAGE


@pytest.mark.parametrize("limit", [0, -5, True, 2.5])
def test_the_parameter_limit_must_be_a_positive_integer(limit: Any, tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="parameter limit"):
        load_classifier(str(write_tiny_model(tmp_path)), max_params=limit)


# --- honest checkpoints still load ---------------------------------------------------------------------

#: Pre-training checkpoints (their heads are tensors outside the classifier, the classifier is new) and
#: a bare encoder with the pooler a RoBERTa classifier does not use.
BASES = {
    "bert-pretraining": lambda: tf.BertForPreTraining(make_config("bert")),
    "roberta-bare-with-pooler": lambda: tf.RobertaModel(make_config("roberta")),
    "xlm-roberta-xl-mlm": lambda: tf.XLMRobertaXLForMaskedLM(make_config("xlm-roberta-xl")),
    "distilbert-mlm": lambda: tf.DistilBertForMaskedLM(make_config("distilbert")),
    "deberta-v2-mlm": lambda: tf.DebertaV2ForMaskedLM(make_config("deberta-v2")),
    "modernbert-mlm": lambda: tf.ModernBertForMaskedLM(make_config("modernbert")),
    "electra-discriminator": lambda: tf.ElectraForPreTraining(make_config("electra")),
    "bert-token-classifier": lambda: tf.BertForTokenClassification(make_config("bert", num_labels=7)),
}


@pytest.mark.parametrize("base", sorted(BASES))
def test_a_pretraining_checkpoint_still_loads_with_a_new_head(base: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    BASES[base]().save_pretrained(tmp_path)
    make_tokenizer().save_pretrained(tmp_path)
    loaded = load_classifier(str(tmp_path), num_labels=3)
    assert not loaded.classifier_trained


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


def test_legacy_names_persisted_buffers_and_shards_still_load(tmp_path: Path) -> None:
    model = make_classifier("bert")
    legacy = write_tiny_model(tmp_path / "legacy")
    weights = safetensors.torch.load_file(legacy / "model.safetensors")
    renamed = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
               for k, v in weights.items()}
    renamed["bert.embeddings.position_ids"] = torch.arange(130)[None]  # persisted by old transformers
    safetensors.torch.save_file(renamed, legacy / "model.safetensors", metadata={"format": "pt"})
    loaded = load_classifier(str(legacy))
    assert loaded.classifier_trained and _same_weights(loaded.model, model)

    sharded = tmp_path / "sharded"
    make_classifier("roberta").save_pretrained(sharded, max_shard_size="20KB")
    make_tokenizer().save_pretrained(sharded)
    assert len(list(sharded.glob("*.safetensors"))) > 1
    loaded = load_classifier(str(sharded))
    assert loaded.classifier_trained and _same_weights(loaded.model, make_classifier("roberta"))
    # A sharded checkpoint under a config that declares more is refused from the shards' headers.
    _rewrite(sharded, (), WIDE)
    with pytest.raises(ModelLoadError, match=r"roberta.embeddings.word_embeddings.weight: weights \(33, 32\)"):
        load_classifier(str(sharded), num_labels=3)


def test_tensors_missing_from_or_left_over_in_the_encoder_are_named(tmp_path: Path) -> None:
    directory = write_tiny_model(tmp_path)
    weights = safetensors.torch.load_file(directory / "model.safetensors")
    del weights["bert.embeddings.word_embeddings.weight"]
    weights["bert.encoder.layer.1.attention.self.extra"] = torch.zeros(3)
    safetensors.torch.save_file(weights, directory / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match=r"1 tensor\(s\) the config needs are missing "
                                             r"\(bert.embeddings.word_embeddings.weight \(33, 32\)\); 1 are not "
                                             r"in the architecture \(bert.encoder.layer.1.attention.self.extra"):
        load_classifier(str(directory), num_labels=3)


def test_a_header_naming_a_tiny_tensor_in_each_of_many_layers_does_not_buy_that_many_layers(tmp_path: Path) -> None:
    # Each layer is a few dozen modules even on the meta device: the layer count has a ceiling of its own.
    directory = write_tiny_model(tmp_path)
    weights = safetensors.torch.load_file(directory / "model.safetensors")
    weights.update({f"bert.encoder.layer.{i}.output.dense.bias": torch.zeros(1) for i in range(2, 5000)})
    safetensors.torch.save_file(weights, directory / "model.safetensors", metadata={"format": "pt"})
    _rewrite(directory, (), {"num_hidden_layers": 5000})
    with pytest.raises(ModelLoadError, match=r"declares 5000 layers \(`num_hidden_layers`\); cahp loads at most 1024"):
        load_classifier(str(directory), num_labels=3)
