"""What a job may set, in one place: pruning settings and dataset options, and what only a worker sets.

A job's settings (:data:`JOB_PARAMS`) are the engine's settings declared for the API
(:func:`cahp_engine.config.settings_for`); the others, :data:`SERVICE_ONLY_PARAMS`, are the
worker's: where a job runs (``device``) is set by ``CAHP_DEVICE``, not by the client. The API
stores the validated settings without it (:func:`stored_params`); the worker adds its own
(:func:`run_config`). Dataset options are
:class:`~cahp_engine.data.DatasetOptions`' fields, read from the job's ``dataset`` record.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cahp_engine.config import SETTINGS, PruningConfig, settings_for
from cahp_engine.data import DATASET_OPTION_FIELDS, DatasetOptions

#: The settings a job's ``params`` may hold, in PruningConfig's order.
JOB_PARAMS: tuple[str, ...] = tuple(s.name for s in settings_for("api"))
#: PruningConfig fields a client may not set (``device``).
SERVICE_ONLY_PARAMS = frozenset(s.name for s in SETTINGS) - frozenset(JOB_PARAMS)


def stored_params(given: Mapping[str, Any]) -> dict[str, Any]:
    """Validate the settings a client gave and return the full effective set to store (no ``device``).

    Raises
    ------
    ConfigError
        With the engine's own message for an unknown name or a value out of range.
    """
    params = PruningConfig.from_dict(dict(given)).to_dict()
    for name in SERVICE_ONLY_PARAMS:
        params.pop(name, None)
    return params


def run_config(stored: Mapping[str, Any], *, device: str) -> PruningConfig:
    """The configuration a worker runs a job with: the stored settings on the worker's ``device``."""
    return PruningConfig.from_dict({**stored, "device": device})


def dataset_options(dataset: Mapping[str, Any]) -> DatasetOptions:
    """The dataset options of a job's ``dataset`` record (the URIs in it are not options).

    Raises
    ------
    DatasetError
        For a split name or column option the engine refuses.
    """
    return DatasetOptions(**{name: dataset[name] for name in DATASET_OPTION_FIELDS if name in dataset})
