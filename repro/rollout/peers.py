"""Decoders a user would pick instead of the suite's engine, on the same policy weights: the decode benchmark's peers.

* ``hf-static-compile``: transformers ``generate`` with a ``StaticCache`` and its own compilation of the forward
  (``generation_config.compile_config``: ``torch.compile(mode="reduce-overhead", fullgraph=True)``, CUDA graphs on
  a GPU; transformers compiles on every device here, inductor's CPU kernels on a CPU). Wrapping the forward in
  ``torch.compile`` by hand instead breaks on a GPU: generate keeps reading a graph's output after the next replay
  has overwritten it;
* ``hf-dynamic``: transformers ``generate`` eagerly with its ``DynamicCache`` (the stock baseline);
* ``vllm``: vLLM's plain decoding through ``integrations.vllm.engine``: in this process where vLLM is importable,
  else in vLLM's own environment (``.venv-vllm`` from ``bash scripts/setup.sh --vllm``, or the interpreter named by
  ``REPRO_VLLM_PYTHON``) as a child process serving ``integrations.vllm.peer_server`` (``repro.rollout.child_peer``).

``make_peer(name, policy, ...)`` returns a ``Peer`` whose ``generate(prompts)`` decodes ``new_tokens`` tokens
per row (sampling at the given temperature, no stop token: every row runs to the length limit, as the
engine's rows do in the benchmark). A peer that cannot run here raises ``PeerUnavailable`` with the reason;
the benchmark records it and goes on. Prompts of one call must have one length (no padding needed). ``cpu_s()``
is the CPU time the peer has spent outside this process so far (a child's; 0 for peers that run here).

    peer = make_peer("hf-dynamic", policy, new_tokens=32, temperature=1.0)
    tokens = peer.generate([[1, 2, 3], [4, 5, 6]])       # list of token lists
"""
from __future__ import annotations

import copy
import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
import transformers

from repro.core.handoffs import VLLM_PEER_SERVER, policy_exporter, rollout_engine
from repro.core.provenance import REPO_ROOT
from repro.rollout.child_peer import ChildDecoder, ChildPeerError

PEERS = ("hf-static-compile", "hf-dynamic", "vllm")
PEER_RECOMPILE_LIMIT = 64


class PeerUnavailable(RuntimeError):
    """This peer cannot run in this process (missing package, unsupported device or model); the reason says why."""


class Peer:
    """A peer decoder: ``generate(prompts)`` returns the new tokens per prompt; ``about`` names the engine that ran
    and its version (recorded beside its timings); ``cpu_s`` counts CPU seconds spent outside this process."""

    def __init__(self, name: str, generate, close=lambda: None, cpu_s=lambda: 0.0, about: str = ""):
        self.name, self._generate, self.close, self.cpu_s, self.about = name, generate, close, cpu_s, about

    def generate(self, prompts: Sequence[Sequence[int]]) -> list[list[int]]:
        if len({len(p) for p in prompts}) != 1:
            raise ValueError(f"peer {self.name}: prompts of one call need one length, "
                             f"got {sorted({len(p) for p in prompts})}")
        return self._generate(prompts)


def _hf_model(policy):
    """A private copy of the policy's HF model (no tap hooks; compiling must not touch the engine's model)."""
    model = copy.deepcopy(policy.model)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = None
    return model.eval()


def make_peer(name: str, policy, *, new_tokens: int, temperature: float, workdir: str | Path | None = None,
              max_model_len: int = 4096) -> Peer:
    if name not in PEERS:
        raise ValueError(f"peer {name!r} is not one of {PEERS}")
    if new_tokens < 1:
        raise ValueError(f"new_tokens must be >= 1, got {new_tokens}")
    if name == "vllm":
        return _vllm_peer(policy, new_tokens=new_tokens, temperature=temperature, workdir=workdir,
                          max_model_len=max_model_len)
    model = _hf_model(policy)
    dev = policy.device
    kw = {"max_new_tokens": new_tokens, "min_new_tokens": new_tokens, "do_sample": True,
          "temperature": float(temperature), "top_k": 0, "top_p": 1.0}
    if name == "hf-static-compile":
        from transformers import CompileConfig
        model.generation_config.cache_implementation = "static"
        config = CompileConfig(mode="reduce-overhead", fullgraph=True)
        config._compile_all_devices = True        # transformers' switch for compiling off CUDA too (CPU)
        model.generation_config.compile_config = config
    else:
        kw["cache_implementation"] = "dynamic"

    @torch.no_grad()
    def generate(prompts):
        ids = torch.tensor([list(p) for p in prompts], dtype=torch.long, device=dev)
        # every peer of a run (one per batch size, each a model copy) adds graphs to the cache of the same forward
        # code, and fullgraph=True fails once dynamo's default limit of 8 is reached
        with torch._dynamo.config.patch(recompile_limit=PEER_RECOMPILE_LIMIT):
            out = model.generate(ids, attention_mask=torch.ones_like(ids), **kw)
        return out[:, ids.shape[1]:].tolist()

    return Peer(name, generate, about=f"transformers {transformers.__version__}, torch {torch.__version__}")


def vllm_interpreter() -> str | None:
    """The interpreter of vLLM's own environment: ``REPRO_VLLM_PYTHON`` (set and empty: none), else the repository's
    ``.venv-vllm``, else None."""
    named = os.environ.get("REPRO_VLLM_PYTHON")
    if named is not None:
        return named or None
    venv = REPO_ROOT / ".venv-vllm" / "bin" / "python"
    return str(venv) if venv.is_file() and os.access(venv, os.X_OK) else None


def _vllm_peer(policy, *, new_tokens: int, temperature: float, workdir, max_model_len: int) -> Peer:
    if workdir is None:
        raise PeerUnavailable("the vllm peer needs a workdir to export the policy into")
    if importlib.util.find_spec("vllm") is None:
        return _vllm_child_peer(policy, new_tokens=new_tokens, temperature=temperature, workdir=Path(workdir),
                                max_model_len=max_model_len)
    try:
        eng = rollout_engine("vllm").from_models(policy, None, workdir=Path(workdir) / "vllm_peer",
                                                 max_model_len=max_model_len, seed=0)
    except Exception as exc:
        raise PeerUnavailable(f"vllm could not start on this policy: {type(exc).__name__}: {exc}") from exc

    def generate(prompts):
        return eng.generate(prompts, max_new_tokens=new_tokens, temperature=temperature, seed=0).tokens

    return Peer("vllm", generate, close=eng.close, about=f"vllm {eng.vllm_version} (in process)")


def _vllm_child_peer(policy, *, new_tokens: int, temperature: float, workdir: Path, max_model_len: int) -> Peer:
    python = vllm_interpreter()
    if python is None or Path(python).absolute() == Path(sys.executable).absolute():   # a venv is its path
        raise PeerUnavailable("vllm is not importable in this interpreter and no vLLM environment was found "
                              "(bash scripts/setup.sh --vllm makes .venv-vllm; REPRO_VLLM_PYTHON names another "
                              "interpreter)")
    pdir = policy_exporter("vllm")(policy, workdir / "vllm_peer" / "policy")
    try:            # the server computes in the dtype the export's config names
        child = ChildDecoder([python, "-m", VLLM_PEER_SERVER, "--policy-dir", str(pdir), "--max-model-len",
                              str(max_model_len)], log=workdir / "vllm_peer" / "server.log", cwd=REPO_ROOT)
    except ChildPeerError as exc:
        raise PeerUnavailable(f"vllm ({python}) could not start on this policy: {exc}") from exc

    def generate(prompts):
        return child.generate(prompts, max_new_tokens=new_tokens, temperature=temperature, seed=0)

    return Peer("vllm", generate, close=child.close, cpu_s=lambda: child.cpu_s,
                about=f"vllm {child.info.get('vllm', '?')} (child process {python})")
