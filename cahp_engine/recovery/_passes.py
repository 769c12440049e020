"""The forward passes layer-wise reconstruction reads: hooked where a system's rows are, and, where the
family allows it, one layer at a time from the previous layer's output kept in memory.

:func:`capture` runs a model (or, given a :class:`Call`, one layer alone) up to a sub-layer's output
projection and hands back that projection's input and the residual the sub-layer's output is added to;
:func:`capture_all` hands back every planned sub-layer's projection output and residual from one whole pass
(the dense model's targets). :func:`layer_calls` learns how the encoder calls each layer, checks that
calling them one after another reproduces the model's own pass, and :func:`advance` moves the calls up a
layer on refit weights.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from cahp_engine._torch import model_inputs
from cahp_engine.errors import InvalidInputError

#: Where each family passes the tensor its feed-forward block's output is added to, as (module of the layer,
#: position of the argument, its keyword name), for families other than BERT's: BERT-like layers call
#: ``output(intermediate, attention_output)``, DistilBERT adds ``ffn``'s own input back, ModernBERT the
#: input of ``mlp_norm`` (pre-LayerNorm).
FFN_RESIDUAL: Mapping[str, tuple[str, int, str]] = {"distilbert": ("ffn", 0, "input"),
                                                     "modernbert": ("mlp_norm", 0, "input")}
BERT_FFN_RESIDUAL = ("output", 1, "input_tensor")


class _Stop(Exception):
    """Raised by a hook once the pass has computed what it was run for."""


def output_projection(adapter: Any, layer: nn.Module, name: str) -> nn.Linear:
    """Layer ``layer``'s output projection of sub-layer ``name`` (``"attention"`` or ``"ffn"``)."""
    if name == "attention":
        return adapter.attention(layer).output
    if adapter.ffn_output_path is None:
        raise AttributeError(f"the {adapter.family} adapter names no feed-forward output projection")
    return operator.attrgetter(adapter.ffn_output_path)(layer)


def _residual_source(adapter: Any, layer: nn.Module, name: str) -> tuple[nn.Module, int, str]:
    """The module whose argument (position, keyword) is what sub-layer ``name``'s output is added to."""
    if name == "attention":
        return layer, 0, "hidden_states"
    path, position, keyword = FFN_RESIDUAL.get(adapter.family, BERT_FFN_RESIDUAL)
    return operator.attrgetter(path)(layer), position, keyword


def _hook_residual(adapter: Any, layer: nn.Module, name: str, keep: Callable[[torch.Tensor], None]) -> Any:
    """Register a hook handing ``keep`` sub-layer ``name``'s residual input at each forward pass."""
    module, position, keyword = _residual_source(adapter, layer, name)

    def on_call(_m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        keep(args[position] if len(args) > position else kwargs[keyword])

    return module.register_forward_pre_hook(on_call, with_kwargs=True)


@dataclass
class Seen:
    """What one pass saw at a sub-layer: its output projection's input, and the residual the sub-layer's
    output is added to."""

    input: torch.Tensor | None = None
    residual: torch.Tensor | None = None


def capture(model: nn.Module, adapter: Any, key: tuple[int, str], batch: Mapping[str, torch.Tensor],
            call: Call | None = None) -> Seen:
    """One forward pass of ``model``, stopped where the output projection of sub-layer ``key`` (layer index,
    ``"attention"`` or ``"ffn"``) is called (the projection itself does not run); with ``call``, a pass of
    that layer alone, called as the model would."""
    index, name = key
    layer = adapter.layers(model)[index]
    hooked = output_projection(adapter, layer, name)
    seen = Seen()

    def on_residual(tensor: torch.Tensor) -> None:
        seen.residual = tensor

    def on_input(_m: nn.Module, args: tuple[Any, ...]) -> None:
        seen.input = args[0]
        raise _Stop

    handles = [_hook_residual(adapter, layer, name, on_residual), hooked.register_forward_pre_hook(on_input)]
    try:
        if call is None:
            model(**model_inputs(model, batch))
        else:
            layer(*call.args, **call.kwargs)
    except _Stop:
        pass
    finally:
        for handle in handles:
            handle.remove()
    return seen


@dataclass(frozen=True)
class Call:
    """How the encoder called one layer for one batch: its arguments, the hidden states first or by name."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]

    @property
    def hidden(self) -> torch.Tensor:
        return self.args[0] if self.args else self.kwargs["hidden_states"]

    def with_hidden(self, hidden: torch.Tensor | None) -> Call:
        if self.args:
            return Call((hidden, *self.args[1:]), self.kwargs)
        return Call(self.args, {**self.kwargs, "hidden_states": hidden})


@dataclass(frozen=True)
class Calls:
    """The pruned model's layers called one after another: for every batch (None without calibration rows),
    how the encoder calls each layer (``templates``, hidden states left out) and the input of layer ``layer``
    on the weights refit so far (``hidden``)."""

    layer: int
    templates: list[list[Call] | None]
    hidden: list[torch.Tensor | None]

    def call(self, batch: int) -> Call | None:
        template, hidden = self.templates[batch], self.hidden[batch]
        return None if template is None or hidden is None else template[self.layer].with_hidden(hidden)


def _calls_of(model: nn.Module, layers: Sequence[nn.Module], batch: Mapping[str, torch.Tensor],
              through: Sequence[int] | None = None) -> tuple[list[Call], list[Any]]:
    """How ``model``'s encoder calls each of ``layers`` on ``batch``, and what each layer returned, from one
    pass. With ``through`` (per layer, the length of the tuple it returns, 0 for a bare tensor), the layers do
    not run: each hands its hidden states straight back in that form, so the pass costs the embeddings and
    the head alone, and only the calls' other arguments (masks, position embeddings) are worth reading."""
    seen: list[Call] = []
    returned: list[Any] = []

    def on_layer(_m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        seen.append(Call(tuple(args), dict(kwargs)))

    def on_return(_m: nn.Module, _args: tuple[Any, ...], output: Any) -> None:
        returned.append(output)

    handles = [layer.register_forward_pre_hook(on_layer, with_kwargs=True) for layer in layers]
    handles += [layer.register_forward_hook(on_return) for layer in layers]
    if through is not None:
        for layer, length in zip(layers, through, strict=True):
            layer.forward = functools.partial(_hand_back, length)
    try:
        model(**model_inputs(model, batch))
    finally:
        for handle in handles:
            handle.remove()
        if through is not None:
            for layer in layers:
                del layer.forward
    return seen, returned


def _hand_back(length: int, *args: Any, **kwargs: Any) -> Any:
    """A layer that returns its hidden states unchanged, as a bare tensor (``length`` 0) or first of a tuple."""
    hidden = Call(args, kwargs).hidden
    return hidden if length == 0 else (hidden, *([None] * (length - 1)))


def _returned_forms(returned: Sequence[Any]) -> list[int] | None:
    """Per layer, the form :func:`_hand_back` must imitate (0: a tensor; n: an n-tuple of the hidden states
    and Nones), or None when a layer returns anything else (attention weights, a cache)."""
    forms = []
    for output in returned:
        if isinstance(output, torch.Tensor):
            forms.append(0)
        elif (isinstance(output, tuple) and output and isinstance(output[0], torch.Tensor)
              and all(item is None for item in output[1:])):
            forms.append(len(output))
        else:
            return None
    return forms


def _same(a: Any, b: Any) -> bool:
    """Whether two calls' arguments are the same values (tensors equal, containers item by item)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
                and a.dtype == b.dtype and bool(torch.equal(a, b)))
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and (a is b or a == b)


def _layer_output(layer: nn.Module, call: Call) -> torch.Tensor:
    out = layer(*call.args, **call.kwargs)
    return out[0] if isinstance(out, tuple) else out


def _chains(layers: Sequence[nn.Module], seen: Sequence[Call]) -> bool:
    """Whether calling ``layers`` one after another from the first call gives every later call's hidden states."""
    call = seen[0]
    for index, layer in enumerate(layers[:-1]):
        want = seen[index + 1].hidden
        call = seen[index + 1].with_hidden(_layer_output(layer, call))
        if call.hidden.shape != want.shape or not torch.allclose(call.hidden, want, rtol=1e-4, atol=1e-5):
            return False
    return True


def layer_calls(pruned: nn.Module, adapter: Any, batches: Sequence[Mapping[str, torch.Tensor]],
                keep: Sequence[torch.Tensor]) -> Calls | None:
    """The pruned model's layers ready to be called one at a time, so that each system runs its own layer
    alone, from the previous layer's output kept in memory (``L`` layer passes in all for ``L`` layers)
    instead of the whole model up to it (about ``L^2 / 2``). What the encoder passes a layer besides its
    hidden states (masks, position embeddings, a layer's own attention window) comes from one pass of the
    model per batch, with the layers handing their input straight back (embeddings and head only) once the
    first batch has shown that this gives the same arguments as the model's own pass. None when calling
    the layers one after another does not give the hidden states of the model's own pass (checked on the
    first batch): every system then runs the model from its embeddings."""
    layers = adapter.layers(pruned)
    templates: list[list[Call] | None] = []
    hidden: list[torch.Tensor | None] = []
    forms: list[int] | None = None
    checked = False
    for batch, rows in zip(batches, keep, strict=True):
        if not bool(rows.any()):
            templates.append(None)
            hidden.append(None)
            continue
        if checked and forms is not None:
            seen, _ = _calls_of(pruned, layers, batch, through=forms)
        else:
            seen, returned = _calls_of(pruned, layers, batch)
        if len(seen) != len(layers):
            return None
        if not checked:
            if not _chains(layers, seen):
                return None
            forms = _returned_forms(returned)
            if forms is not None:
                handed, _ = _calls_of(pruned, layers, batch, through=forms)
                if not _same([(c.args, c.kwargs) for c in handed[:1] + [c.with_hidden(None) for c in handed[1:]]],
                             [(c.args, c.kwargs) for c in seen[:1] + [c.with_hidden(None) for c in seen[1:]]]):
                    forms = None
            checked = True
        hidden.append(seen[0].hidden)
        templates.append([c.with_hidden(None) for c in seen])
    return Calls(0, templates, hidden)


def advance(layers: Sequence[nn.Module], calls: Calls, index: int) -> Calls:
    """``calls`` moved up to layer ``index``: the layers below it run, one after another, on their refit weights."""
    while calls.layer < index:
        layer = layers[calls.layer]
        outputs = [None if c is None else _layer_output(layer, c)
                   for c in (calls.call(b) for b in range(len(calls.hidden)))]
        calls = Calls(calls.layer + 1, calls.templates, outputs)
    return calls


def rows_at(tensor: torch.Tensor | None, keep: torch.Tensor) -> torch.Tensor:
    """The rows of ``tensor`` (B, T, D) at ``keep`` (B, T), as (n, D)."""
    assert tensor is not None, "the forward pass did not reach the hooked projection"
    if tensor.shape[:-1] == keep.shape:
        return tensor[keep.to(tensor.device)]
    raise InvalidInputError(f"cannot align a sub-layer's rows of shape {tuple(tensor.shape)} with the batch's "
                            f"tokens {tuple(keep.shape)}")


def capture_all(model: nn.Module, adapter: Any, plan: list[tuple[int, str]], batch: Mapping[str, torch.Tensor]
                 ) -> tuple[dict[tuple[int, str], torch.Tensor], dict[tuple[int, str], torch.Tensor]]:
    """One whole forward pass of ``model``: every planned sub-layer's residual input and projection output."""
    layers = adapter.layers(model)
    residual: dict[tuple[int, str], torch.Tensor] = {}
    output: dict[tuple[int, str], torch.Tensor] = {}

    def on_output(key: tuple[int, str], _m: nn.Module, _a: tuple[Any, ...], result: torch.Tensor) -> None:
        output[key] = result

    handles = [_hook_residual(adapter, layers[key[0]], key[1], functools.partial(residual.__setitem__, key))
               for key in plan]
    handles += [output_projection(adapter, layers[key[0]], key[1]).register_forward_hook(
        functools.partial(on_output, key)) for key in plan]
    try:
        model(**model_inputs(model, batch))
    finally:
        for handle in handles:
            handle.remove()
    return residual, output
