"""Builders shared by the service tests (api, worker, e2e): settings, keys, tiny models and datasets."""

from __future__ import annotations

import csv
import os
import socket
import tarfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, make_url, text
from sqlalchemy.exc import OperationalError

from app.core.db import make_engine, make_session_factory, upgrade_database
from app.core.security import create_api_key
from app.core.settings import Settings
from tests.support.tiny_models import make_classifier, make_texts, make_tokenizer


def service_settings(tmp_path: Path, **overrides: Any) -> Settings:
    """Settings with everything under ``tmp_path`` and no throttling (tests see every write).

    The sweeper is off unless a test turns it on (``sweep_interval_s``), so that no background
    thread changes rows a test is looking at.
    """
    local = tmp_path / "local"
    local.mkdir(exist_ok=True)
    values: dict[str, Any] = {
        "data_dir": tmp_path / "cahp-data",
        "allowed_local_roots": (local,),
        "max_upload_bytes": 512 * 1024,
        "progress_interval_s": 0.0,
        "cancel_check_interval_s": 0.0,
        "device": "cpu",
        "sweep_interval_s": 0.0,
    }
    values.update(overrides)
    return Settings(**values)


def migrated_engine(settings: Settings) -> Engine:
    engine = make_engine(settings.resolved_database_url)
    upgrade_database(engine)
    return engine


def new_key(engine: Engine, name: str = "tester") -> str:
    with make_session_factory(engine)() as session:
        return create_api_key(session=session, name=name)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def write_tiny_model(directory: Path, *, family: str = "bert", num_labels: int = 3) -> Path:
    """A random tiny classifier and its tokenizer, saved as a Hugging Face directory."""
    model = make_classifier(family, num_labels=num_labels)
    model.save_pretrained(directory)
    make_tokenizer().save_pretrained(directory)
    return directory


def write_split(path: Path, n: int, *, seed: int, num_classes: int = 3) -> Path:
    texts, labels = make_texts(n, num_classes=num_classes, seed=seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["text", "label"])
        writer.writerows(zip(texts, labels.tolist(), strict=True))
    return path


def write_tiny_dataset(directory: Path, *, train: int = 60, test: int = 30) -> Path:
    """``train.csv`` and ``test.csv`` with three learnable classes."""
    write_split(directory / "train.csv", train, seed=1)
    write_split(directory / "test.csv", test, seed=2)
    return directory


def tar_directory(directory: Path, archive: Path) -> Path:
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(directory, arcname=directory.name)
    return archive


#: Pruning settings that keep a tiny job to seconds on one core. The ONNX export (on by default) is
#: off here; the tests of the export turn it on.
TINY_PARAMS: dict[str, Any] = {"epochs": 1, "dense_finetune": "never", "untrained_dense": "warn", "batch_size": 16,
                               "max_length": 32,
                               "seed": 0, "export": "none"}


def job_body(model_uri: str, dataset_uri: str, **params: Any) -> dict[str, Any]:
    return {"model": {"uri": model_uri}, "dataset": {"uri": dataset_uri}, "params": {**TINY_PARAMS, **params}}


POSTGRES_URL = os.environ.get("CAHP_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


@contextmanager
def postgres_schema_url() -> Iterator[str]:
    """A URL whose connections live in a new, uniquely named schema, dropped afterwards.

    Skips the test when the server cannot be reached (CI starts it; see .ci/run).
    """
    import pytest

    admin = create_engine(POSTGRES_URL, connect_args={"connect_timeout": 3})
    try:
        with admin.connect() as connection:
            connection.execute(text("SELECT 1"))
    except OperationalError as exc:
        admin.dispose()
        pytest.skip(f"PostgreSQL at {POSTGRES_URL} is unreachable ({exc.__class__.__name__}); start it to run this")
    schema = f"cahp_test_{uuid.uuid4().hex[:12]}"
    with admin.begin() as connection:
        connection.execute(text(f'CREATE SCHEMA "{schema}"'))
    url = make_url(POSTGRES_URL).update_query_dict({"options": f"-csearch_path={schema}"})
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.begin() as connection:
            connection.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@contextmanager
def moto_s3_server() -> Iterator[str]:
    """moto's S3-compatible HTTP server on a free loopback port; yields its endpoint URL."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()
