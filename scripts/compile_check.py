"""Compile the tensor-parallel and sampler Triton kernels for a Hopper GPU (sm_90) without one.

    python scripts/compile_check.py

Triton's ahead-of-time path runs the whole pipeline (TTIR -> PTX -> cubin with the bundled ptxas),
so a kernel that would not build on the device fails here. It says nothing about speed or results:
the GPU tests do that.
"""

from __future__ import annotations

import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from minivllm.kernels import gumbel_sample as gs
from minivllm.kernels import one_shot_all_reduce as ar

TARGET = GPUTarget("cuda", 90, 32)
AR_SIG = {"x_ptr": "*bf16", "out_ptr": "*bf16", "n": "i32", "cap": "i32", "ptrs": "*i64", "counters": "*i32",
          "waits": "*i64"}
NORM_SIG = {"x_ptr": "*bf16", "res_ptr": "*bf16", "w_ptr": "*bf16", "M": "i32", "D": "i32", "eps": "fp32",
            "cap": "i32", "ptrs": "*i64", "counters": "*i32", "waits": "*i64"}
KERNELS = [
    *[(f"one-shot all-reduce, {w} ranks, wait ring {ring}", ar._one_shot_all_reduce_kernel, AR_SIG,
       {"RANK": 0, "WORLD": w, "BLOCK": 2048, "CHECK_EVERY": 1024, "WAIT_RING": ring})
      for w in (2, 4) for ring in (0, 64)],
    *[(f"all-reduce + add + RMSNorm, {w} ranks, wait ring {ring}", ar._one_shot_all_reduce_add_rms_norm_kernel,
       NORM_SIG, {"RANK": 1, "WORLD": w, "BLOCK_D": 4096, "CHECK_EVERY": 1024, "WAIT_RING": ring})
      for w in (2, 4) for ring in (0, 64)],
    ("Gumbel chunk", gs._gumbel_chunk_kernel,
     {"logits_ptr": "*bf16", "stride_b": "i32", "temperature_ptr": "*fp32", "seeds_ptr": "*i64",
      "best_ptr": "*fp32", "idx_ptr": "*i32", "V": "i32", "C": "i32"}, {"HAS_TEMPERATURE": True, "BLOCK_V": 4096}),
    ("Gumbel pick", gs._gumbel_pick_kernel, {"best_ptr": "*fp32", "idx_ptr": "*i32", "out_ptr": "*i64", "C": "i32"},
     {"BLOCK_C": 64}),
]


def main() -> int:
    failed = 0
    for name, fn, sig, consts in KERNELS:
        try:
            kernel = triton.compile(ASTSource(fn=fn, signature={**sig, **dict.fromkeys(consts, "constexpr")},
                                              constexprs=consts), target=TARGET)
            print(f"ok    {name} (cubin {len(kernel.asm['cubin'])} bytes)")
        except Exception as e:  # noqa: BLE001 - reported, then the exit status says it
            failed += 1
            print(f"FAIL  {name}: {type(e).__name__}: {str(e)[:500]}")
    print(f"triton {triton.__version__}, target sm_{TARGET.arch}: {len(KERNELS) - failed} of {len(KERNELS)} compiled")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
