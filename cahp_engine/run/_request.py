"""What a run is asked to do: one frozen :class:`RunRequest`, the argument of :func:`~cahp_engine.run.run_pruning`.

The request says what to read, with which settings, under which limits, where to write and who the
model is; what a caller wants to hear back while it runs (progress, log, cancel, the resume store, who runs
an accuracy budget's candidates) is :class:`~cahp_engine.run.RunHooks`. A model has two names here,
each with its own field: ``model_ref`` is where the run reads it (a local directory or a hub id, in
the job service a scratch copy), ``model_shown_as`` what the report and the log call it (the job
service: the job's URI, so no worker path reaches a caller). Its readable name, the one a person gave
it (an uploaded archive's name), is ``identity.base_model``. The same holds for the dataset.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from cahp_engine.config import PruningConfig
from cahp_engine.data import DEFAULT_MAX_ROWS, DatasetOptions
from cahp_engine.models import DEFAULT_MAX_MODEL_PARAMS
from cahp_engine.run._identity import RunIdentity

__all__ = ["RunRequest"]


@dataclass(frozen=True)
class RunRequest:
    """One pruning run: its inputs, its settings, its limits, its output and what the caller knows of the model.

    Attributes
    ----------
    model_ref : str
        Where the run reads the model: a local directory or a hub id.
    dataset_ref : str
        Where the run reads the dataset: a local directory or a hub dataset id
        (see :func:`~cahp_engine.data.load_splits`).
    output_dir : path
        Must not exist or be empty (unless ``overwrite``). Receives ``model/`` and :data:`ARTIFACT_FILES`.
    config : PruningConfig
    dataset_options : DatasetOptions
        Splits and columns to read.
    model_shown_as, dataset_shown_as : str or None
        What the report (``model.ref``, ``dataset.ref``) and the log call the inputs; None: ``model_ref``
        and ``dataset_ref``. A caller that copied its inputs somewhere private passes the references its
        own caller gave (the job service: the job's URIs), so no private path reaches them.
    identity : RunIdentity or None
        What the caller knows of the model that the inputs cannot say: its name, the job and its labels,
        the readable names of uploaded inputs (``identity.base_model``, ``identity.dataset``).
        ``report.identity`` adds what the inputs say (hub ids, the checkpoint's ``_name_or_path``).
    revision, hub_token, cache_dir : str or None
        Hub access for the model and the dataset (the token is left out of ``repr``).
    overwrite : bool
        Replace a non-empty ``output_dir`` (only once the run has succeeded).
    max_dataset_rows : int or None
        Most rows a dataset split may have; a larger split is refused before it is read
        (:data:`~cahp_engine.data.DEFAULT_MAX_ROWS`; None for no limit).
    max_model_params : int
        Most parameters the model may declare (a pruned one: before pruning); a larger model, or one whose
        weights do not fit its config, is refused before it is allocated
        (:data:`~cahp_engine.models.DEFAULT_MAX_MODEL_PARAMS`).
    latency_cache_dir : path or None
        Where a speed target's latency tables are kept between runs (one file per machine, model shape,
        runtime and serving shape); None: ``$XDG_CACHE_HOME/cahp/latency``. The job service names a
        directory on its data volume, so a worker measures a table once, not once per container.
    """

    model_ref: str
    dataset_ref: str
    output_dir: Path | str
    config: PruningConfig
    dataset_options: DatasetOptions = field(default_factory=DatasetOptions)
    model_shown_as: str | None = None
    dataset_shown_as: str | None = None
    identity: RunIdentity | None = None
    revision: str | None = None
    hub_token: str | None = field(default=None, repr=False)
    cache_dir: str | None = None
    overwrite: bool = False
    max_dataset_rows: int | None = DEFAULT_MAX_ROWS
    max_model_params: int = DEFAULT_MAX_MODEL_PARAMS
    latency_cache_dir: Path | str | None = None

    @property
    def model_shown(self) -> str:
        """What the report and the log call the model."""
        return self.model_shown_as or self.model_ref

    @property
    def dataset_shown(self) -> str:
        """What the report and the log call the dataset."""
        return self.dataset_shown_as or self.dataset_ref
