"""Compile the decode-path Triton kernels (and the fused MoE layer's, and the LoRA shrink and expand) for a
Hopper GPU (sm_90) without one.

    python scripts/compile_check.py    (also run by tests/test_compile_check.py)

Triton's ahead-of-time path runs the whole pipeline (TTIR -> PTX -> cubin with the bundled ptxas),
so a kernel that would not build on the device fails here. Kernels built with ``USE_PDL`` must
carry the ``griddepcontrol`` instructions of programmatic dependent launch in their PTX. It says
nothing about speed or results: the GPU tests do that.
"""

from __future__ import annotations

import sys

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from minivllm.kernels import (
    fp8_quant,
    fused_act,
    fused_moe,
    fused_moe_decode,
    fused_norm,
    fused_rope,
    gemv,
    grammar_mask,
    lora,
    moe_align,
    moe_topk,
    paged_attention,
    paged_decode,
)
from minivllm.kernels import gumbel_sample as gs
from minivllm.kernels import one_shot_all_reduce as ar

TARGET = GPUTarget("cuda", 90, 32)


def _ints(fn, sig: dict, consts: dict) -> dict:
    """``sig`` with every other non-constexpr argument of ``fn`` an i32."""
    return {**{a: "i32" for a in fn.arg_names if a not in consts}, **sig}


MOE_GEMM_PTRS = {"c_ptr": "*bf16", "a_scale_ptr": "*fp32", "b_scale_ptr": "*fp32", "topk_w_ptr": "*fp32",
                 "sorted_ptr": "*i32", "expert_ids_ptr": "*i32", "post_pad_ptr": "*i32"}


# the expert kernels' epilogue constexprs as unbiased SiLU experts compile them (gpt-oss's: ``_gpt_oss``)
NO_BIAS = {"HAS_BIAS": False}
SILU = {"ACTIVATION": 0, "ALPHA": 1.702, "LIMIT": 7.0}


def _moe_gemm(fp8: bool, gated: bool, bm: int, bn: int, mxfp4: bool = False) -> dict:
    return {"A_ROW_DIV": 8 if gated else 1, "GATED": gated, "MUL_WEIGHT": not gated, "FP8": fp8, "MXFP4": mxfp4,
            "GROUP_N": 128 if fp8 else 1, "GROUP_K": 128 if fp8 else 64, "DOT_F32": False, "PRECISION": "tf32",
            "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 64, "GROUP_M": 8, "NUM_STAGES": 3, "USE_PDL": True,
            **NO_BIAS, **SILU}


def _moe_gemv(fp8: bool, picks: int | None = None, mxfp4: bool = False) -> dict:
    return {"TOP_K": 8, **({} if picks is None else {"PICKS": picks}), "HAS_SCALE": fp8, "MXFP4": mxfp4, "GROUP_N": 128 if fp8 else 1, "GROUP_K": 128 if fp8 else 1 << 30,
            "BLOCK_N": 4, "BLOCK_K": 128 if fp8 else 256, "NUM_STAGES": 4, "USE_PDL": True,
            **NO_BIAS, **(SILU if picks is None else {})}


def _gpt_oss(consts: dict, gated: bool) -> dict:
    """``consts`` with gpt-oss's expert biases, and its clamped SwiGLU where ``gated``."""
    return {**consts, "HAS_BIAS": True, **({"ACTIVATION": 1, "ALPHA": 1.702, "LIMIT": 7.0} if gated else {})}


MOE_KERNELS = [
    ("MoE top-k softmax routing, E=128 top-8 (PDL)", moe_topk._topk_softmax_kernel,
     {"logits_ptr": "*bf16", "weights_ptr": "*fp32", "ids_ptr": "*i32", "E": "i32", "stride_l": "i32"},
     {"TOP_K": 8, "K_PAD": 8, "E_PAD": 128, "RENORMALIZE": True, "USE_PDL": True}),
    ("MoE align in one program (PDL)", moe_align._align_one_chunk_kernel,
     _ints(moe_align._align_one_chunk_kernel, {"ids_ptr": "*i32", "sorted_ptr": "*i32", "expert_ids_ptr": "*i32",
                                               "post_pad_ptr": "*i32"}, {"BLOCK_M", "E_PAD", "CHUNK", "FILL", "USE_PDL"}),
     {"BLOCK_M": 16, "E_PAD": 128, "CHUNK": 128, "FILL": 64, "USE_PDL": True}),
    ("MoE align: chunk counts and sentinel fill (PDL)", moe_align._chunk_counts_kernel,
     _ints(moe_align._chunk_counts_kernel, {"ids_ptr": "*i32", "counts_ptr": "*i32", "sorted_ptr": "*i32"},
           {"E_PAD", "CHUNK", "FILL", "USE_PDL"}), {"E_PAD": 128, "CHUNK": 128, "FILL": 512, "USE_PDL": True}),
    ("MoE align: offsets (PDL)", moe_align._offsets_kernel,
     _ints(moe_align._offsets_kernel, {"counts_ptr": "*i32", "expert_ids_ptr": "*i32", "post_pad_ptr": "*i32"},
           {"BLOCK_M", "E_PAD", "FILL", "USE_PDL"}),
     {"BLOCK_M": 64, "E_PAD": 128, "FILL": 64, "USE_PDL": True}),
    ("MoE align: scatter (PDL)", moe_align._scatter_kernel,
     {"ids_ptr": "*i32", "offsets_ptr": "*i32", "sorted_ptr": "*i32", "numel": "i32"},
     {"E_PAD": 128, "CHUNK": 128, "USE_PDL": True}),
    *[(f"MoE grouped GEMM {'1 (gate/up + SiLU-and-mul)' if gated else '2 (down)'}, {bm}x{bn}"
       f"{', FP8 block' if fp8 else ''} (PDL)", fused_moe._moe_gemm_kernel,
       _ints(fused_moe._moe_gemm_kernel, {**MOE_GEMM_PTRS, "a_ptr": "*fp8e4nv" if fp8 else "*bf16",
                                          "b_ptr": "*fp8e4nv" if fp8 else "*bf16"}, _moe_gemm(fp8, gated, bm, bn)),
       _moe_gemm(fp8, gated, bm, bn))
      for fp8 in (False, True) for gated in (True, False) for bm, bn in ((16, 64), (64, 128))],
    *[(f"MoE decode GEMV gate/up{', FP8 block' if fp8 else ''} (PDL)", fused_moe_decode._moe_gemv_gate_up_kernel,
       _ints(fused_moe_decode._moe_gemv_gate_up_kernel, {"x_ptr": "*bf16", "w_ptr": "*fp8e4nv" if fp8 else "*bf16",
                                                  "scale_ptr": "*fp32", "ids_ptr": "*i32", "out_ptr": "*bf16"},
             _moe_gemv(fp8)), _moe_gemv(fp8))
      for fp8 in (False, True)],
    *[(f"MoE decode GEMV down, {picks} picks a program{', FP8 block' if fp8 else ''} (PDL)",
       fused_moe_decode._moe_gemv_down_kernel,
       _ints(fused_moe_decode._moe_gemv_down_kernel, {"a_ptr": "*bf16", "w_ptr": "*fp8e4nv" if fp8 else "*bf16",
                                                      "scale_ptr": "*fp32", "ids_ptr": "*i32", "topk_w_ptr": "*fp32",
                                                      "out_ptr": "*bf16"}, _moe_gemv(fp8, picks)),
       _moe_gemv(fp8, picks))
      for fp8 in (False, True) for picks in (8, 1)],
    *[(f"MoE grouped GEMM {'1 (gate/up + clamped SwiGLU)' if gated else '2 (down)'}, biases (gpt-oss) (PDL)",
       fused_moe._moe_gemm_kernel,
       _ints(fused_moe._moe_gemm_kernel, {**MOE_GEMM_PTRS, "a_ptr": "*bf16", "b_ptr": "*bf16", "bias_ptr": "*bf16"},
             _gpt_oss(_moe_gemm(False, gated, 64, 128), gated)), _gpt_oss(_moe_gemm(False, gated, 64, 128), gated))
      for gated in (True, False)],
    ("MoE decode GEMV gate/up, biases + clamped SwiGLU (gpt-oss) (PDL)", fused_moe_decode._moe_gemv_gate_up_kernel,
     _ints(fused_moe_decode._moe_gemv_gate_up_kernel, {"x_ptr": "*bf16", "w_ptr": "*bf16", "scale_ptr": "*fp32",
                                                       "ids_ptr": "*i32", "out_ptr": "*bf16", "bias_ptr": "*bf16"},
           _gpt_oss(_moe_gemv(False), True)), _gpt_oss(_moe_gemv(False), True)),
    ("MoE decode GEMV down, biases (gpt-oss) (PDL)", fused_moe_decode._moe_gemv_down_kernel,
     _ints(fused_moe_decode._moe_gemv_down_kernel, {"a_ptr": "*bf16", "w_ptr": "*bf16", "scale_ptr": "*fp32",
                                                    "ids_ptr": "*i32", "topk_w_ptr": "*fp32", "out_ptr": "*bf16",
                                                    "bias_ptr": "*bf16"}, _gpt_oss(_moe_gemv(False, 4), False)),
     _gpt_oss(_moe_gemv(False, 4), False)),
    # gpt-oss's MXFP4 experts: packed uint8 weights and e8m0 scales dequantized in registers, bf16 activations,
    # biases and the clamped SwiGLU
    *[(f"MoE grouped GEMM {'1 (gate/up + clamped SwiGLU)' if gated else '2 (down)'}, {bm}x{bn}, MXFP4 + biases "
       "(gpt-oss) (PDL)", fused_moe._moe_gemm_kernel,
       _ints(fused_moe._moe_gemm_kernel, {**MOE_GEMM_PTRS, "a_ptr": "*bf16", "b_ptr": "*u8", "b_scale_ptr": "*u8",
                                          "bias_ptr": "*bf16"}, _gpt_oss(_moe_gemm(False, gated, bm, bn, True), gated)),
       _gpt_oss(_moe_gemm(False, gated, bm, bn, True), gated))
      for gated in (True, False) for bm, bn in ((16, 64), (64, 128))],
    ("MoE decode GEMV gate/up, MXFP4 + biases + clamped SwiGLU (gpt-oss) (PDL)",
     fused_moe_decode._moe_gemv_gate_up_kernel,
     _ints(fused_moe_decode._moe_gemv_gate_up_kernel, {"x_ptr": "*bf16", "w_ptr": "*u8", "scale_ptr": "*u8",
                                                       "ids_ptr": "*i32", "out_ptr": "*bf16", "bias_ptr": "*bf16"},
           _gpt_oss(_moe_gemv(False, mxfp4=True), True)), _gpt_oss(_moe_gemv(False, mxfp4=True), True)),
    ("MoE decode GEMV down, 4 picks a program, MXFP4 + biases (gpt-oss) (PDL)", fused_moe_decode._moe_gemv_down_kernel,
     _ints(fused_moe_decode._moe_gemv_down_kernel, {"a_ptr": "*bf16", "w_ptr": "*u8", "scale_ptr": "*u8",
                                                    "ids_ptr": "*i32", "topk_w_ptr": "*fp32", "out_ptr": "*bf16",
                                                    "bias_ptr": "*bf16"}, _gpt_oss(_moe_gemv(False, 4, True), False)),
     _gpt_oss(_moe_gemv(False, 4, True), False)),
]
AR_SIG = {"x_ptr": "*bf16", "out_ptr": "*bf16", "n": "i32", "cap": "i32", "ptrs": "*i64", "counters": "*i32"}
NORM_SIG = {"x_ptr": "*bf16", "res_ptr": "*bf16", "w_ptr": "*bf16", "M": "i32", "D": "i32", "eps": "fp32",
            "cap": "i32", "ptrs": "*i64", "counters": "*i32"}
LORA_INDEX = {"sorted_ptr": "*i32", "counts_ptr": "*i32", "starts_ptr": "*i32"}


def _lora_shrink(dtype: str, rank: int, split_k: int, fma_rows: int = 0) -> tuple:
    ptrs = dict.fromkeys(("x_ptr", "a0_ptr", "a1_ptr", "a2_ptr"), f"*{dtype}")
    consts = {"MAX_RANK": rank, "BLOCK_R": fma_rows or max(16, rank), "BLOCK_M": 1 if fma_rows else 16,
              "BLOCK_K": 512 if fma_rows else 128, "SPLIT_K": split_k, "FMA": fma_rows > 0, "DOT_F32": False,
              "IEEE": dtype == "fp32", "G_PAD": 16, "USE_PDL": True}  # 8 slots and the base model
    variant = f"FMA, {fma_rows} rank row(s) a program" if fma_rows else f"split-K {split_k}"
    return (f"LoRA shrink, {dtype}, rank {rank}, {variant} (PDL)", lora._lora_shrink_kernel,
            _ints(lora._lora_shrink_kernel, {**ptrs, **LORA_INDEX, "out_ptr": "*fp32"}, consts), consts)


def _lora_expand(dtype: str, rank: int, bm: int) -> tuple:
    ptrs = dict.fromkeys(("b0_ptr", "b1_ptr", "b2_ptr", "y_ptr"), f"*{dtype}")
    consts = {"MAX_RANK": rank, "BLOCK_R": max(16, rank), "BLOCK_M": bm, "BLOCK_N": 128, "DOT_F32": False,
              "IEEE": dtype == "fp32", "G_PAD": 8, "USE_PDL": True}
    return (f"LoRA expand, {dtype}, rank {rank}, {bm}-row tile (PDL)", lora._lora_expand_kernel,
            _ints(lora._lora_expand_kernel, {**ptrs, **LORA_INDEX, "s_ptr": "*fp32"}, consts), consts)


LORA_KERNELS = [
    *[_lora_shrink(dtype, rank, split_k) for dtype in ("bf16", "fp16") for rank in (8, 64) for split_k in (1, 16)],
    _lora_shrink("fp32", 16, 4),
    *[_lora_shrink(dtype, rank, 1, rows) for dtype in ("bf16", "fp32") for rank, rows in ((16, 1), (64, 4))],
    *[_lora_expand(dtype, rank, bm) for dtype in ("bf16", "fp16") for rank in (8, 64) for bm in (16, 64)],
    _lora_expand("fp32", 16, 64),
]
KERNELS = [
    *[(f"one-shot all-reduce, {w} ranks{' (PDL)' if pdl else ''}", ar._one_shot_all_reduce_kernel, AR_SIG,
       {"RANK": 0, "WORLD": w, "BLOCK": 2048, "CHECK_EVERY": 1024, "TIMED_ABORT": pdl, "USE_PDL": pdl})
      for w in (2, 4) for pdl in (False, True)],
    *[(f"all-reduce + add + RMSNorm, {w} ranks{' (PDL)' if pdl else ''}", ar._one_shot_all_reduce_add_rms_norm_kernel,
       NORM_SIG, {"RANK": 1, "WORLD": w, "BLOCK_D": 4096, "ROWS": 2, "CHECK_EVERY": 1024, "TIMED_ABORT": pdl,
                  "USE_PDL": pdl})
      for w in (2, 4) for pdl in (False, True)],
    *[(f"GEMV, {bm}-row tile{', FP8 weights' if fp8 else ''} (PDL)", gemv._gemv_kernel,
       {"x_ptr": "*bf16", "w_ptr": "*fp8e4nv" if fp8 else "*bf16", "scale_ptr": "*fp32", "bias_ptr": "*bf16",
        "out_ptr": "*bf16", "M": "i32", "N": "i32", "K": "i32", "stride_xm": "i32", "stride_wn": "i32",
        "stride_om": "i32"},
       {"HAS_BIAS": False, "HAS_SCALE": fp8, "DOT_F32": False, "BLOCK_M": bm, "BLOCK_N": 32,
        "BLOCK_K": 256 if bm <= 64 else 128, "NUM_STAGES": 4, "USE_PDL": True})
      for bm in (16, 128) for fp8 in (False, True)],
    *[(f"GEMV, one row, FMA, {bn}x{bk}{', FP8 weights' if fp8 else ''} (PDL)", gemv._gemv_fma_kernel,
       {"x_ptr": "*bf16", "w_ptr": "*fp8e4nv" if fp8 else "*bf16", "scale_ptr": "*fp32", "bias_ptr": "*bf16",
        "out_ptr": "*bf16", "N": "i32", "K": "i32", "stride_xm": "i32", "stride_wn": "i32", "stride_om": "i32"},
       {"HAS_BIAS": True, "HAS_SCALE": fp8, "BLOCK_N": bn, "BLOCK_K": bk, "NUM_STAGES": st, "USE_PDL": True})
      for bn, bk, st in ((8, 256, 6), (16, 256, 4), (16, 512, 3), (8, 512, 4)) for fp8 in (False, True)],
    ("grammar bitmask on logits", grammar_mask._grammar_mask_kernel,
     {"logits_ptr": "*fp32", "stride_b": "i32", "rows_ptr": "*i64", "mask_ptr": "*i32", "stride_m": "i32", "V": "i32",
      "W": "i32"}, {"BLOCK_W": 64}),
    *[(f"FP8 per-token activation quantization{name}", fp8_quant._quant_row_kernel,
       {"x_ptr": "*bf16", "q_ptr": "*fp8e4nv", "scale_ptr": "*fp32", "K": "i32", "stride_x": "i32", "stride_q": "i32"},
       {"BLOCK": 1024, "GIVEN_SCALE": given}) for name, given in (("", False), (", scales given", True))],
    ("add + RMSNorm (PDL)", fused_norm._rms_norm_kernel,
     {"x_ptr": "*bf16", "res_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16", "res_out_ptr": "*bf16",
      "stride_x": "i32", "stride_res": "i32", "stride_out": "i32", "stride_res_out": "i32", "d": "i32", "eps": "fp32"},
     {"HAS_RESIDUAL": True, "BLOCK_D": 4096, "USE_PDL": True}),
    ("SiLU-and-mul (PDL)", fused_act._silu_and_mul_kernel,
     {"x_ptr": "*bf16", "out_ptr": "*bf16", "stride_x": "i32", "stride_out": "i32", "d": "i32"},
     {"BLOCK": 1024, "USE_PDL": True}),
    *[(f"q/k norm + RoPE{' + KV store' + (' (fp8)' if sat else '') if store else ''} (PDL)",
       fused_rope._qk_norm_rope_kernel,
       {**dict.fromkeys(("q_ptr", "k_ptr", "qo_ptr", "ko_ptr", "v_ptr"), "*bf16"), "pos_ptr": "*i64",
        "cache_ptr": "*fp32", "qw_ptr": "*bf16", "kw_ptr": "*bf16", "k_cache_ptr": cache, "v_cache_ptr": cache,
        "slot_ptr": "*i64",
        **dict.fromkeys(("stride_qt", "stride_qh", "stride_kt", "stride_kh", "stride_qot", "stride_qoh", "stride_kot",
                         "stride_koh", "stride_vt", "stride_vh", "stride_cb", "stride_cs", "stride_ch", "stride_cache",
                         "num_q_heads", "num_k_heads"), "i32"), "eps": "fp32", "inv_k_scale": "fp32", "inv_v_scale": "fp32"},
       {"HALF": 64, "HAS_NORM": True, "BLOCK_H": 8, "BLOCK_HALF": 64, "STORE_KV": store, "CACHE_BLOCK": 256,
        "SAT": sat, "USE_PDL": True})
      for store, cache, sat in ((False, "*bf16", 0.0), (True, "*bf16", 0.0), (True, "*fp8e4nv", 448.0))],
    *[(f"split-KV decode (PDL){name}", paged_decode._split_kv_decode_kernel,
     {**dict.fromkeys(("m_part_ptr", "l_part_ptr", "acc_part_ptr"), "*fp32"), "q_ptr": "*bf16", "k_cache_ptr": "*bf16",
      "v_cache_ptr": "*bf16", "context_lens_ptr": "*i32", "block_tables_ptr": "*i32", "sinks_ptr": "*bf16",
      "qk_scale": "fp32",
      **dict.fromkeys(("stride_qt", "stride_qh", "stride_kb", "stride_ks", "stride_kh", "stride_vb", "stride_vs",
                       "stride_vh", "stride_bt"), "i32")},
     {"NUM_HEADS": 16, "NUM_SPLITS": 8, "GROUP": 4, "BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_SIZE": 256, "HEAD_DIM": 128,
      "HEAD_DIM_PAD": 128, "DOT_DTYPE": tl.bfloat16, "USE_PDL": True, "WINDOW": window, "HAS_SINKS": sinks})
      for name, window, sinks in (("", 0, False), (", sliding window 1024", 1024, False),
                                  (", window 128 + sinks", 128, True))],
    ("split-KV reduce (PDL)", paged_decode._split_kv_reduce_kernel,
     {"out_ptr": "*bf16", **dict.fromkeys(("m_part_ptr", "l_part_ptr", "acc_part_ptr"), "*fp32"), "v_scale": "fp32",
      "stride_ot": "i32", "stride_oh": "i32"},
     {"NUM_HEADS": 16, "NUM_SPLITS": 8, "SPLITS_PAD": 8, "HEAD_DIM": 128, "HEAD_DIM_PAD": 128, "USE_PDL": True}),
    *[(f"paged attention (PDL){name}", paged_attention._paged_attention_kernel,
       {"out_ptr": "*bf16", "q_ptr": "*bf16", "k_cache_ptr": cache, "v_cache_ptr": cache, "cu_seqlens_q_ptr": "*i32",
        "context_lens_ptr": "*i32", "block_tables_ptr": "*i32", "sinks_ptr": "*bf16", "qk_scale": "fp32",
        "v_scale": "fp32",
        **dict.fromkeys(("stride_qt", "stride_qh", "stride_ot", "stride_oh", "stride_kb", "stride_ks", "stride_kh",
                         "stride_vb", "stride_vs", "stride_vh", "stride_bt"), "i32")},
       {"GROUP": 4, "G_PAD": 4, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_SIZE": 256, "HEAD_DIM": 128, "HEAD_DIM_PAD": 128,
        "IS_DECODE": decode, "DOT_DTYPE": dot, "USE_PDL": True, "WINDOW": window, "HAS_SINKS": sinks})
      for name, cache, bm, bn, decode, dot, window, sinks in (
          ("", "*bf16", 64, 64, False, tl.bfloat16, 0, False),
          (", FP8 KV decode", "*fp8e4nv", 16, 128, True, tl.float16, 0, False),
          (", sliding window 1024", "*bf16", 64, 64, False, tl.bfloat16, 1024, False),
          (", window 128 + sinks", "*bf16", 64, 64, False, tl.bfloat16, 128, True))],
    *[(f"Gumbel chunk{name}", gs._gumbel_chunk_kernel,
       {"logits_ptr": "*bf16", "stride_b": "i32", "temperature_ptr": "*fp32", "seeds_ptr": "*i64",
        "best_ptr": "*fp32", "idx_ptr": "*i32", "V": "i32", "C": "i32", "vocab_start": "i32"},
       {"HAS_TEMPERATURE": noisy, "NOISY": noisy, "BLOCK_V": 4096})
      for name, noisy in (("", True), (" (all greedy)", False))],
    ("Gumbel pick", gs._gumbel_pick_kernel, {"best_ptr": "*fp32", "idx_ptr": "*i32", "out_ptr": "*i64", "C": "i32"},
     {"BLOCK_C": 64, "PAIR": False}),
    ("Gumbel pick, sharded (best, id) pairs", gs._gumbel_pick_kernel,
     {"best_ptr": "*fp32", "idx_ptr": "*i32", "out_ptr": "*fp64", "C": "i32"}, {"BLOCK_C": 64, "PAIR": True}),
    *MOE_KERNELS,
    *LORA_KERNELS,
]


def main() -> int:
    failed = 0
    for name, fn, sig, consts in KERNELS:
        try:
            kernel = triton.compile(ASTSource(fn=fn, signature={**sig, **dict.fromkeys(consts, "constexpr")},
                                              constexprs=consts), target=TARGET)
            if consts.get("USE_PDL") and not all(f"griddepcontrol.{op}" in kernel.asm["ptx"]
                                                 for op in ("wait", "launch_dependents")):
                raise RuntimeError("USE_PDL: griddepcontrol.wait / launch_dependents missing from the PTX")
            print(f"ok    {name} (cubin {len(kernel.asm['cubin'])} bytes)")
        except Exception as e:  # noqa: BLE001 - reported, then the exit status says it
            failed += 1
            print(f"FAIL  {name}: {type(e).__name__}: {str(e)[:500]}")
    print(f"triton {triton.__version__}, target sm_{TARGET.arch}: {len(KERNELS) - failed} of {len(KERNELS)} compiled")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
