"""Generic torch helpers the engine's stages share: devices, a model's inputs, its size."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator, Mapping

import torch
from torch import nn

from cahp_engine.errors import InvalidInputError


def as_device(device: torch.device | str) -> torch.device:
    """Parse ``device``, refusing a CUDA device this machine does not have."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise InvalidInputError(f"`device` must be cpu, cuda or cuda:N, got {device!r}") from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise InvalidInputError(f"`device` is {device!r} but CUDA is not available here; use device='cpu'")
    return dev


def resolve_device(device: str) -> torch.device:
    """``auto`` -> the first CUDA device when there is one, else the CPU; any other name as :func:`as_device`.

    The spelling of a configured name is checked earlier, by :func:`~cahp_engine.config.parse_device`.
    """
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return as_device(device)


def model_inputs(model: nn.Module, batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tensors of ``batch`` the model's forward names, without ``labels``.

    DistilBERT takes no ``token_type_ids`` (it would swallow them in ``**kwargs``), and the loss is
    computed by the caller, so both are dropped here.
    """
    accepted = inspect.signature(model.forward).parameters
    return {k: v for k, v in batch.items() if k != "labels" and k in accepted}


def num_parameters(model: nn.Module) -> int:
    """Every parameter of ``model``, tied ones once (``nn.Module.parameters`` skips repeats)."""
    return int(sum(p.numel() for p in model.parameters()))


@contextlib.contextmanager
def frozen_in_eval(model: nn.Module) -> Iterator[None]:
    """``model`` in eval mode with no parameter asking for gradients, while the context is open.

    What importance scores by gate gradients need: dropout off, and the backward pass reaching the gates
    only. The mode and every parameter's ``requires_grad`` are restored on the way out, whatever happens.
    """
    was_training = model.training
    flags = [(p, p.requires_grad) for p in model.parameters()]
    model.eval()
    try:
        for p, _ in flags:
            p.requires_grad_(False)
        yield
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)
        model.train(was_training)
