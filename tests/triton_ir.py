"""Triton kernels checked without a GPU. ``build_ir`` builds a kernel's IR for an sm90 target (Triton's front end
only) in a fresh process without the interpreter (tests/conftest.py turns it on, and ``@triton.jit`` then gives an
interpreted function): it catches what the interpreter lets through, such as a loop variable whose type changes.
``kernel_check_setting`` is where a kernel's values are checked and to what tolerance: bf16 on a GPU, fp32 under
Triton's interpreter on a CPU; elsewhere the test is skipped.

    out = build_ir("kernels.attention.decode_triton", "_decode_attention_kernel", constexprs={"D": 128, ...},
                   types={"scale": "fp64", "c_ptr": "*i64"})      # other pointers "*bf16", other scalars "i32"
    assert out.returncode == 0, out.stderr
    device, dtype, rtol, atol = kernel_check_setting()
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

SCRIPT = """
import importlib, inspect, json, sys
from triton._C.libtriton import ir
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import CUDABackend
from triton.compiler.compiler import ASTSource

kern = getattr(importlib.import_module(sys.argv[1]), sys.argv[2])
constexprs, types = json.loads(sys.argv[3]), json.loads(sys.argv[4])
names = list(inspect.signature(kern.fn).parameters)
signature = {n: "constexpr" if n in constexprs else types.get(n, "*bf16" if n.endswith("_ptr") else "i32")
             for n in names}
target = GPUTarget("cuda", 90, 32)
backend = CUDABackend(target)
options = backend.parse_options({})
context = ir.context()
ir.load_dialects(context)
backend.load_dialects(context)
src = ASTSource(fn=kern, signature=signature, constexprs={(names.index(n),): v for n, v in constexprs.items()})
print(src.make_ir(target, options, backend.get_codegen_implementation(options), backend.get_module_map(), context))
"""


def build_ir(module: str, kernel: str, constexprs: dict, types: dict | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return subprocess.run([sys.executable, "-c", SCRIPT, module, kernel, json.dumps(constexprs),
                           json.dumps(types or {})], env=env, cwd=root, capture_output=True, text=True, timeout=100)


def kernel_check_setting() -> tuple:
    """(device, dtype, rtol, atol) of a kernel's check against fp64: a GPU's bf16 (to bf16's rounding), else fp32
    under Triton's interpreter on the CPU; without either the calling test is skipped."""
    import pytest
    import torch

    if torch.cuda.is_available():
        return "cuda", torch.bfloat16, 2e-2, 1e-1
    if os.environ.get("TRITON_INTERPRET") == "1":
        return "cpu", torch.float32, 1e-5, 1e-4
    pytest.skip("without a GPU these checks run the kernel under Triton's interpreter")
