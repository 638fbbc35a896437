"""The policy's decoder layers under ``torch.compile``, one compilation serving every layer (regional compilation).

``with compiled_layers(policy, "inductor"): policy.decode_step_static(...)`` runs each decoder layer through one
``torch.compile(type(layer).forward, dynamic=True)`` shared by all layers of that class (and by every policy and
engine of the process); the embedding, rotary tables, final norm and head stay eager, as do the tap hooks, which
run around each layer's ``forward``. Outside the block the layers are the model's own again, so training and the
prefill never meet the compiled code.

Why per layer: dynamo traces a whole 28-layer step as one graph and inductor lowers every layer of it again, so
compile time grows with depth; traced once per layer class, it does not. The layer index is an ``int`` attribute of
each attention module; under ``allow_unspec_int_on_nn_module`` it is an input of the graph instead of a constant
to guard on, and the static cache (``repro.decoding.policy_cache.SlotCache``) selects its keys/values by it as a
tensor index. So one graph serves all layers; a new graph comes per dtype, for a batch of one (dynamo specialises
sizes 0 and 1), and once when the attention view first changes (it then compiles the view as a symbol).

    from repro.rollout.compiled_layers import compiled_layers
    with torch.no_grad(), compiled_layers(policy, "inductor"):
        out = policy.decode_step_static(ids, positions, cache, cursor=cursor, view=view)
"""
from __future__ import annotations

import contextlib
import functools

import torch

RECOMPILE_LIMIT = 32     # graphs per layer class: dtypes x (batch of one, larger) x layer kinds, with room
_COMPILED: dict = {}     # (layer class, backend) -> the compiled forward (holds no layer)


def compiled_forward(layer_cls: type, backend: str):
    """The one ``torch.compile`` of ``layer_cls.forward`` for ``backend`` in this process."""
    key = (layer_cls, backend)
    if key not in _COMPILED:
        _COMPILED[key] = torch.compile(layer_cls.forward, backend=backend, dynamic=True)
    return _COMPILED[key]


@contextlib.contextmanager
def compiled_layers(policy, backend: str = "inductor"):
    """Inside the block, every decoder layer of ``policy`` runs its class's compiled ``forward``."""
    layers = list(policy.decoder_layers())
    for layer in layers:
        if "forward" in vars(layer):
            raise RuntimeError(f"decoder layer {type(layer).__name__} already has its own forward (nested "
                               "compiled_layers, or another wrapper): refusing to replace it")
        layer.forward = functools.partial(compiled_forward(type(layer), backend), layer)
    try:
        with torch._dynamo.config.patch(allow_unspec_int_on_nn_module=True, recompile_limit=RECOMPILE_LIMIT):
            yield
    finally:
        for layer in layers:
            vars(layer).pop("forward", None)
