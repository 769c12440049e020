"""The MLflow registration's bodies: what a job asks (``register``) and how it went (``registration``)."""

from __future__ import annotations

import datetime as dt
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from app.core.labels import MAX_LABELS, check_labels
from app.core.mlflow_registry import reserved_tags


class RegisterSpec(BaseModel):
    """Register the pruned model in the operator's MLflow model registry when the job succeeds."""

    model_config = ConfigDict(extra="forbid")

    model_name: str = Field(
        min_length=1, max_length=256, pattern=r"^[A-Za-z0-9][A-Za-z0-9._\-/ ]*$",
        description="The registered model to add a version to (created if new), e.g. `sst5-sentiment`",
        examples=["sst5-sentiment"],
    )
    tags: dict[str, str] = Field(
        default_factory=dict, max_length=MAX_LABELS,
        description="Tags of the new model version, beside the ones cahp sets (`cahp.job_id`, `cahp.base_model`, "
        "the job's labels as `label.<key>`); tags under `cahp.` and `mlflow.` are the service's and refused",
    )
    description: str | None = Field(default=None, max_length=5000, description="The new version's description")

    @field_validator("tags")
    @classmethod
    def _check_tags(cls, value: dict[str, str]) -> dict[str, str]:
        reserved = reserved_tags(value)
        if reserved:
            raise ValueError(
                f"tags under `cahp.` and `mlflow.` are set by the service (its provenance), not by a job; remove or "
                f"rename {', '.join(repr(k[:60]) for k in reserved[:5])}")
        return check_labels(value)


class RegistrationPublic(BaseModel):
    """Where the job's model went in the MLflow registry."""

    status: Literal["registered", "failed"]
    model_name: str
    version: str | None = Field(default=None, description="The new model version")
    run_id: str | None = Field(default=None, description="The MLflow run holding the artifacts")
    model_uri: str | None = Field(default=None, description="`models:/<name>/<version>`")
    tracking_uri: str | None = None
    error: str | None = None
    registered_at: dt.datetime | None = None
