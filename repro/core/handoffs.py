"""The hand-offs to outside engines, as repro names them: by module, here and nowhere else in repro.

The code that meets an outside engine lives in the top-level package ``integrations/`` (vLLM as a rollout
engine and its checkpoint layouts, NeMo-RL at paper scale), which builds on repro and kernels; repro never
imports it at module import. Where a repro run has to reach one (a profile whose rollout_backend is ``vllm``,
a draft spec naming a released EAGLE-3 checkpoint, a run folder whose env.json says engine ``nemo-rl``, the
workflow's NeMo-RL rows), it finds the module's dotted name here and imports it only when that run asks for
it, so a run that uses no integration never loads one.

    engine_cls = rollout_engine("vllm")       # integrations.vllm.engine.VllmRolloutEngine
    build = draft_loader("eagle3")            # integrations.vllm.load.build_eagle3_from_checkpoint
    mapper = metric_mapper("nemo-rl")         # integrations.nemo_rl.metrics.nemo_rl_mapper
    export = policy_exporter("vllm")          # integrations.vllm.export.export_policy
    python -m integrations.nemo_rl.run --list # NEMO_RL_RUN: the module the workflow launches for a NeMo-RL row
"""
from __future__ import annotations

import importlib

# rollout_backend (repro.core.specs.ROLLOUT_BACKENDS, less the suite's own "suite") -> its engine class, whose
# from_models(policy, draft, workdir=..., max_model_len=..., seed=...) exports the models and starts it
ROLLOUT_ENGINES = {"vllm": "integrations.vllm.engine:VllmRolloutEngine"}
# draft family (repro.core.specs.DRAFT_CHECKPOINT_FAMILIES) -> the builder of its draft from a released checkpoint,
# called (policy, path, **family options)
DRAFT_LOADERS = {"eagle3": "integrations.vllm.load:build_eagle3_from_checkpoint"}
# engine named in a run folder's env.json (other than "suite") -> its metric mapper (repro.report.collect.Mapper)
METRIC_MAPPERS = {"nemo-rl": "integrations.nemo_rl.metrics:nemo_rl_mapper"}
NEMO_RL_RUN = "integrations.nemo_rl.run"   # the module repro.plan launches for a NeMo-RL row
# the decode benchmark's vllm peer when vLLM lives in another interpreter (repro.rollout.peers): the policy's export
# into the layout vLLM loads, and the module that serves vLLM's decoding there
POLICY_EXPORTERS = {"vllm": "integrations.vllm.export:export_policy"}
VLLM_PEER_SERVER = "integrations.vllm.peer_server"


def _load(table: dict[str, str], key: str, what: str):
    if key not in table:
        raise ValueError(f"no {what} {key!r}; known: {sorted(table)}")
    module, _, name = table[key].partition(":")
    return getattr(importlib.import_module(module), name)


def rollout_engine(backend: str):
    """The engine class of the outside rollout backend ``backend`` (a key of ``ROLLOUT_ENGINES``)."""
    return _load(ROLLOUT_ENGINES, backend, "outside rollout engine")


def draft_loader(family: str):
    """The builder of a ``family`` draft from a released checkpoint (a key of ``DRAFT_LOADERS``)."""
    return _load(DRAFT_LOADERS, family, "released-checkpoint loader for draft family")


def policy_exporter(engine: str):
    """The function that writes a policy in the checkpoint layout ``engine`` loads (a key of ``POLICY_EXPORTERS``),
    called (policy, folder) -> folder."""
    return _load(POLICY_EXPORTERS, engine, "policy exporter for engine")


def metric_mapper(engine: str):
    """The metric mapper of the outside engine ``engine`` (a key of ``METRIC_MAPPERS``)."""
    return _load(METRIC_MAPPERS, engine, "metric mapper for engine")
