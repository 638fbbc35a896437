"""flash-attn-4 backend ("flash4"): ``flash_attn.cute``, the CuTe-DSL FlashAttention for Hopper and Blackwell.

Probed, never imported at module load: ``available()`` says whether ``flash_attn.cute`` imports (CPU machines
never import it; asking for the backend there raises an error saying why). fp16/bf16 on CUDA devices of
compute capability 9.0 or newer (its backward needs sm90+), and not while torch's deterministic algorithms are
on (the backward accumulates with atomics; ``auto`` then takes the next backend). Every MaskSpec kind:

  "causal", "full"  one varlen call per block (packed documents through cu_seqlens); a single segment's forward
                    runs on the batched kernel (faster there), its backward stays varlen
  "prefix"          one call on the batched layout (batch 1) with a mask function (``mask_mod``: query row t
                    sees [lo[t], hi[t]), kernels/attention/backends/flash4_masks.py) and, on sm90, the
                    block-sparsity tables of the intervals (tiles nobody sees are skipped, fully visible ones
                    skip the mask); if that route fails on a machine (a DSL compile error, say) the backend
                    warns once and runs prefix masks as replicated full segments (prefix_full.py) instead

Facts the adapter relies on (flash-attn-4 4.0.0b36, flash_attn/cute/interface.py):

  forward   flash_attn_varlen_func(q, k, v, cu_seqlens_q=, cu_seqlens_k=, max_seqlen_q=, max_seqlen_k=,
            softmax_scale=, causal=, return_lse=True) -> (out [T, H, D], lse [H, T] fp32), int32 cu_seqlens on
            the device; flash_attn_func(q [R, Sq, H, D], k, v [R, Sk, G, D], mask_mod=, aux_tensors=,
            block_sparse_tensors=, return_lse=True) -> (out, lse [R, H, Sq]) (a mask_mod replaces causal).
            GQA is native (query head h reads K/V head h // (H / G)). A row whose softmax sum is 0 gets
            lse = -inf and out = 0; rows of segments without keys are set so here as well, whatever the kernel
            leaves in them.
  backward  the private interface._flash_attn_bwd(q, k, v, out, dout, lse, softmax_scale, causal, ...,
            cu_seqlens_q/k, max_seqlen_q/k, mask_mod, aux_tensors, block_sparse_tensors) -> (dq, dk, dv),
            fed the *joint* out and lse (its preprocess takes rowsum(dO * O) from the out it is given), so the
            result is this block's share of the joint softmax's gradient. Arguments go by name from the
            installed function's signature. Joint lse = -inf rows are passed as +inf (P = 0). The varlen
            backward takes no block sparsity, hence the batched layout for masks.
  workspace the backward allocates fp32 accumulators, dQ [H, Tq, D] and (GQA) dK, dV [G, Tk, D]: 6.4 GB at
            256K tokens with 32/8 heads of 128. Above ``bwd_workspace_bytes`` the backward runs in groups of
            whole K/V heads (each group's gradients are complete; no extra rounding), so the accumulators
            stay bounded by the limit. A group reads head slices of q/k/v/out/dout in place and writes head
            slices of dq/dk/dv (the dq=/dk=/dv= outputs): no copies besides the accumulators.

    from kernels.attention.backends.flash4 import Flash4Backend, available
"""
from __future__ import annotations

import importlib
import inspect
import warnings

import torch

from kernels.attention.backends import flash4_masks
from kernels.attention.backends.base import Backend
from kernels.attention.backends.intervals import intervals, ordered, tile_tables
from kernels.attention.backends.varlen_index import varlen_bounds
from kernels.attention.spec import MaskSpec
from kernels.attention.staging import to_device

_PROBE: dict = {}
MIN_CAPABILITY = (9, 0)
SPARSE_BLOCK = (128, 128)          # sm90: forward tile for head dim 128; the backward expects (128, 128) too


class Flash4Lib:
    """What the backend uses from the installed package."""

    def __init__(self, cute_mod, iface, block_sparse_cls):
        self.version = getattr(cute_mod, "__version__", "unknown")
        self.varlen = iface.flash_attn_varlen_func
        self.func = iface.flash_attn_func
        self.bwd = iface._flash_attn_bwd
        self.BlockSparse = block_sparse_cls


def _load():
    """The installed flash-attn-4 (a Flash4Lib), or a reason string."""
    if "res" in _PROBE:
        return _PROBE["res"]
    try:
        cute_mod = importlib.import_module("flash_attn.cute")
        iface = importlib.import_module("flash_attn.cute.interface")
        bs = importlib.import_module("flash_attn.cute.block_sparsity")
        _PROBE["res"] = Flash4Lib(cute_mod, iface, bs.BlockSparseTensorsTorch)
    except Exception as exc:  # noqa: BLE001 -- a half-installed CuTe DSL fails in many ways; all mean "not here"
        _PROBE["res"] = f"flash-attn-4 (flash_attn.cute) is not importable ({type(exc).__name__}: {exc})"
    return _PROBE["res"]


def reset_probe() -> None:
    """Forget the probe result (tests that install or remove a flash_attn.cute module)."""
    _PROBE.clear()


def available() -> bool:
    return not isinstance(_load(), str)


def version() -> str | None:
    res = _load()
    return None if isinstance(res, str) else res.version


def capability(device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device)


def _call_by_name(fn, values: dict):
    """Call ``fn`` with the entries of ``values`` its signature names; an unknown required one is an error."""
    kwargs = {}
    for name, p in inspect.signature(getattr(fn, "_init_fn", fn)).parameters.items():
        if name in values:
            kwargs[name] = values[name]
        elif p.default is inspect.Parameter.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise RuntimeError(f"flash-attn-4 {getattr(fn, '__name__', fn)} has a required parameter {name!r} this "
                               "adapter does not know (written against flash-attn-4 4.0.0b36)")
    return fn(**kwargs)


def _safe_lse(lse: torch.Tensor) -> torch.Tensor:
    """Joint lse for the kernel: fp32, rows that saw nothing (-inf) as +inf so that P = 0 there."""
    l = lse.float()
    return torch.where(torch.isneginf(l), torch.full_like(l, float("inf")), l)


class MaskedProblem:
    """A masked call on the batched layout: the mask's name and aux tensors (on the kernel's device), rows
    without keys, and the per-row intervals the block-sparsity tables come from. The tables are built on the
    intervals' device on first use, then kept on the kernel's device: intervals on the host build them there,
    with no device work and no waits."""

    def __init__(self, name: str, aux: list[torch.Tensor], R: int, Sq: int, Sk: int, pairs, exact, empty_rows):
        self.name, self.aux, self.R, self.Sq, self.Sk = name, aux, R, Sq, Sk
        self.pairs, self.exact = pairs, exact          # [(lo [R, Sq], hi [R, Sq]), ...]
        self.empty_rows = empty_rows                   # flat r * Sq + m indices (device), or None
        self._sparse: dict = {}

    def sparse(self, lib: Flash4Lib, block=SPARSE_BLOCK):
        """(forward tables by query tile, backward tables by key tile) as BlockSparseTensorsTorch."""
        if block not in self._sparse:
            bq, bk = block
            per_row = [tile_tables([(lo[r], hi[r]) for lo, hi in self.pairs], self.Sq, self.Sk, bq, bk, self.exact)
                       for r in range(self.R)]
            stack = lambda f: torch.stack([f(t) for t in per_row])[:, None]      # [R, 1, ...]
            part, full = stack(lambda t: t.partial), stack(lambda t: t.full)
            dev = self.aux[0].device
            tables = lambda m: [to_device(t, dev) for t in ordered(m)]       # (count, indices)

            def sparse(part, full):
                (pc, pi), (fc, fi) = tables(part), tables(full)
                return lib.BlockSparse(mask_block_cnt=pc, mask_block_idx=pi, full_block_cnt=fc, full_block_idx=fi,
                                       block_size=block)
            fwd = sparse(part, full)
            bwd = sparse(part.transpose(-1, -2), full.transpose(-1, -2))
            self._sparse[block] = (fwd, bwd)
        return self._sparse[block]


def prefix_problem(spec: MaskSpec, device) -> MaskedProblem:
    """The "interval" problem of a MaskSpec (batch 1), cached on the spec."""
    key = ("flash4_problem", str(device))
    if key not in spec._cache:
        lo, hi = intervals(spec, "cpu")
        empty = torch.nonzero(hi <= lo).flatten()
        aux = [to_device(a, device) for a in flash4_masks.aux_tensors("interval", lo, hi)]
        spec._cache[key] = MaskedProblem("interval", aux, 1, spec.num_q, spec.num_k, [(lo[None], hi[None])], [True],
                                         to_device(empty, device) if empty.numel() else None)
    return spec._cache[key]


class Flash4Backend(Backend):
    name = "flash4"

    def __init__(self, bwd_workspace_bytes: int = 2 << 30, block_sparse: str = "auto", prefix: str = "auto"):
        if block_sparse not in ("auto", "on", "off"):
            raise ValueError(f"block_sparse must be 'auto', 'on' or 'off', got {block_sparse!r}")
        if prefix not in ("auto", "mask", "replicate"):
            raise ValueError(f"prefix must be 'auto', 'mask' or 'replicate', got {prefix!r}")
        if not isinstance(bwd_workspace_bytes, int) or bwd_workspace_bytes < 1:
            raise ValueError(f"bwd_workspace_bytes must be a positive int, got {bwd_workspace_bytes!r}")
        self.bwd_workspace_bytes, self.block_sparse, self.prefix = bwd_workspace_bytes, block_sparse, prefix
        self.used: dict = {}             # what ran: {"prefix_fwd": "mask+sparse" | "mask" | "replicate", ...}
        self._replicated = None

    # -- capability ------------------------------------------------------------------------------
    def unavailable_reason(self, spec, device, dtype) -> str | None:
        res = _load()
        if isinstance(res, str):
            return res + "; pip install flash-attn-4 on a CUDA machine, or pick another backend"
        if device.type != "cuda" or dtype not in (torch.float16, torch.bfloat16):
            return f"flash-attn-4 needs fp16/bf16 CUDA tensors, got {dtype} on {device.type}"
        cc = capability(device)
        if cc < MIN_CAPABILITY:
            return f"flash-attn-4's backward needs compute capability >= 9.0 (Hopper), this device has {cc}"
        if torch.are_deterministic_algorithms_enabled():
            return ("torch.use_deterministic_algorithms is on and flash-attn-4's backward accumulates with atomics "
                    "(not deterministic as this adapter calls it)")
        return None

    def supports(self, spec, device, dtype) -> bool:
        return self.unavailable_reason(spec, device, dtype) is None

    def _lib(self) -> Flash4Lib:
        res = _load()
        if isinstance(res, str):
            raise RuntimeError(f"backend 'flash4' was requested but {res}")  # noqa: TRY004 -- missing package
        return res

    # -- contract --------------------------------------------------------------------------------
    def forward(self, q, k, v, spec, scale):
        if spec.kind == "prefix":
            return self._prefix(lambda: self._prefix_forward(q, k, v, spec, scale),
                                lambda b: b.forward(q, k, v, spec, scale), "fwd")
        lib = self._lib()
        T, H, _D = q.shape
        cu_q, cu_k, mq, mk = varlen_bounds(spec, q.device)
        if mq == 0 or mk == 0:
            return torch.zeros_like(q), torch.full((T, H), float("-inf"), dtype=torch.float32, device=q.device)
        causal = spec.kind == "causal"
        if spec.cu_q.numel() == 2 and spec.cu_k.numel() == 2:
            # one segment: the batched kernel (its forward measured 13% faster than varlen's on an H200 at 64K
            # tokens, causal, 32/8 heads of 128); the backward stays varlen, which was the faster one there
            out, lse = lib.func(q[None], k[None], v[None], softmax_scale=scale, causal=causal, return_lse=True)
            out, lse = out[0], lse[0]
        else:
            out, lse = lib.varlen(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=mq, max_seqlen_k=mk,
                                  softmax_scale=scale, causal=causal, return_lse=True)
        if tuple(lse.shape) != (H, T):
            raise RuntimeError(f"flash-attn-4 returned lse of shape {tuple(lse.shape)}, expected {(H, T)}")
        lse = lse.transpose(0, 1)
        empty = _keyless_rows(spec, q.device)
        if empty is not None:
            out.index_fill_(0, empty, 0)
            lse.index_fill_(0, empty, float("-inf"))
        return out, lse

    def backward(self, dout, q, k, v, out, lse, spec, scale):
        if spec.kind == "prefix":
            return self._prefix(lambda: self._prefix_backward(dout, q, k, v, out, lse, spec, scale),
                                lambda b: b.backward(dout, q, k, v, out, lse, spec, scale), "bwd")
        lib = self._lib()
        cu_q, cu_k, mq, mk = varlen_bounds(spec, q.device)
        if mq == 0 or mk == 0:
            return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        lse_k = _safe_lse(lse).transpose(0, 1).contiguous()                     # [H, T]
        fixed = {"softmax_scale": scale, "causal": spec.kind == "causal", "softcap": 0.0, "cu_seqlens_q": cu_q,
                 "cu_seqlens_k": cu_k, "max_seqlen_q": mq, "max_seqlen_k": mk, "deterministic": False}
        tq = spec.num_q + 128 * (spec.cu_q.numel() - 1)                         # rows rounded per segment
        tk = spec.num_k + 128 * (spec.cu_k.numel() - 1)
        dq, dk, dv = self._grouped_backward(lib, dout, q, k, v, out, lse_k, fixed, tq, tk, head_dim=1, lse_dim=0)
        empty = _keyless_rows(spec, q.device)
        if empty is not None:
            dq.index_fill_(0, empty, 0)
        return dq, dk, dv

    # -- masked calls (batched layout) -----------------------------------------------------------
    def masked_forward(self, q4, k4, v4, prob: MaskedProblem, scale: float):
        """(out [R, Sq, H, D], lse [R, H, Sq]) of ``prob``'s mask; rows without keys: 0 and -inf."""
        lib = self._lib()
        R, Sq, H, _D = q4.shape
        if Sq == 0 or k4.shape[1] == 0:
            return torch.zeros_like(q4), torch.full((R, H, Sq), float("-inf"), dtype=torch.float32, device=q4.device)
        mask = flash4_masks.cute_mask(prob.name)
        sparse = self._sparse_tables(lib, prob, q4.device)
        kw = {"softmax_scale": scale, "causal": False, "mask_mod": mask, "aux_tensors": prob.aux, "return_lse": True}
        try:
            out, lse = lib.func(q4, k4, v4, block_sparse_tensors=None if sparse is None else sparse[0], **kw)
        except Exception as exc:
            if sparse is None or self.block_sparse == "on":
                raise
            self._sparse_failed(exc)
            out, lse = lib.func(q4, k4, v4, block_sparse_tensors=None, **kw)
        if tuple(lse.shape) != (R, H, Sq):
            raise RuntimeError(f"flash-attn-4 returned lse of shape {tuple(lse.shape)}, expected {(R, H, Sq)}")
        if prob.empty_rows is not None:
            _set_rows(out, prob.empty_rows, Sq, 0.0)
            _set_rows(lse.transpose(1, 2), prob.empty_rows, Sq, float("-inf"))
        self.used["masked_fwd"] = "mask+sparse" if sparse is not None and self.block_sparse != "failed" else "mask"
        return out, lse

    def masked_backward(self, dout4, q4, k4, v4, out4, lse4, prob: MaskedProblem, scale: float):
        """(dq, dk, dv) of ``prob``'s mask from the joint (out, lse [R, H, Sq])."""
        lib = self._lib()
        R, Sq, Sk = q4.shape[0], q4.shape[1], k4.shape[1]
        if Sq == 0 or Sk == 0:
            return torch.zeros_like(q4), torch.zeros_like(k4), torch.zeros_like(v4)
        sparse = self._sparse_tables(lib, prob, q4.device)
        fixed = {"softmax_scale": scale, "causal": False, "softcap": 0.0, "deterministic": False,
                 "mask_mod": flash4_masks.cute_mask(prob.name), "aux_tensors": prob.aux,
                 "block_sparse_tensors": None if sparse is None else sparse[1]}
        lse_k = _safe_lse(lse4).contiguous()
        tq, tk = R * (Sq + 128), R * (Sk + 128)
        try:
            res = self._grouped_backward(lib, dout4, q4, k4, v4, out4, lse_k, fixed, tq, tk, head_dim=2, lse_dim=1)
        except Exception as exc:
            if sparse is None or self.block_sparse == "on":
                raise
            self._sparse_failed(exc)
            fixed["block_sparse_tensors"] = None
            res = self._grouped_backward(lib, dout4, q4, k4, v4, out4, lse_k, fixed, tq, tk, head_dim=2, lse_dim=1)
        dq, dk, dv = res
        if prob.empty_rows is not None:
            _set_rows(dq, prob.empty_rows, Sq, 0.0)
        self.used["masked_bwd"] = "mask" if fixed["block_sparse_tensors"] is None else "mask+sparse"
        return dq, dk, dv

    # -- internals -------------------------------------------------------------------------------
    def _sparse_tables(self, lib, prob, device):
        if self.block_sparse in ("off", "failed"):
            return None
        if self.block_sparse == "auto" and capability(device)[0] != 9:
            return None          # the tables' tile conventions differ on sm100 (2 x tile_m); mask only there
        return prob.sparse(lib)

    def _sparse_failed(self, exc: Exception) -> None:
        warnings.warn(f"flash4: block-sparse masked call failed ({type(exc).__name__}: "
                      f"{str(exc).splitlines()[0][:200] if str(exc) else ''}); using the mask alone",
                      RuntimeWarning, stacklevel=3)
        self.block_sparse = "failed"
        self.used["sparse_error"] = f"{type(exc).__name__}: {exc}"[:500]

    def _prefix(self, mask_route, replicated_route, phase: str):
        """Run a prefix spec through the mask route, or the replicated full segments (see module docstring)."""
        if self.prefix != "replicate":
            try:
                res = mask_route()
                self.used[f"prefix_{phase}"] = self.used.get(f"masked_{phase}", "mask")
                return res
            except Exception as exc:
                if self.prefix == "mask":
                    raise
                warnings.warn(f"flash4: the masked prefix {phase} failed ({type(exc).__name__}: "
                              f"{str(exc).splitlines()[0][:200] if str(exc) else ''}); running prefix masks as "
                              "replicated full segments from now on", RuntimeWarning, stacklevel=3)
                self.prefix = "replicate"
                self.used["prefix_error"] = f"{type(exc).__name__}: {exc}"[:500]
        if self._replicated is None:
            from kernels.attention.backends.prefix_full import PrefixAsFull
            self._replicated = PrefixAsFull(self)
        self.used[f"prefix_{phase}"] = "replicate"
        return replicated_route(self._replicated)

    def _prefix_forward(self, q, k, v, spec, scale):
        prob = prefix_problem(spec, q.device)
        out, lse = self.masked_forward(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), prob, scale)
        return out[0], lse[0].transpose(0, 1)

    def _prefix_backward(self, dout, q, k, v, out, lse, spec, scale):
        prob = prefix_problem(spec, q.device)
        u = lambda x: x.to(q.dtype).contiguous().unsqueeze(0)
        dq, dk, dv = self.masked_backward(u(dout), q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), u(out),
                                          lse.transpose(0, 1).unsqueeze(0), prob, scale)
        return dq[0], dk[0], dv[0]

    def head_groups(self, H: int, G: int, tq: int, tk: int, D: int) -> int:
        """Fewest groups of whole K/V heads whose fp32 backward accumulators fit ``bwd_workspace_bytes``."""
        per_kv_head = 4 * D * ((H // G) * tq + (2 * tk if H != G else 0))
        for n in range(1, G + 1):
            if G % n == 0 and per_kv_head * (G // n) <= self.bwd_workspace_bytes:
                return n
        return G

    def _grouped_backward(self, lib, dout, q, k, v, out, lse_k, fixed, tq, tk, head_dim: int, lse_dim: int):
        """_flash_attn_bwd over groups of K/V heads (dim ``head_dim`` of q/k/v, ``lse_dim`` of the lse).

        A group's inputs are head slices of the callers' tensors and its gradients are written into head
        slices of dq/dk/dv (the kernel takes any layout whose last dim is contiguous and whose strides are
        16-byte aligned, and writes caller-given outputs): only the fp32 accumulators are extra."""
        H, G, D = q.shape[head_dim], k.shape[head_dim], q.shape[-1]
        dout, out = dout.to(q.dtype).contiguous(), out.to(q.dtype).contiguous()
        n = self.head_groups(H, G, tq, tk, D)
        self.used["bwd_head_groups"] = n
        if n == 1:
            return tuple(_call_by_name(lib.bwd, {"q": q, "k": k, "v": v, "out": out, "dout": dout, "lse": lse_k,
                                                 **fixed})[:3])
        grads = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        hq, hk = H // n, G // n
        for g in range(n):
            qh = lambda x: x.narrow(head_dim, g * hq, hq)
            kh = lambda x: x.narrow(head_dim, g * hk, hk)
            dst = (qh(grads[0]), kh(grads[1]), kh(grads[2]))
            res = _call_by_name(lib.bwd, {"q": qh(q), "k": kh(k), "v": kh(v), "out": qh(out), "dout": qh(dout),
                                          "lse": lse_k.narrow(lse_dim, g * hq, hq), "dq": dst[0], "dk": dst[1],
                                          "dv": dst[2], **fixed})
            for d, r in zip(dst, res[:3]):
                if r.data_ptr() != d.data_ptr():      # an interface that ignored the given outputs
                    d.copy_(r)
            del res
        return grads


def _keyless_rows(spec: MaskSpec, device) -> torch.Tensor | None:
    """Query rows of segments without keys (varlen kinds), cached on the spec; None when there are none."""
    key = ("flash4_keyless", str(device))
    if key not in spec._cache:
        lq, lk = spec.cu_q.diff(), spec.cu_k.diff()
        seg = torch.repeat_interleave(torch.arange(lq.numel()), lq)
        rows = torch.nonzero(lk[seg] == 0).flatten()
        spec._cache[key] = to_device(rows, device) if rows.numel() else None
    return spec._cache[key]


def _set_rows(x: torch.Tensor, rows: torch.Tensor, Sq: int, value: float) -> None:
    """x [R, Sq, ...] (any strides): set the flat rows r * Sq + m to ``value``."""
    x[torch.div(rows, Sq, rounding_mode="floor"), rows % Sq] = value
