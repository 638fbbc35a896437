"""Peak live tensor bytes of the Figure-6 TTT attention step (EAGLE-3, K passes, forward + backward).

It runs the step that repro/bench/gpu_attention.py times as "ttt <T> cp=1" (K passes of
``eagle3_ttt_attention`` on one packed document, every leaf's gradient consumed by a hook as it
arrives, ``torch.autograd.backward`` over the K outputs with one shared ``dout``) under a
``TorchDispatchMode`` that sees every tensor an op returns and follows its storage until it is freed,
so it reports the peak of live tensor bytes (inputs, saved activations, gradients, temporaries).

Two ways to run the same Python code path on a machine without a GPU:
  --mode meta   every tensor lives on torch's "meta" device (shapes, no data, no memory): the GPU
                backends' own code runs (e.g. cudnn: aten's meta kernels give the output shapes) at
                the real 256K length in seconds. Kernel-internal workspace (cuDNN's fp32 dQ
                accumulator, say) is not a tensor that any op returns, so it is not counted; compare
                with torch.cuda.max_memory_allocated on the GPU to see it.
  --mode cpu    real CPU tensors (fp32, backend sdpa_cpu by default) at a scaled-down length; the
                peak is exact for the CPU kernels (whose internal buffers are likewise not counted).
The peak scales linearly in tokens for this kernel (flash-style backends: no [T, T] score matrix), so
bytes/token at a small T projects to 256K; --tokens accepts several lengths to show the linearity.

    .venv/bin/python -m repro.bench.attention_memory --mode meta --tokens 16384,262144
    .venv/bin/python -m repro.bench.attention_memory --mode cpu --tokens 2048 --backend sdpa_cpu
    .venv/bin/python -m repro.bench.attention_memory --mode meta --out results/x/attention_memory.json
"""
from __future__ import annotations

import argparse
import sys
import weakref
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from kernels.attention import backends, eagle3_ttt_attention
from kernels.attention.backends.base import Backend

H, G, D = 32, 8, 128           # Qwen3-8B draft attention (as gpu_attention.py)
FIG6_TOKENS = 262144


class LiveTensorBytes(TorchDispatchMode):
    """Live bytes of every storage that an op returned while the mode was active, and their peak.

    A storage is counted once (views share it) from the op that returned it until the last tensor
    using it dies. ``marks`` records (label, live, peak-so-far) at ``mark(label)`` calls.

    Under any Python dispatch mode the autograd engine sums the gradients that reach one tensor from
    several uses out of place (old + new), while a plain run sums them in place (old += new) when it
    holds the only reference to a dense, non-view buffer. ``inplace_engine_sums`` restores the plain
    run's behaviour for such sums issued by the engine itself (counted in ``engine_sums``).
    """

    def __init__(self, inplace_engine_sums: bool = True, workspace: dict | None = None):
        super().__init__()
        self.inplace_engine_sums = inplace_engine_sums
        self.workspace = workspace or {}      # op -> fn(args) -> bytes held while the op runs (a model)
        self.peak_workspace = 0
        self.engine_sums = 0
        self.live = 0
        self.peak = 0
        self._sizes: dict[int, int] = {}
        self._origin: dict[int, str] = {}
        self.marks: list[tuple[str, int, int]] = []
        self.at_peak: dict[str, int] = {}          # op that made each storage live at the peak -> bytes
        self._phase = "start"

    def _track(self, t: torch.Tensor, origin: str) -> None:
        st = t.untyped_storage()
        key = id(st)
        if key in self._sizes:
            return
        n = st.nbytes()
        self._sizes[key] = n
        self._origin[key] = f"{self._phase}: {origin}"
        self.live += n
        if self.live > self.peak:
            self.peak = self.live
            self._snapshot()
        weakref.finalize(st, self._free, key)

    def _snapshot(self) -> None:
        agg: dict[str, int] = {}
        for key, n in self._sizes.items():
            agg[self._origin[key]] = agg.get(self._origin[key], 0) + n
        self.at_peak = dict(sorted(agg.items(), key=lambda kv: -kv[1]))

    def _free(self, key: int) -> None:
        self.live -= self._sizes.pop(key)
        self._origin.pop(key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.inplace_engine_sums and func is torch.ops.aten.add.Tensor and not kwargs and _from_engine():
            a, b = args
            if (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and not a._is_view()
                    and a.is_contiguous() and a.shape == b.shape and a.dtype == b.dtype):
                self.engine_sums += 1
                return a.add_(b)
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and not t.is_sparse:
                self._track(t, func.__name__)
        ws = self.workspace.get(func)
        if ws is not None:                     # outputs and the kernel's workspace coexist in the call
            n = ws(args)
            if self.live + n > self.peak:
                self.peak = self.live + n
                self.peak_workspace = n
                self._snapshot()
                self.at_peak[f"{self._phase}: {func.__name__} workspace (model)"] = n
        return out

    def mark(self, label: str, next_phase: str | None = None) -> None:
        """Record (label, live, peak so far); ops after this are attributed to ``next_phase``."""
        self.marks.append((label, self.live, self.peak))
        if next_phase is not None:
            self._phase = next_phase


_MODE_FRAMES = ("torch/_compile.py", "torch/_dynamo/", "torch/utils/_python_dispatch.py", __file__)


def _from_engine() -> bool:
    """Whether the op being dispatched was issued by the autograd engine itself (not by Python code
    running inside a backward): the first Python frame outside the mode machinery is the engine's."""
    f = sys._getframe(2)
    while f is not None and any(m in f.f_code.co_filename for m in _MODE_FRAMES):
        f = f.f_back
    return f is not None and f.f_code.co_name == "_engine_run_backward"


def _cudnn_bwd_workspace(args) -> int:
    """cuDNN SDPA backward workspace, a model fitted to one H200 measurement (torch 2.11, cuDNN 9):
    max_memory_allocated exceeded the tensor-level peak of this tool by 8.691 GB at T = 256K (H=32,
    D=128), in both the "ttt" and the "trunk" rows: 33,152 B per query row = two fp32 [L, H, D]
    buffers plus three fp32 [L, H] rows (a dQ accumulator and its kin). Square tiles make the choice
    of L = Lq or Lk immaterial."""
    _, h, L, d = args[1].shape
    return L * (2 * h * d * 4 + 3 * h * 4)


WORKSPACE_MODELS = {
    "none": {},
    "cudnn-h200": {torch.ops.aten._scaled_dot_product_cudnn_attention_backward.default: _cudnn_bwd_workspace},
}


class AnyDevice(Backend):
    """A named backend run on a device it would refuse (the meta device): same code, no data."""

    def __init__(self, inner: Backend):
        self.inner = inner
        self.name = inner.name

    def supports(self, spec, device, dtype) -> bool:
        return True

    def forward(self, q, k, v, spec, scale):
        return self.inner.forward(q, k, v, spec, scale)

    def backward(self, dout, q, k, v, out, lse, spec, scale):
        return self.inner.backward(dout, q, k, v, out, lse, spec, scale)


def fresh(b: Backend) -> Backend:
    """A new instance of backend ``b`` (wrappers rebuilt around new inner ones): a meta run must not
    leave meta tensors in the state of the instances that real runs use (e.g. cuDNN's metadata)."""
    from kernels.attention.backends.prefix_full import PrefixAsFull
    try:
        from kernels.attention.backends.tiled import TiledBackward
    except ImportError:                        # an older kernels/ tree (before/after comparisons)
        TiledBackward = ()
    if TiledBackward and isinstance(b, TiledBackward):
        return TiledBackward(fresh(b.inner), b.tile, b.grad_acc, b.kv_tile)
    if isinstance(b, PrefixAsFull):
        return PrefixAsFull(fresh(b.inner))
    return type(b)()


def ttt_step_peak(T: int, passes: int, backend: str | Backend, device: str, dtype: torch.dtype, step: str = "ttt",
                  workspace: str = "none") -> dict:
    """Peak live bytes of one K-pass TTT forward + backward (the gpu_attention.py "ttt" step);
    ``step="trunk"``: the same K passes without the branch (its "trunk" row: pass p on its own K/V)."""
    b = backends.get(backend) if isinstance(backend, str) else backend
    if device == "meta":
        b = AnyDevice(fresh(b))
    cu = torch.tensor([0, T])
    with LiveTensorBytes(workspace=WORKSPACE_MODELS[workspace]) as mem:
        def leaf(*shape):
            x = torch.randn(*shape, device=device, dtype=dtype).requires_grad_()
            x.register_post_accumulate_grad_hook(lambda p: setattr(p, "grad", None))
            return x
        qs = [leaf(T, H, D) for _ in range(passes)]
        ks = [leaf(T, G, D) for _ in range(passes)]
        vs = [leaf(T, G, D) for _ in range(passes)]
        dout = torch.randn(T, H, D, device=device, dtype=dtype)
        mem.mark("inputs", "forward")
        outs = []
        for p in range(passes):
            kp, vp = (ks[:p + 1], vs[:p + 1]) if step == "ttt" else ([ks[p]], [vs[p]])
            outs.append(eagle3_ttt_attention(qs[p], kp, vp, cu, backend=b))
            mem.mark(f"forward pass {p}")
        mem.mark("forward", "backward")
        torch.autograd.backward(outs, [dout] * passes)
        mem.mark("backward")
        del outs
    inputs = mem.marks[0][1]
    return {"step": step, "tokens": T, "passes": passes, "backend": b.name, "workspace_model": workspace,
            "peak_workspace_bytes": mem.peak_workspace, "device": device, "dtype": str(dtype),
            "peak_bytes": mem.peak, "inputs_bytes": inputs, "peak_over_inputs_bytes": mem.peak - inputs,
            "peak_bytes_per_token": mem.peak / T, "peak_gb_at_256k": mem.peak / T * FIG6_TOKENS / 1e9,
            "marks": [{"at": a, "live_bytes": lv, "peak_bytes": pk} for a, lv, pk in mem.marks],
            "live_at_peak_by_origin": mem.at_peak, "engine_inplace_sums": mem.engine_sums}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", choices=["meta", "cpu"], default="meta")
    ap.add_argument("--tokens", default="16384", help="comma list of packed lengths T (one document)")
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--step", choices=["ttt", "trunk"], default="ttt",
                    help="ttt: the 'ttt' row (branch keys of earlier passes); trunk: the 'trunk' row")
    ap.add_argument("--backend", default=None, help="default: cudnn (meta) / sdpa_cpu (cpu)")
    ap.add_argument("--dtype", default=None, help="default: bfloat16 (meta) / float32 (cpu)")
    ap.add_argument("--out", type=Path, default=None, help="write the results here (JSON)")
    ap.add_argument("-v", "--verbose", action="store_true", help="print what is live at the peak")
    ap.add_argument("--workspace", choices=list(WORKSPACE_MODELS), default="none",
                    help="add a kernel-workspace model to the peak (cudnn-h200: fitted to one H200 run)")
    ap.add_argument("--tile", type=int, default=0, help="tiled backward with this many rows per tile (0: off)")
    ap.add_argument("--kv-tile", type=int, default=None, help="keys per tile (default: --tile; 0: keys not cut)")
    ap.add_argument("--grad-acc", choices=["input", "fp32"], default="input", help="tiled dk/dv accumulation")
    ap.add_argument("--branch-chunk-rows", type=int, default=0, help="TTT branch rows per chunk (0: library default)")
    args = ap.parse_args(argv)
    backend = args.backend or ("cudnn" if args.mode == "meta" else "sdpa_cpu")
    dtype = getattr(torch, args.dtype or ("bfloat16" if args.mode == "meta" else "float32"))
    if args.mode == "cpu" and args.out is None:
        torch.set_num_threads(1)
    if args.branch_chunk_rows:
        from kernels.attention.branch import TTTBranch
        TTTBranch.chunk_elems_default = args.branch_chunk_rows * H * D
    rows = []
    for t in args.tokens.split(","):
        b = backends.get(backend)
        if args.tile:
            from kernels.attention.backends.tiled import TiledBackward
            b = TiledBackward(b, args.tile, args.grad_acc, args.kv_tile)
        r = ttt_step_peak(int(t), args.passes, b, args.mode, dtype, args.step, args.workspace)
        rows.append(r)
        print(f"{args.step} T={r['tokens']:>7} {r['backend']:>12} {r['dtype']:>14}: peak {r['peak_bytes'] / 1e9:8.3f} GB "
              f"({r['peak_bytes_per_token']:9.1f} B/token, inputs {r['inputs_bytes'] / r['tokens']:9.1f} B/token)"
              f" -> {r['peak_gb_at_256k']:.2f} GB at 256K", flush=True)
        if args.verbose:
            for m in r["marks"]:
                print(f"    {m['at']:>16}: live {m['live_bytes'] / 1e9:8.3f} GB, peak so far {m['peak_bytes'] / 1e9:8.3f} GB")
            for k, n in r["live_at_peak_by_origin"].items():
                print(f"    at peak {n / 1e9:8.3f} GB  {k}")
    if args.out is not None:
        from repro.report.provenance import provenance, write_json_atomic
        write_json_atomic(args.out, {"tool": "repro.bench.attention_memory", "label": "cpu-emulated",
                                     "mode": args.mode, "rows": rows, "provenance": provenance()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
