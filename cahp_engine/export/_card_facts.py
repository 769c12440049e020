"""The facts a model card states (:class:`ModelCardInputs`, :class:`SpeedFigure`): plain typed data.

:mod:`cahp_engine.export._card_body` writes them as the card's text and
:mod:`cahp_engine.export._model_card` as its metadata.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from cahp_engine.errors import InvalidInputError

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")
#: What a card may describe: the PyTorch checkpoint, the ONNX graph or its int8 copy.
VARIANTS = ("pytorch", "onnx", "onnx-int8")


@dataclass(frozen=True)
class SpeedFigure:
    """One latency measurement shown on the card.

    ``speedup`` is the baseline's p50 over this one's, at the same batch size and length (the baseline
    is :attr:`ModelCardInputs.speed_baseline`, the dense PyTorch model in a pruning run);
    ``speedup_low`` and ``speedup_high`` bound its 95 % interval, and ``p25_ms``/``p75_ms`` give the
    spread of the timed passes. ``current`` marks the rows of the model the card describes.
    """

    runtime: str
    model: str
    batch_size: int
    seq_len: int
    p50_ms: float
    speedup: float | None = None
    speedup_low: float | None = None
    speedup_high: float | None = None
    p25_ms: float | None = None
    p75_ms: float | None = None
    current: bool = False


@dataclass(frozen=True)
class ModelCardInputs:
    """What the card says about a pruned classifier; None (or empty) leaves a fact out.

    Attributes
    ----------
    family : model family, e.g. ``"bert"``
    num_layers, num_heads : int
        Layers and heads per layer of the unpruned architecture.
    kept_heads : tuple of num_layers tuples of int
        Original indices of the heads each layer keeps.
    neurons_per_layer, num_neurons : feed-forward neurons each layer keeps, of ``num_neurons``; empty when
        the neurons were not pruned
    base_model : the model that was pruned, by name (a hub id, or a directory's or archive's name)
    base_model_hub_id : its Hugging Face hub id, for the ``base_model`` metadata (default: ``base_model``
        when it has the form ``org/name``)
    dataset, eval_split : the dataset the figures were measured on, by name, and its split
    dataset_hub_id : its hub id, for the ``datasets`` metadata (default: ``dataset`` when it reads ``org/name``)
    label_names : class names, index i for class i
    strategy, k_star, poly_degree : how the heads were chosen (CAHP's k* and Kneedle degree)
    dense_accuracy, accuracy_before_recovery, pruned_accuracy, onnx_accuracy, int8_accuracy : float in [0, 1]
    dense_macro_f1, pruned_macro_f1, onnx_macro_f1, int8_macro_f1 : float in [0, 1]
    recall : mapping of model label -> per-class recall (None for a class absent from the split)
    dense_parameters, pruned_parameters : int
    speed : latency figures, see :class:`SpeedFigure`
    speed_baseline : what the speed-ups are relative to (the dense PyTorch model in a pruning run)
    onnx_max_abs_diff : the ONNX export's parity figure (used when ``parity_max_abs_diff`` is not given)
    variant : {"pytorch", "onnx", "onnx-int8"}
        The directory the card describes: its accuracy goes into ``model-index``, its parity is quoted.
    parity_max_abs_diff, parity_agreement : this directory's graph against the pruned PyTorch model
        (for ``pytorch``: the checkpoint reloaded against the model in memory)
    model_name : the title (a job's name); default ``"<base> (CAHP-pruned, k/N heads)"``
    job_id, labels, cahp_version : where the model came from (the job, its labels, the cahp release)
    recipe : lines saying how the model was made (head, dense fine-tuning, selection, recovery)
    warnings : quality warnings, shown first and in the metadata
    license : optional metadata
    """

    family: str
    num_layers: int
    num_heads: int
    kept_heads: tuple[tuple[int, ...], ...]
    base_model: str | None = None
    dataset: str | None = None
    eval_split: str | None = None
    label_names: tuple[str, ...] = ()
    strategy: str | None = None
    k_star: int | None = None
    poly_degree: int | None = None
    dense_accuracy: float | None = None
    accuracy_before_recovery: float | None = None
    pruned_accuracy: float | None = None
    int8_accuracy: float | None = None
    dense_parameters: int | None = None
    pruned_parameters: int | None = None
    speed: tuple[SpeedFigure, ...] = ()
    speed_baseline: str = "the dense PyTorch model"
    onnx_max_abs_diff: float | None = None
    license: str | None = None
    model_name: str | None = None
    base_model_hub_id: str | None = None
    dataset_hub_id: str | None = None
    onnx_accuracy: float | None = None
    dense_macro_f1: float | None = None
    pruned_macro_f1: float | None = None
    onnx_macro_f1: float | None = None
    int8_macro_f1: float | None = None
    recall: Mapping[str, tuple[float | None, ...]] = field(default_factory=dict)
    variant: str = "pytorch"
    parity_max_abs_diff: float | None = None
    parity_agreement: float | None = None
    job_id: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    cahp_version: str | None = None
    recipe: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    neurons_per_layer: tuple[int, ...] = ()
    num_neurons: int | None = None

    def __post_init__(self) -> None:
        if len(self.kept_heads) != self.num_layers:
            raise InvalidInputError(
                f"`kept_heads` must list all {self.num_layers} layers, got {len(self.kept_heads)}"
            )
        for layer, heads in enumerate(self.kept_heads):
            if any(not 0 <= h < self.num_heads for h in heads):
                raise InvalidInputError(
                    f"`kept_heads[{layer}]` must hold head indices in [0, {self.num_heads}), got {list(heads)}"
                )
        if self.neurons_per_layer and (len(self.neurons_per_layer) != self.num_layers or self.num_neurons is None
                                       or any(not 0 <= n <= self.num_neurons for n in self.neurons_per_layer)):
            raise InvalidInputError(
                f"`neurons_per_layer` must give all {self.num_layers} layers a count in [0, `num_neurons`], got "
                f"{list(self.neurons_per_layer)} of {self.num_neurons}"
            )
        if self.variant not in VARIANTS:
            raise InvalidInputError(f"`variant` must be one of {', '.join(VARIANTS)}, got {self.variant!r}")

    @property
    def heads_total(self) -> int:
        return self.num_layers * self.num_heads

    @property
    def heads_kept(self) -> int:
        return sum(len(h) for h in self.kept_heads)

    @property
    def base_hub_id(self) -> str | None:
        """The hub id the metadata names as ``base_model``: the one given, else ``base_model`` when it reads
        ``org/name`` (a bare name may be a directory's)."""
        return self.base_model_hub_id or (self.base_model if _namespaced(self.base_model) else None)

    @property
    def dataset_hub_id_or_none(self) -> str | None:
        return self.dataset_hub_id or (self.dataset if _namespaced(self.dataset) else None)

    def _of_this_directory(self, metric: str) -> float | None:
        """``metric`` (``accuracy``, ``macro_f1``) of the int8 graph, of the ONNX graph (else the PyTorch
        model's), or of the model, as the variant says."""
        if self.variant == "onnx-int8":
            return getattr(self, f"int8_{metric}")
        onnx = getattr(self, f"onnx_{metric}")
        return onnx if self.variant == "onnx" and onnx is not None else getattr(self, f"pruned_{metric}")

    @property
    def accuracy(self) -> float | None:
        """This directory's accuracy: the int8 graph's, the ONNX graph's (else the PyTorch model's), or the model's."""
        return self._of_this_directory("accuracy")

    @property
    def macro_f1(self) -> float | None:
        return self._of_this_directory("macro_f1")

    @property
    def title(self) -> str:
        if self.model_name:
            return self.model_name
        base = self.base_model or f"{self.family} classifier"
        base = base.rstrip("/").split("/")[-1] if is_hub_id(base) else Path(base).name or base
        return f"{base} (CAHP-pruned, {self.heads_kept}/{self.heads_total} heads)"


def is_hub_id(ref: str | None) -> bool:
    """Whether ``ref`` has the form of a hub id (``name`` or ``org/name``), not of a path or a URI."""
    return ref is not None and bool(_HUB_ID.match(ref)) and ".." not in ref


def _namespaced(ref: str | None) -> bool:
    return ref is not None and "/" in ref and is_hub_id(ref)
