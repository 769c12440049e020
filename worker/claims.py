"""What a worker claimed, as typed records, and the engine's request built from them.

A job's row is read once, inside the transaction that claims it, into a frozen :class:`JobDefinition`
(so no ORM object outlives its session and nothing further down reads the row's JSON by key);
:class:`ClaimedJob` adds the attempt. :func:`run_request` turns a definition and the inputs fetched for it
into the engine's :class:`~cahp_engine.run.RunRequest`: the job's run (:mod:`worker.runner`) and a
budget piece's rebuilt search inputs (:mod:`worker.candidates`) build it the same way.

Each input has two names here, as in the engine: ``uri`` is the reference the job was submitted with
(``hf://``, ``upload://``, ``s3://``, ``file://``), which the report and the log show
(``RunRequest.model_shown_as``); ``name`` is its readable name worked out at submit (a hub id, an
uploaded archive's or a directory's name), which the report's identity and the cards show
(``RunIdentity.base_model``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from app.core.db import BudgetPiece, Job
from app.core.mlflow_registry import RegisterRequest
from app.core.params import dataset_options
from app.core.settings import Settings
from cahp_engine.config import PruningConfig
from cahp_engine.data import DatasetOptions
from cahp_engine.run import CandidateSpec, RunIdentity, RunRequest


class FetchedInputs(Protocol):
    """Inputs fetched into the worker's scratch space (:meth:`app.core.inputs.InputFetcher.prepare`)."""

    @property
    def model_ref(self) -> str: ...

    @property
    def dataset_ref(self) -> str: ...


@dataclass(frozen=True)
class ModelInput:
    """A job's model: the reference it was submitted with, the hub revision, its readable name."""

    uri: str
    revision: str | None = None
    name: str | None = None

    def as_submitted(self) -> dict[str, Any]:
        """The ``{"uri", "revision"}`` record :meth:`~app.core.inputs.InputFetcher.prepare` reads."""
        return {"uri": self.uri, "revision": self.revision}

    def hub_id(self) -> str | None:
        return self.uri.removeprefix("hf://") if self.uri.startswith("hf://") else None


@dataclass(frozen=True)
class DatasetInput:
    """A job's dataset: the reference it was submitted with, its readable name, and the record as submitted.

    ``record`` holds the URIs and the split and column options (``JobCreate.dataset``); the fetcher and
    the fetched inputs' check read it, and :meth:`options` checks it again (a row may predate a rule).
    """

    uri: str
    name: str | None = None
    record: Mapping[str, Any] = field(default_factory=dict)

    def options(self) -> DatasetOptions:
        """The engine's options of this dataset; raises :class:`~cahp_engine.errors.DatasetError` for one
        it refuses."""
        return dataset_options(self.record)

    def hub_id(self) -> str | None:
        if not self.uri.startswith("hf://"):
            return None
        return self.uri.removeprefix("hf://").removeprefix("datasets/")


@dataclass(frozen=True)
class JobDefinition:
    """What a job asks for, copied from its row.

    ``params`` are the stored settings (a full :class:`PruningConfig` minus ``device``), checked again by
    :func:`app.core.params.run_config` where the run starts; ``register`` is the MLflow registration the
    job asked for, if any.
    """

    id: str
    owner_id: str
    model: ModelInput
    dataset: DatasetInput
    params: Mapping[str, Any]
    name: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    register: RegisterRequest | None = None

    @classmethod
    def of(cls, job: Job) -> JobDefinition:
        """The definition of ``job``, read inside the session that loaded it."""
        dataset = dict(job.dataset)
        return cls(id=job.id, owner_id=job.owner_id,
                   model=ModelInput(uri=job.model_uri, revision=job.model_revision, name=job.model_name),
                   dataset=DatasetInput(uri=str(dataset["uri"]), name=job.dataset_name, record=dataset),
                   params=dict(job.params), name=job.name, labels=dict(job.labels or {}),
                   register=RegisterRequest.from_dict(job.register) if job.register else None)

    def identity(self) -> RunIdentity:
        """The engine's :class:`RunIdentity` of the job: hub ids of ``hf://`` inputs, else their readable names."""
        return RunIdentity(name=self.name, job_id=self.id, labels=dict(self.labels), base_model=self.model.name,
                           base_model_hub_id=self.model.hub_id(), dataset=self.dataset.name,
                           dataset_hub_id=self.dataset.hub_id())


@dataclass(frozen=True)
class ClaimedJob:
    """A job this worker holds: its definition and the attempt it is on."""

    job: JobDefinition
    attempt: int


def latency_cache_dir(settings: Settings) -> Path:
    """Where this worker keeps the latency tables of speed targets: ``data_dir/cache/latency``, on the data
    volume, so a table measured once serves every later job on the machine, container restarts included."""
    return settings.data_dir / "cache" / "latency"


def run_request(job: JobDefinition, config: PruningConfig, fetched: FetchedInputs, output: Path,
                settings: Settings) -> RunRequest:
    """The engine's request for ``job`` run with ``config`` on the inputs ``fetched`` into the worker's scratch
    space, writing to ``output``, under the worker's limits and hub access."""
    return RunRequest(
        model_ref=fetched.model_ref, dataset_ref=fetched.dataset_ref, output_dir=output, config=config,
        dataset_options=job.dataset.options(),
        # The report and the log show the job's URIs, never the worker's scratch paths.
        model_shown_as=job.model.uri, dataset_shown_as=job.dataset.uri,
        identity=job.identity(), revision=job.model.revision,
        hub_token=settings.hub_token.get_secret_value() if settings.hub_token else None,
        cache_dir=str(settings.hub_cache_dir) if settings.hub_cache_dir else None,
        max_dataset_rows=settings.max_dataset_rows, max_model_params=settings.model_params_limit,
        latency_cache_dir=latency_cache_dir(settings),
    )


@dataclass(frozen=True)
class ClaimedPiece:
    """A piece of an accuracy budget's search this worker holds: its job's attempt, the candidate, the state
    it goes on from (None: from the start)."""

    id: str
    job_id: str
    attempt: int
    spec: Mapping[str, Any]
    resume_from: str | None = None

    @classmethod
    def of(cls, row: BudgetPiece) -> ClaimedPiece:
        """The piece of ``row``, read inside the session that claimed it."""
        return cls(id=row.id, job_id=row.job_id, attempt=row.attempt, spec=dict(row.spec),
                   resume_from=row.resume_from)

    def candidate(self) -> CandidateSpec:
        """The candidate to train (parsed where the piece runs, so a bad one fails the piece, not the claim)."""
        return CandidateSpec.from_dict(dict(self.spec))
