"""Measured kernel times on the H200 (sm_90): what ``auto`` (the ``dispatch`` backend) picks from.

µs per call of each kernel path at ``(heads, rows, topk)``, bf16, from the kernel benchmark
(``python -m graphattn.bench.kernels --json ...``; CUDA graphs of many calls, KV from HBM; see
docs/benchmarks.md, "Kernels", whose table these numbers are: a test checks that the two agree).
Measured 2026-11-30 on one H200, torch 2.11, triton 3.6. FP8 (656-byte tokens): the same table
with ``--kv-dtype fp8`` (docs/benchmarks.md, "FP8 kernel table").
"""

from __future__ import annotations

H200_US: dict[tuple[int, int, int], dict[str, float]] = {
    (16, 1, 2048): {"flashmla": 9.0, "trtllm": 24.0, "mega": 115.0},
    (16, 8, 2048): {"flashmla": 16.4, "trtllm": 26.7, "mega": 114.9},
    (16, 64, 2048): {"flashmla": 59.2, "trtllm": 66.0, "mega": 122.4},
    (16, 512, 2048): {"flashmla": 415.1, "trtllm": 337.4, "mega": 336.9},
    (32, 1, 2048): {"flashmla": 9.5, "trtllm": 36.7, "mega": 145.0},
    (32, 8, 2048): {"flashmla": 17.1, "trtllm": 39.2, "mega": 145.2},
    (32, 64, 2048): {"flashmla": 61.4, "trtllm": 90.7, "mega": 147.8},
    (32, 512, 2048): {"flashmla": 420.8, "trtllm": 434.6, "mega": 434.1},
    (64, 1, 2048): {"flashmla": 10.0, "trtllm": 37.8, "mega": 145.0},
    (64, 8, 2048): {"flashmla": 20.9, "trtllm": 39.9, "mega": 145.5},
    (64, 64, 2048): {"flashmla": 67.1, "trtllm": 120.4, "mega": 148.7},
    (64, 512, 2048): {"flashmla": 438.5, "trtllm": 855.0, "mega": 854.5},
    (128, 1, 2048): {"flashmla": 12.4, "trtllm": 38.9, "mega": 144.9},
    (128, 8, 2048): {"flashmla": 26.3, "trtllm": 62.7, "mega": 145.3},
    (128, 64, 2048): {"flashmla": 112.9, "trtllm": 216.6, "mega": 217.0},
    (128, 512, 2048): {"flashmla": 862.5, "trtllm": 1691.7, "mega": 1686.4},
    (16, 64, 8192): {"flashmla": 206.5, "trtllm": 207.1, "mega": 459.5},
    (64, 64, 8192): {"flashmla": 215.1, "trtllm": 426.3, "mega": 569.0},
    (128, 64, 8192): {"flashmla": 407.1, "trtllm": 838.8, "mega": 838.6},
    (16, 8, 32768): {"flashmla": 110.2, "trtllm": 234.6, "mega": 1771.1},
    (64, 8, 32768): {"flashmla": 114.9, "trtllm": 300.3, "mega": 2239.0},
    (128, 8, 32768): {"flashmla": 212.1, "trtllm": 676.0, "mega": 2235.3},
}

H200_US_FP8: dict[tuple[int, int, int], dict[str, float]] = {
    (16, 1, 2048): {"flashmla": 11.5, "trtllm": 36.5, "mega": 216.0},
    (16, 8, 2048): {"flashmla": 19.7, "trtllm": 37.4, "mega": 217.2},
    (16, 64, 2048): {"flashmla": 102.4, "trtllm": 167.1, "mega": 217.9},
    (16, 512, 2048): {"flashmla": 770.1, "trtllm": 878.4, "mega": 877.0},
    (32, 1, 2048): {"flashmla": 12.5, "trtllm": 74.9, "mega": 436.2},
    (32, 8, 2048): {"flashmla": 21.5, "trtllm": 77.0, "mega": 447.4},
    (32, 64, 2048): {"flashmla": 104.7, "trtllm": 195.4, "mega": 449.1},
    (32, 512, 2048): {"flashmla": 777.0, "trtllm": 976.3, "mega": 975.0},
    (64, 1, 2048): {"flashmla": 13.8, "trtllm": 75.4, "mega": 433.8},
    (64, 8, 2048): {"flashmla": 25.4, "trtllm": 76.1, "mega": 439.5},
    (64, 64, 2048): {"flashmla": 110.7, "trtllm": 269.7, "mega": 440.4},
    (64, 512, 2048): {"flashmla": 789.7, "trtllm": 1902.9, "mega": 1896.2},
    (128, 1, 2048): {"flashmla": 14.7, "trtllm": 75.5, "mega": 432.6},
    (128, 8, 2048): {"flashmla": 36.7, "trtllm": 119.6, "mega": 433.2},
    (128, 64, 2048): {"flashmla": 204.7, "trtllm": 479.7, "mega": 478.3},
    (128, 512, 2048): {"flashmla": 1564.7, "trtllm": 3703.6, "mega": 3697.5},
    (16, 64, 8192): {"flashmla": 389.4, "trtllm": 611.5, "mega": 852.4},
    (64, 64, 8192): {"flashmla": 395.8, "trtllm": 1015.5, "mega": 1739.6},
    (128, 64, 8192): {"flashmla": 777.0, "trtllm": 1882.7, "mega": 1877.2},
    (16, 8, 32768): {"flashmla": 198.2, "trtllm": 453.8, "mega": 3420.9},
    (64, 8, 32768): {"flashmla": 203.6, "trtllm": 931.2, "mega": 6959.7},
    (128, 8, 32768): {"flashmla": 391.0, "trtllm": 1605.0, "mega": 6904.2},
}
