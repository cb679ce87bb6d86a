"""Measured kernel times on the H200 (sm_90): what ``auto`` (the ``dispatch`` backend) picks from.

µs per call of each kernel path at ``(heads, rows, topk)``, bf16, from the kernel benchmark
(``python -m graphattn.bench.kernels --json ...``; CUDA graphs of many calls, KV from HBM; see
docs/benchmarks.md, "Kernels", whose table these numbers are: a test checks that the two agree).
Measured 2026-11-30 on one H200, torch 2.11, triton 3.6, at commit e9e67c2 (flashmla with the
tokens-major kernel at <= 32 heads); the flashmla numbers again at a925a51 (the warp-specialised
kernel's one-split output stored through shared memory; 19ed657, q loaded by its consumer, measured
1-3% faster in an A/B at 1-64 rows and not re-tabled), and the whole flashmla column again on
2026-12-01 at 6f924a3 (``wgmma_rr`` for bf16 at 64+ heads and 32 x 8), and at 64 x 64 (topk 2048
and 8192) on 2026-12-01 (session 2) in the A/B of the cluster merge (4182420: two splits merged in
the kernel), and on 2026-12-01 (session 5) at 7d187bb where split partials of whole 64-head blocks are stored in
the accumulator's order and merged by the Gluon combine (64 x 8, 128 x 1, 128 x 8, 64 and 128 x 8
x topk 32768), those rows again at 1956748 (the partials in q's dtype). FP8 (656-byte tokens):
the same table with ``--kv-dtype fp8`` (docs/benchmarks.md, "FP8 kernel table"), its flashmla
column again on 2026-12-01 at 7c902cc (each tile dequantised by both consumers), on 2026-12-01
(session 3) at 8086c3c (``wgmma_ws``'s two splits merged in a cluster by its producer), and on
2026-12-01 (session 5) at 7d187bb (the same shapes with accumulator-order partials, and 64 x 1) and
at 1956748 (those partials in q's dtype). Both columns' rows that store partials in that order
were measured again on 2026-12-01 (session 6) at 1fef9ea, where a partly-masked head block stores
them compact (32 x 8, FP8 32 x 1 and 32 x 8 changed path; the others' code changed only in the
store's offsets). FP8 16 x 1, 16 x 8, 32 x 1 and 32 x 8 are from the A/Bs of 2026-12-01 (session 7)
at d59f8a5, where those shapes run ``wgmma_tn``'s ring of raw FP8 slots. bf16 128 x 64, 128 x 512
and 128 x 64 x topk 8192 are from the A/B of 2026-12-02 (session 8) of wgmma_rr's ``IDX_EARLY``
(the producer's index loads off its path; landed at f1cc3de). The whole bf16 flashmla column was
measured again in one run on 2026-12-03 (session 9) at cb05bee (that producer loading its indices
early in splits too), replacing those rows: within -1.0% to +4.1% of them. Both flashmla columns
(bf16 and FP8) were measured again in one run on 2026-12-04 (session 16) at 96b3631 (the combine a
programmatic dependent launch of one program per SM where it fits, up to 16 heads a program of
wgmma_tn's head-major combine), replacing every flashmla row of both tables. FP8 16 x 64, 16 x
512 and 16 x 8 x topk 32768 are from the A/B of 2026-12-04 (session 17) that landed wgmma_tn's
raw halves (RAW_HALVES, 0810716); FP8 16 x 64 x topk 8192 was not measured again. The whole FP8
flashmla column was measured again in one run on 2026-12-04 (session 18) at 01a0d56 (every Gluon
FP8 path dequantising through a register layout whose shared stores do not conflict), replacing
every FP8 flashmla row. Both flashmla columns were measured again in one run on 2026-12-04
(session 19) at 1a77a45 (the merges' f32 staging without bank conflicts, wgmma_tn's early indices
for FP8 tokens in place), replacing every flashmla row of both tables. The whole FP8 flashmla
column was measured again in one run on 2026-12-04 (session 20) at eceb4f0 (wgmma_tn's raw tile:
the scores at 16 heads from registers), replacing every FP8 flashmla row.
"""

from __future__ import annotations

H200_US: dict[tuple[int, int, int], dict[str, float]] = {
    (16, 1, 2048): {"flashmla": 8.8, "trtllm": 24.5, "mega": 115.7},
    (16, 8, 2048): {"flashmla": 12.6, "trtllm": 26.7, "mega": 118.0},
    (16, 64, 2048): {"flashmla": 45.1, "trtllm": 66.2, "mega": 122.3},
    (16, 512, 2048): {"flashmla": 297.7, "trtllm": 334.0, "mega": 334.4},
    (32, 1, 2048): {"flashmla": 9.3, "trtllm": 36.5, "mega": 145.3},
    (32, 8, 2048): {"flashmla": 13.5, "trtllm": 39.4, "mega": 145.8},
    (32, 64, 2048): {"flashmla": 49.5, "trtllm": 91.2, "mega": 148.7},
    (32, 512, 2048): {"flashmla": 314.0, "trtllm": 434.7, "mega": 434.1},
    (64, 1, 2048): {"flashmla": 9.9, "trtllm": 37.7, "mega": 145.1},
    (64, 8, 2048): {"flashmla": 14.8, "trtllm": 40.2, "mega": 146.1},
    (64, 64, 2048): {"flashmla": 51.6, "trtllm": 120.8, "mega": 149.8},
    (64, 512, 2048): {"flashmla": 323.5, "trtllm": 855.1, "mega": 855.1},
    (128, 1, 2048): {"flashmla": 9.6, "trtllm": 39.0, "mega": 145.0},
    (128, 8, 2048): {"flashmla": 17.6, "trtllm": 63.5, "mega": 145.7},
    (128, 64, 2048): {"flashmla": 69.6, "trtllm": 217.5, "mega": 216.8},
    (128, 512, 2048): {"flashmla": 530.9, "trtllm": 1736.9, "mega": 1726.0},
    (16, 64, 8192): {"flashmla": 149.4, "trtllm": 209.0, "mega": 464.8},
    (64, 64, 8192): {"flashmla": 161.9, "trtllm": 429.2, "mega": 575.1},
    (128, 64, 8192): {"flashmla": 253.3, "trtllm": 837.0, "mega": 834.6},
    (16, 8, 32768): {"flashmla": 79.8, "trtllm": 232.5, "mega": 1820.0},
    (64, 8, 32768): {"flashmla": 87.2, "trtllm": 300.2, "mega": 2253.7},
    (128, 8, 32768): {"flashmla": 130.6, "trtllm": 676.7, "mega": 2244.9},
}

H200_US_FP8: dict[tuple[int, int, int], dict[str, float]] = {
    (16, 1, 2048): {"flashmla": 8.6, "trtllm": 37.6, "mega": 243.5},
    (16, 8, 2048): {"flashmla": 13.0, "trtllm": 39.4, "mega": 250.2},
    (16, 64, 2048): {"flashmla": 44.4, "trtllm": 171.1, "mega": 251.6},
    (16, 512, 2048): {"flashmla": 289.0, "trtllm": 958.0, "mega": 986.8},
    (32, 1, 2048): {"flashmla": 10.2, "trtllm": 55.0, "mega": 312.5},
    (32, 8, 2048): {"flashmla": 16.0, "trtllm": 58.1, "mega": 310.7},
    (32, 64, 2048): {"flashmla": 56.9, "trtllm": 171.8, "mega": 306.5},
    (32, 512, 2048): {"flashmla": 381.2, "trtllm": 918.6, "mega": 919.0},
    (64, 1, 2048): {"flashmla": 10.5, "trtllm": 56.2, "mega": 308.3},
    (64, 8, 2048): {"flashmla": 17.5, "trtllm": 58.8, "mega": 309.7},
    (64, 64, 2048): {"flashmla": 62.2, "trtllm": 238.8, "mega": 306.5},
    (64, 512, 2048): {"flashmla": 388.3, "trtllm": 1794.8, "mega": 1797.8},
    (128, 1, 2048): {"flashmla": 10.7, "trtllm": 57.2, "mega": 305.8},
    (128, 8, 2048): {"flashmla": 23.6, "trtllm": 108.4, "mega": 303.2},
    (128, 64, 2048): {"flashmla": 100.6, "trtllm": 450.0, "mega": 450.9},
    (128, 512, 2048): {"flashmla": 764.0, "trtllm": 3482.0, "mega": 3491.0},
    (16, 64, 8192): {"flashmla": 143.6, "trtllm": 629.8, "mega": 986.5},
    (64, 64, 8192): {"flashmla": 194.7, "trtllm": 896.7, "mega": 1193.9},
    (128, 64, 8192): {"flashmla": 374.1, "trtllm": 1767.3, "mega": 1764.7},
    (16, 8, 32768): {"flashmla": 78.3, "trtllm": 474.4, "mega": 3967.4},
    (64, 8, 32768): {"flashmla": 105.8, "trtllm": 613.1, "mega": 4905.9},
    (128, 8, 32768): {"flashmla": 194.0, "trtllm": 1423.7, "mega": 4771.7},
}
