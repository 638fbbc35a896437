"""The suite's Triton kernels address rows in 64 bits: a row index times its stride passes 2**31 elements at sizes
the suite runs (the decode kernel's stacked static cache at 64 rows x 1280 columns x 28 layers; the TTT branch and
the replica merge past 512K tokens of 32 x 128), and Triton multiplies an i32 by an i32 stride in i32. Checked in
each kernel's IR for an sm90 target (no GPU needed): every row stride meets the row index as i64, never in an i32
product.

    .venv/bin/python -m pytest -q tests/attention/test_triton_offsets.py
"""
import re

import pytest
from triton_ir import build_ir

TTT = {"HG": 4, "D": 128, "BH": 4, "BD": 128, "BT": 8, "P": 3}
MERGE = {"D": 128, "BH": 4, "BD": 128}
CASES = {
    "decode": ("kernels.attention.decode_triton", "_decode_attention_kernel",
               {"BLOCK_M": 16, "BLOCK_S": 64, "D": 128, "BOOL_MASK": False, "WRITE": True, "BLOCK_Q": 8},
               {"scale": "fp32", "m_ptr": "*fp32", "c_ptr": "*i64"},
               ("s_qb", "s_kb", "s_vb", "s_mb", "s_ob", "s_knb", "s_vnb")),
    "ttt_forward": ("kernels.attention.ttt_branch_triton", "_merge_fwd", TTT,
                    {"q": "*bf16", "o_t": "*bf16", "l_t": "*fp32", "out": "*bf16", "lse": "*fp32", "tab": "*i64",
                     "scale": "fp32"},
                    ("sq_t", "so_t", "sl_t", "sout_t", "slse_t", "sk_t")),
    "ttt_backward": ("kernels.attention.ttt_branch_triton", "_branch_bwd", TTT,
                     {"dout": "*bf16", "q": "*bf16", "out": "*bf16", "lse": "*fp32", "dq": "*fp32", "tab": "*i64",
                      "scale": "fp32"},
                     ("sdo_t", "sq_t", "so_t", "sl_t", "sdq_t", "sk_t")),
    "replica_merge": ("kernels.attention.replica_merge_triton", "_merge", MERGE,
                      {"o_r": "*bf16", "l_r": "*fp32", "ptr": "*i64", "pos": "*i64", "out": "*bf16", "lse": "*fp32"},
                      ("sout_t", "slse_t")),
    "replica_sum": ("kernels.attention.replica_merge_triton", "_sum", MERGE,
                    {"g_r": "*fp32", "ptr": "*i64", "pos": "*i64", "dq": "*fp32"}, ("sdq_t",)),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", sorted(CASES))
def test_row_offsets_are_64_bit(case):
    module, kernel, constexprs, types, strides = CASES[case]
    run = build_ir(module, kernel, constexprs, types)
    assert run.returncode == 0, run.stderr[-3000:]
    for stride in strides:
        assert f"arith.extsi %{stride} : i32 to i64" in run.stdout, f"{kernel}: {stride} never widened"
        assert not re.search(rf"arith\.muli [^\n]*%{stride} : i32", run.stdout), f"{kernel}: i32 product of {stride}"
