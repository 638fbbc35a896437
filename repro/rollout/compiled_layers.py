"""The policy's decoder layers under ``torch.compile``, one compilation serving every layer (regional compilation,
the engine's "compiled" mode; its graphs: docs/engine.md; and the update's forward and backward under
``grpo.compile_layers``). Outside the block the layers are the model's own.

    with torch.no_grad(), compiled_layers(policy, "inductor"):
        out = policy.decode_step_static(ids, positions, cache, cursor=cursor, view=view)
    with compiled_layers(policy, "inductor", purpose="train"):     # a separate compilation: its own graphs
        out = policy.forward_train(ids, attention_mask=att)
"""
from __future__ import annotations

import contextlib
import functools

import torch

RECOMPILE_LIMIT = 32     # graphs per layer class: dtypes x batch one/more x step width one/k+1 x layer 0/rest
_COMPILED: dict = {}     # (layer class, backend, purpose) -> the compiled forward (holds no layer)


def compiled_forward(layer_cls: type, backend: str, purpose: str = "decode"):
    """The one ``torch.compile`` of ``layer_cls.forward`` for ``backend`` and ``purpose`` in this process (decode
    steps and training forwards compile apart, so neither uses up the other's recompile budget)."""
    key = (layer_cls, backend, purpose)
    if key not in _COMPILED:
        _COMPILED[key] = torch.compile(layer_cls.forward, backend=backend, dynamic=True)
    return _COMPILED[key]


@contextlib.contextmanager
def compiled_layers(policy, backend: str | None = "inductor", purpose: str = "decode"):
    """Inside the block, every decoder layer of ``policy`` runs its class's compiled ``forward``; with ``backend``
    None the layers stay as they are (a caller's uncompiled path)."""
    if backend is None:
        yield
        return
    layers = list(policy.decoder_layers())
    for layer in layers:
        if "forward" in vars(layer):
            raise RuntimeError(f"decoder layer {type(layer).__name__} already has its own forward (nested "
                               "compiled_layers, or another wrapper): refusing to replace it")
        layer.forward = functools.partial(compiled_forward(type(layer), backend, purpose), layer)
    try:
        with torch._dynamo.config.patch(allow_unspec_int_on_nn_module=True, recompile_limit=RECOMPILE_LIMIT):
            yield
    finally:
        for layer in layers:
            vars(layer).pop("forward", None)
