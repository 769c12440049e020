"""Registering a job's pruned model in the operator's MLflow model registry.

A platform that keeps its models in MLflow wants a pruned model there, not a tarball to unpack:
:func:`register_model` logs one MLflow run for the job (its settings as params, its figures as metrics,
the MSS curve as a metric series over k, the curve's and the head map's plots and data, and
``report.json``) and registers the model as a new version of a named model, tagged with the job id,
the base model, the dataset and the job's labels. The registered directory is an MLflow model of the
ONNX flavour (``mlflow.onnx.load_model("models:/<name>/<version>")`` opens the pruned graph) that also
holds the Hugging Face checkpoint (``checkpoint/``, for ``cahp_engine.load_pruned``), the tokenizer,
the model card and, with ``quantize: int8``, ``onnx-int8/``.

The tracking server and its credentials are the operator's settings (``CAHP_MLFLOW_*``), never a
job's: a job names a model and tags only. The server's address passes the outbound guard
(:mod:`app.core.security._outbound`) like any other address the service connects to, and reaches what a caller
reads without its credentials (``https://***@host``).

A registered model belongs to whoever created it through cahp: the key, or the operator's group of
keys (``CAHP_REGISTRY_GROUPS``) it is in, recorded as the model's ``cahp.owner`` tag when cahp creates
it. Another key adding a version gets :class:`~app.core.errors.RegisteredModelOwnedError` (403) before
anything is logged; so does any key for a name cahp did not create (no ``cahp.owner`` tag), until an
operator sets that tag. Tags under ``cahp.`` and ``mlflow.`` are the service's: a job's own tags are
applied first and may not use them, and the provenance tags (job, base model, dataset, warnings) last.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from app.core.errors import RegisteredModelOwnedError, RegistryError, RegistryNotConfiguredError
from app.core.security import check_outbound_url, hide_credentials
from app.core.settings import Settings
from cahp_engine.run import RunReport

#: Where the registered model sits in the run's artifacts.
MODEL_PATH = "model"
#: Files of the run's output logged beside the model.
RUN_FILES = ("report.json", "mss_curve.json", "mss_curve.png", "head_map.json", "head_map.png",
             "layer_retention.png", "budget.png")
#: MLflow's limits: a tag or param value, and a param key.
_VALUE_LIMIT, _KEY_LIMIT = 5000, 250
#: Tag prefixes only the service sets: its provenance, and MLflow's own (``mlflow.user``...).
RESERVED_TAG_PREFIXES = ("cahp.", "mlflow.")
#: The registered model's tag naming its owner (``key:<id>`` or ``group:<name>``).
OWNER_TAG = "cahp.owner"


def reserved_tags(tags: Mapping[str, str]) -> list[str]:
    """The keys of ``tags`` a job may not set (under ``cahp.`` or ``mlflow.``, in any case)."""
    return sorted(k for k in tags if k.strip().lower().startswith(RESERVED_TAG_PREFIXES))


@dataclass(frozen=True)
class RegisterRequest:
    """What a job asks of the registry: the registered model's name, extra tags, a description."""

    model_name: str
    tags: dict[str, str] = field(default_factory=dict)
    description: str | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RegisterRequest:
        return cls(model_name=str(data["model_name"]), tags=dict(data.get("tags") or {}),
                   description=data.get("description"))


@dataclass(frozen=True)
class RegistrationOutcome:
    """How a registration went; stored on the job (``registration``) and shown by the API."""

    status: str
    model_name: str
    version: str | None = None
    run_id: str | None = None
    model_uri: str | None = None
    tracking_uri: str | None = None
    error: str | None = None
    registered_at: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def stored_register(register: Mapping[str, Any]) -> dict[str, Any]:
    """A job's stored ``register`` without the reserved tags a job submitted before they were refused may hold."""
    tags = dict(register.get("tags") or {})
    return {**register, "tags": {k: v for k, v in tags.items() if k not in reserved_tags(tags)}}


def public_registration(registration: Mapping[str, Any]) -> dict[str, Any]:
    """A stored registration as a caller may read it: no credentials in its address or its error."""
    return {k: hide_credentials(v) if isinstance(v, str) and k in ("tracking_uri", "error") else v
            for k, v in registration.items()}


def check_registry(settings: Settings) -> str:
    """The tracking server's URI, once it passed the outbound guard.

    Raises
    ------
    RegistryNotConfiguredError
        Without ``CAHP_MLFLOW_TRACKING_URI``.
    OutboundUrlRefusedError
        When the URI leads to a loopback, link-local or metadata address ``CAHP_ALLOWED_OUTBOUND_HOSTS``
        does not allow.
    """
    uri = settings.mlflow_tracking_uri
    if not uri:
        raise RegistryNotConfiguredError(
            "this server has no model registry (CAHP_MLFLOW_TRACKING_URI is unset); remove `register` from the "
            "job, or ask the operator to configure MLflow")
    check_outbound_url(uri, allowed_hosts=settings.allowed_outbound_hosts, what="CAHP_MLFLOW_TRACKING_URI")
    return uri


def _without_userinfo(uri: str) -> tuple[str, str | None, str | None]:
    """``uri`` without its ``user:password@`` part, and that user and password (unquoted)."""
    parts = urlsplit(uri)
    if parts.username is None and parts.password is None:
        return uri, None, None
    host = parts.netloc.rpartition("@")[2]
    return (urlunsplit(parts._replace(netloc=host)), unquote(parts.username or "") or None,
            unquote(parts.password or "") or None)


def _use_credentials(settings: Settings, uri: str) -> str:
    """Hand the operator's credentials to MLflow, which reads them from the environment on every request.

    Credentials written into ``CAHP_MLFLOW_TRACKING_URI`` are moved there too (unless the username and
    password settings are set), so the address MLflow is given, and may print or quote, has none.
    """
    bare, user, password = _without_userinfo(uri)
    values = {
        "MLFLOW_TRACKING_USERNAME": settings.mlflow_tracking_username or user,
        "MLFLOW_TRACKING_PASSWORD": (settings.mlflow_tracking_password.get_secret_value()
                                     if settings.mlflow_tracking_password else password),
        "MLFLOW_TRACKING_TOKEN": (settings.mlflow_tracking_token.get_secret_value()
                                  if settings.mlflow_tracking_token else None),
    }
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    # A registry that does not answer must not hold a worker for MLflow's default minutes of retries.
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "60")
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    return bare


def stage_model(files: Path, dest: Path) -> Path:
    """The registered model's directory, from a run's output (``model/``, ``onnx/``, ``onnx-int8/``).

    With ``onnx/`` it is an MLflow model of the ONNX flavour (``MLmodel``, ``model.onnx``) with the
    tokenizer, config and card beside it; ``checkpoint/`` is the PyTorch checkpoint and ``onnx-int8/``
    the int8 copy. Without an export it is the checkpoint's files only.
    """
    if dest.exists():
        shutil.rmtree(dest)
    onnx_dir = files / "onnx"
    if onnx_dir.is_dir():
        import mlflow.onnx
        import onnx

        mlflow.onnx.save_model(onnx.load(str(onnx_dir / "model.onnx")), str(dest),
                               onnx_execution_providers=["CPUExecutionProvider"])
        for item in onnx_dir.iterdir():
            if item.is_file() and not (dest / item.name).exists():
                shutil.copy2(item, dest / item.name)
        shutil.copytree(files / "model", dest / "checkpoint")
    else:
        shutil.copytree(files / "model", dest)
    if (files / "onnx-int8").is_dir():
        shutil.copytree(files / "onnx-int8", dest / "onnx-int8")
    return dest


def _clip(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return text[:_VALUE_LIMIT]


def _params(report: RunReport) -> dict[str, str]:
    params = {f"config.{k}": _clip(v) for k, v in report.config.to_dict().items()}
    dataset = report.dataset
    params |= {"dataset.eval_split": _clip(dataset.eval_split), "dataset.train_rows": str(dataset.train_rows),
               "dataset.eval_rows": str(dataset.eval_rows), "dataset.text_column": dataset.text_column,
               "dataset.label_column": dataset.label_column, "model.family": report.model.family}
    return {k[:_KEY_LIMIT]: v for k, v in params.items()}


def _metrics(report: RunReport) -> dict[str, float]:
    figures = {k: v for k, v in report.summary.to_dict().items()
               if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return {k: float(v) for k, v in figures.items()}


def _tags(report: RunReport, *, job_id: str, labels: Mapping[str, str], extra: Mapping[str, str]) -> dict[str, str]:
    identity = report.identity
    tags = {"cahp.job_id": job_id, "cahp.heads_kept": f"{report.summary.heads_kept}/{report.summary.heads_total}"}
    if identity is not None:
        tags |= {"cahp.base_model": identity.base_model, "cahp.dataset": identity.dataset,
                 "cahp.classes": ",".join(identity.class_names)}
        if identity.cahp_version:
            tags["cahp.version"] = identity.cahp_version
    if report.summary.warnings:
        tags["cahp.quality_warnings"] = _clip(" | ".join(report.summary.warnings))
    # The job's own tags first, its labels next, the provenance last: nothing a job sets overrides it.
    reserved = set(reserved_tags(extra))
    ordered = {k: v for k, v in extra.items() if k not in reserved}
    ordered |= {f"label.{k}": v for k, v in labels.items()}
    ordered |= tags
    return {k[:_KEY_LIMIT]: _clip(v) for k, v in ordered.items()}


def _claim_name(client: Any, name: str, owner: str, settings: Settings) -> None:
    """Create the registered model ``name`` owned by ``owner``, or check that ``owner`` may add to it.

    Creating first and reading only when the name exists is race-safe: of two keys creating one new
    name at once, MLflow lets one create it, and the other reads its owner.
    """
    try:
        client.create_registered_model(name, tags={OWNER_TAG: owner})
        return
    except Exception as exc:  # MLflow raises RESOURCE_ALREADY_EXISTS for a name in use
        if "RESOURCE_ALREADY_EXISTS" not in str(exc) and "already exists" not in str(exc):
            raise
    current = client.get_registered_model(name).tags.get(OWNER_TAG)
    if current is not None and _same_owner(current, owner, settings):
        return
    whose = ("was not created through this service (it has no `cahp.owner` tag; an operator may set one)"
             if current is None else "belongs to another API key")
    raise RegisteredModelOwnedError(f"the registered model {name!r} {whose}; register under a name of your own")


def _same_owner(current: str, owner: str, settings: Settings) -> bool:
    if current == owner:
        return True
    # A model a key created before it joined a group stays its group's.
    return current.startswith("key:") and settings.registry_owner(current[len("key:"):]) == owner


def register_model(
    settings: Settings, *, files: Path, job_id: str, owner_id: str, request: RegisterRequest,
    labels: Mapping[str, str], name: str | None = None, work: Path | None = None,
) -> RegistrationOutcome:
    """Log the job's run and register its model as a new version of ``request.model_name``.

    Parameters
    ----------
    files : a run's output directory (``report.json``, ``model/``, ``onnx/``..., the plots and curves)
    job_id, owner_id, labels, name : the job's (``owner_id``: its key's id)
    work : scratch space for the registered directory (a temporary one under ``files`` by default)

    Raises
    ------
    RegistryNotConfiguredError, OutboundUrlRefusedError
        See :func:`check_registry`.
    RegisteredModelOwnedError
        When the name belongs to another key or group (checked before anything is logged).
    RegistryError
        When the tracking server refuses or fails a step; the message names the step and MLflow's words.
    """
    uri = _use_credentials(settings, check_registry(settings))
    report = RunReport.from_dict(json.loads((files / "report.json").read_text()))
    staged = stage_model(files, (work or files.parent / f".{files.name}-registry") / MODEL_PATH)
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param

    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    step = "checking the registered model's owner"
    try:
        _claim_name(client, request.model_name, settings.registry_owner(owner_id), settings)
        step = "finding the experiment"
        experiment = client.get_experiment_by_name(settings.mlflow_experiment)
        experiment_id = (experiment.experiment_id if experiment is not None
                         else client.create_experiment(settings.mlflow_experiment))
        step = "creating the run"
        tags = _tags(report, job_id=job_id, labels=labels, extra=request.tags)
        run = client.create_run(experiment_id, run_name=name or f"cahp-{job_id}", tags=tags)
        run_id = run.info.run_id
        step = "logging params and metrics"
        now = int(time.time() * 1000)
        params = [Param(k, v) for k, v in _params(report).items()]
        metrics = [Metric(k, v, now, 0) for k, v in _metrics(report).items()]
        curve = _mss_curve(files)
        metrics += [Metric("mss_curve", mss, now, k) for k, mss in curve]
        for start in range(0, max(len(params), len(metrics)), 100):
            client.log_batch(run_id, params=params[start:start + 100], metrics=metrics[start:start + 1000])
        step = "uploading the artifacts"
        for item in RUN_FILES:
            if (files / item).is_file():
                client.log_artifact(run_id, str(files / item))
        client.log_artifacts(run_id, str(staged), artifact_path=MODEL_PATH)
        client.set_terminated(run_id)
        step = "registering the model version"
        version = client.create_model_version(
            request.model_name, f"{run.info.artifact_uri}/{MODEL_PATH}", run_id=run_id, tags=tags,
            description=request.description or _description(report, job_id),
        )
    except (RegistryError, RegisteredModelOwnedError):
        raise
    except Exception as exc:  # MLflow's own exceptions and the HTTP library's, all meaning "it did not work"
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise RegistryError(hide_credentials(f"the MLflow registry at {uri} failed while {step}: {message}")) from exc
    finally:
        shutil.rmtree(staged.parent, ignore_errors=True)
    return RegistrationOutcome(status="registered", model_name=request.model_name, version=str(version.version),
                        run_id=run_id, model_uri=f"models:/{request.model_name}/{version.version}",
                        tracking_uri=uri,
                        registered_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"))


def failed_registration(settings: Settings, request: RegisterRequest, error: Exception) -> RegistrationOutcome:
    uri = settings.mlflow_tracking_uri
    return RegistrationOutcome(status="failed", model_name=request.model_name,
                        tracking_uri=_without_userinfo(uri)[0] if uri else None,
                        error=hide_credentials(str(error)),
                        registered_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"))


def _mss_curve(files: Path) -> list[tuple[int, float]]:
    """(k, MSS) of the run's curve at its polynomial degree's resolution, when ``mss_curve.json`` has it."""
    try:
        data = json.loads((files / "mss_curve.json").read_text())
    except (OSError, ValueError):
        return []
    ks, mss = data.get("k"), data.get("mss")
    if not isinstance(ks, list) or not isinstance(mss, list):
        return []
    return [(int(k), float(v)) for k, v in zip(ks, mss, strict=False) if isinstance(v, (int, float))]


def _description(report: RunReport, job_id: str) -> str:
    s = report.summary
    base = report.identity.base_model if report.identity is not None else report.model.ref
    text = (f"{base} pruned by CAHP (job {job_id}): {s.heads_kept} of {s.heads_total} heads, accuracy "
            f"{s.pruned_accuracy:.4f} (dense {s.dense_accuracy:.4f}).")
    if s.warnings:
        text += " Quality warnings: " + " | ".join(s.warnings)
    return text[:_VALUE_LIMIT]
