"""flex_attention backend: torch.nn.attention.flex_attention with block masks built from a MaskSpec.

Every MaskSpec kind is "query row t sees the keys [lo[t], hi[t])" (absolute key rows; causal:
[segment start, own position], full: the segment, prefix: [segment start, key_end[t])), so one mask
function ``lo[q] <= kv < hi[q]`` serves all of them, over the whole packed batch in one call (batch 1,
documents told apart by their intervals). The BlockMask is built directly from the intervals (which
128 x 128 tiles are partly / fully visible), never from a dense [Tq, Tk] mask, so it costs
O(Tq/128 * Tk/128) even at 256K tokens; it is cached on the spec (a ring step's forward and backward
share it). GQA is native (``enable_gqa``). Rows without keys: out = 0, lse = -inf (set explicitly).

Forward: the public ``flex_attention`` with the LSE (``return_aux=AuxRequest(lse=True)``; torch < 2.9:
``return_lse``). Backward with the *joint* (out, lse), two ways:
  "hop"        flex's own backward operator (``torch.ops.higher_order.flex_attention_backward``) fed the
               joint out and lse (log2 units, as the operator expects): exactly the contract, no recompute.
  "recompute"  public API only: re-run this block's forward with autograd, then backpropagate
               w*dO into out_b and w*(rowsum(dO*out_b) - rowsum(dO*out)) into lse_b, w = exp(lse_b - lse):
               the same dq, dk, dv (the block's softmax share of the joint softmax), at the cost of a forward.
Device and compilation (probed once per process, each failure falls back and is remembered):
  CPU   forward and backward eager (unfused: the [H, Tq, Tk] scores are materialised; tests only),
        fp64/fp32/bf16/fp16.
        torch 2.13's compiled CPU flex is inference-only and cannot return the LSE, so compiling is
        not tried unless ``cpu_compile="auto"`` (then only where a C++ compiler is on PATH).
  CUDA  compiled (Triton): forward through ``torch.compile(flex_attention)``; backward "hop" compiled,
        else "recompute" through the compiled forward's autograd. fp16/bf16/fp32.

    from kernels.attention.backends.flex import FlexBackend
    out, lse = FlexBackend().forward(q, k, v, MaskSpec.causal(cu), scale)
"""
from __future__ import annotations

import math
import shutil
import warnings

import torch

from kernels.attention.backends.base import Backend, acc_dtype
from kernels.attention.backends.intervals import intervals, ordered, tile_tables
from kernels.attention.spec import MaskSpec

BLOCK = 128
_LN2 = math.log(2.0)


def available() -> bool:
    try:
        from torch._higher_order_ops.flex_attention import flex_attention_backward as _b  # noqa: F401
        from torch.nn.attention import flex_attention as _fa  # noqa: F401
    except ImportError:
        return False
    return True


def _fa():
    from torch.nn.attention import flex_attention as fa
    return fa


def _interval_mask(lo: torch.Tensor, hi: torch.Tensor):
    def mask_mod(b, h, q_idx, kv_idx):
        return (kv_idx >= lo[q_idx]) & (kv_idx < hi[q_idx])
    return mask_mod


def block_mask(spec: MaskSpec, device, block: int = BLOCK):
    """(BlockMask, lo, hi, rows without keys) of ``spec``, cached on the spec per device."""
    key = ("flex_block_mask", str(device), block)
    if key in spec._cache:
        return spec._cache[key]
    fa = _fa()
    Tq, Tk = spec.num_q, spec.num_k
    lo, hi = intervals(spec, device)
    pad = -(-Tq // block) * block - Tq
    lo_p = torch.cat([lo, lo.new_zeros(pad)])            # padded rows see nothing (and keep the kernel's
    hi_p = torch.cat([hi, hi.new_zeros(pad)])            # out-of-range q_idx reads in bounds)
    t = tile_tables([(lo, hi)], Tq, Tk, block, block)
    kv_num, kv_idx = (x[None, None] for x in ordered(t.partial))
    f_num, f_idx = (x[None, None] for x in ordered(t.full))
    bm = fa.BlockMask.from_kv_blocks(kv_num, kv_idx, f_num, f_idx, BLOCK_SIZE=block,
                                     mask_mod=_interval_mask(lo_p, hi_p), seq_lengths=(Tq, Tk))
    empty_rows = torch.nonzero(hi <= lo).flatten()
    spec._cache[key] = (bm, lo, hi, empty_rows)
    return spec._cache[key]


def _bhld(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(0, 1).unsqueeze(0)                # [L, h, D] -> [1, h, L, D] view


def _kernel_options(q4, k4, v4) -> dict:
    """The HOP's kernel options as the public API would fill them (signatures differ by version)."""
    import inspect
    fa = _fa()
    f = getattr(fa, "_apply_kernel_options", None)
    if f is None:
        return {}
    params = inspect.signature(f).parameters
    if "return_aux" in params and hasattr(fa, "AuxRequest"):
        return f(q4, k4, v4, False, None, fa.AuxRequest(lse=True))
    return f(q4, k4, v4, True, None)


def _joint_graph(q4):
    from torch._higher_order_ops.flex_attention import create_fw_bw_graph
    fa = _fa()
    ex = (q4.new_zeros((), requires_grad=True),) + tuple(q4.new_zeros((), dtype=torch.int) for _ in range(4))
    return create_fw_bw_graph(fa._identity, ex, ())[1]


def _flex_fwd(q4, k4, v4, bm, scale, gqa):
    fa = _fa()
    if hasattr(fa, "AuxRequest"):
        o, aux = fa.flex_attention(q4, k4, v4, block_mask=bm, scale=scale, enable_gqa=gqa,
                                   return_aux=fa.AuxRequest(lse=True))
        return o, aux.lse
    return fa.flex_attention(q4, k4, v4, block_mask=bm, scale=scale, enable_gqa=gqa, return_lse=True)


def _hop_bwd(q4, k4, v4, o4, lse2, do4, bm, scale, kernel_options, joint):
    from torch._higher_order_ops.flex_attention import flex_attention_backward
    fa = _fa()
    g = flex_attention_backward(q4, k4, v4, o4, lse2, do4, None, fa._identity, joint, bm.as_tuple(), scale,
                                kernel_options, (), ())
    return g[0], g[1], g[2]


def _hop_fwd_autograd(q4, k4, v4, bm, scale, gqa):
    """Differentiable forward through the flex operator itself (used by "recompute" where the public
    API refuses gradients, i.e. on CPU); lse in natural-log units like the public API's."""
    from torch._higher_order_ops.flex_attention import flex_attention as hop
    fa = _fa()
    o, lse2, _ = hop(q4, k4, v4, fa._identity, bm.as_tuple(), scale, _kernel_options(q4, k4, v4))
    return o, lse2 * _LN2


class FlexBackend(Backend):
    name = "flex"

    def __init__(self, bwd: str = "auto", cpu_compile: str = "never"):
        if bwd not in ("auto", "hop", "recompute"):
            raise ValueError(f"bwd must be 'auto', 'hop' or 'recompute', got {bwd!r}")
        if cpu_compile not in ("never", "auto"):
            raise ValueError(f"cpu_compile must be 'never' or 'auto', got {cpu_compile!r}")
        self.bwd_mode, self.cpu_compile = bwd, cpu_compile
        self._compiled: dict = {}          # (device type, what) -> compiled callable, or None (failed)
        self.used: dict = {}               # what actually ran: {"fwd": ..., "bwd": ...} (reports)

    # -- capability ------------------------------------------------------------------------------
    def supports(self, spec, device, dtype) -> bool:
        if not available():
            return False
        if device.type == "cpu":
            return dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64)
        if device.type == "cuda":
            import importlib.util
            return (torch.cuda.is_available() and importlib.util.find_spec("triton") is not None
                    and dtype in (torch.float16, torch.bfloat16, torch.float32))
        return False

    # -- compilation -----------------------------------------------------------------------------
    def _compile(self, device, what: str, fn):
        """``fn`` compiled for ``device`` (once), or None where compiling is not used / failed."""
        key = (device.type, what)
        if key not in self._compiled:
            if device.type == "cpu" and (self.cpu_compile == "never" or not _cxx_available()):
                self._compiled[key] = None
            else:
                self._compiled[key] = _compile_fn(fn)
        return self._compiled[key]

    def _run(self, device, what: str, fn, *args):
        """Call the compiled ``fn`` where available; on CPU a failure falls back to eager, remembered."""
        c = self._compile(device, what, fn)
        if c is None:
            self.used[what] = "eager"
            return fn(*args)
        try:
            res = c(*args)
            self.used[what] = "compiled"
            return res
        except Exception as exc:
            if device.type != "cpu":
                raise
            warnings.warn(f"flex backend: compiled {what} failed on CPU ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0][:200]}); using eager", RuntimeWarning, stacklevel=3)
            self._compiled[(device.type, what)] = None
            self.used[what] = "eager"
            return fn(*args)

    # -- contract --------------------------------------------------------------------------------
    def forward(self, q, k, v, spec, scale):
        T, H, _D = q.shape
        acc = acc_dtype(q.dtype)
        if T == 0 or spec.num_k == 0:
            return torch.zeros_like(q), torch.full((T, H), float("-inf"), dtype=acc, device=q.device)
        bm, _lo, _hi, empty = block_mask(spec, q.device)
        q4, k4, v4 = (_bhld(x.detach()) for x in (q, k, v))
        o4, lse4 = self._run(q.device, "fwd", _flex_fwd, q4, k4, v4, bm, scale, k.shape[1] != H)
        out = o4[0].transpose(0, 1)
        out = out if out.is_contiguous() else out.contiguous()
        lse = lse4[0].transpose(0, 1).to(acc)
        if empty.numel():
            out[empty] = 0
            lse[empty] = float("-inf")
        return out, lse

    def backward(self, dout, q, k, v, out, lse, spec, scale):
        T, H, _D = q.shape
        if T == 0 or spec.num_k == 0:
            z = lambda x: torch.zeros(x.shape, dtype=x.dtype, device=x.device)
            return z(q), z(k), z(v)
        bm, _lo, _hi, _empty = block_mask(spec, q.device)
        q4, k4, v4 = (_bhld(x.detach()) for x in (q, k, v))
        do4, o4 = _bhld(dout.to(q.dtype)), _bhld(out.to(q.dtype))
        if self.bwd_mode in ("auto", "hop"):
            try:
                return self._backward_hop(q4, k4, v4, o4, do4, lse, bm, scale, q.device)
            except Exception as exc:
                if self.bwd_mode == "hop":
                    raise
                warnings.warn(f"flex backend: backward through flex_attention_backward failed "
                              f"({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); using 'recompute'",
                              RuntimeWarning, stacklevel=2)
                self.bwd_mode = "recompute"
        return self._backward_recompute(q4, k4, v4, o4, do4, lse, bm, scale, q.device, k.shape[1] != H)

    def _backward_hop(self, q4, k4, v4, o4, do4, lse, bm, scale, device):
        # The operator takes the LSE in log2 units; rows that saw no key get +inf (P = 0).
        l = lse.to(torch.float32 if q4.dtype != torch.float64 else torch.float64)
        l = torch.where(torch.isneginf(l), torch.full_like(l, float("inf")), l) / _LN2
        lse2 = l.transpose(0, 1).unsqueeze(0).contiguous()
        ko = _kernel_options(q4, k4, v4)
        joint = None
        if device.type != "cuda":                      # eager: hand the operator its joint graph (cached)
            key = ("joint", device.type, q4.dtype)
            if key not in self._compiled:
                self._compiled[key] = _joint_graph(q4)
            joint = self._compiled[key]
        gq, gk, gv = self._run(device, "bwd", _hop_bwd, q4, k4, v4, o4, lse2, do4, bm, scale, ko, joint)
        self.used["bwd_mode"] = "hop"
        return _thd(gq), _thd(gk), _thd(gv)

    def _backward_recompute(self, q4, k4, v4, o4, do4, lse, bm, scale, device, gqa):
        acc = torch.float64 if q4.dtype == torch.float64 else torch.float32
        fwd = _hop_fwd_autograd if device.type == "cpu" else _flex_fwd
        with torch.enable_grad():
            qg, kg, vg = (x.detach().requires_grad_() for x in (q4, k4, v4))
            if device.type == "cpu":
                o_b, lse_b = fwd(qg, kg, vg, bm, scale, gqa)
            else:
                o_b, lse_b = self._run(device, "fwd", fwd, qg, kg, vg, bm, scale, gqa)
            lj = lse.to(acc).transpose(0, 1).unsqueeze(0)                  # [1, H, T]
            lb = lse_b.detach().to(acc)
            ok = torch.isfinite(lb) & torch.isfinite(lj)
            w = torch.where(ok, torch.exp(torch.where(ok, lb - lj, torch.zeros_like(lb))), torch.zeros_like(lb))
            do = do4.to(acc)
            d_b = (do * o_b.detach().to(acc)).sum(-1)
            d_j = (do * o4.to(acc)).sum(-1)
            g_out = (w.unsqueeze(-1) * do).to(o_b.dtype)
            g_lse = (w * (d_b - d_j)).to(lse_b.dtype)
            gq, gk, gv = torch.autograd.grad([o_b, lse_b], [qg, kg, vg], [g_out, g_lse])
        self.used["bwd_mode"] = "recompute"
        return _thd(gq), _thd(gk), _thd(gv)


def _compile_fn(fn):
    return torch.compile(fn, dynamic=None)


def _thd(g: torch.Tensor) -> torch.Tensor:
    x = g[0].transpose(0, 1)
    return x if x.is_contiguous() else x.contiguous()


def _cxx_available() -> bool:
    """A C++ compiler for inductor's CPU code (CXX, else c++/g++/clang++ on PATH)."""
    import os
    cxx = os.environ.get("CXX")
    return bool((cxx and shutil.which(cxx)) or any(shutil.which(c) for c in ("c++", "g++", "clang++")))
