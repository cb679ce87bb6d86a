"""Measured kernel times on the H200 (sm_90): what ``auto`` (the ``dispatch`` backend) picks from.

µs per call of each kernel path at ``(heads, rows, topk)``, bf16, from the kernel benchmark
(``python -m graphattn.bench.kernels --json ...``; CUDA graphs of many calls, KV from HBM; see
docs/benchmarks.md, "Kernels", whose table these numbers are: a test checks that the two agree).
Measured 2026-11-30 on one H200, torch 2.11, triton 3.6. FP8 (656-byte tokens): the same table
with ``--kv-dtype fp8`` (docs/benchmarks.md, "FP8 kernel table").
"""

from __future__ import annotations

H200_US: dict[tuple[int, int, int], dict[str, float]] = {
    (16, 1, 2048): {"flashmla": 9.0, "trtllm": 23.8, "mega": 114.5},
    (16, 8, 2048): {"flashmla": 14.4, "trtllm": 26.5, "mega": 114.5},
    (16, 64, 2048): {"flashmla": 47.9, "trtllm": 66.0, "mega": 122.1},
    (16, 512, 2048): {"flashmla": 317.2, "trtllm": 337.4, "mega": 336.9},
    (32, 1, 2048): {"flashmla": 9.5, "trtllm": 36.1, "mega": 144.0},
    (32, 8, 2048): {"flashmla": 16.0, "trtllm": 39.2, "mega": 144.5},
    (32, 64, 2048): {"flashmla": 50.7, "trtllm": 90.4, "mega": 146.9},
    (32, 512, 2048): {"flashmla": 327.5, "trtllm": 432.3, "mega": 431.8},
    (64, 1, 2048): {"flashmla": 9.9, "trtllm": 37.6, "mega": 144.0},
    (64, 8, 2048): {"flashmla": 20.1, "trtllm": 39.6, "mega": 144.7},
    (64, 64, 2048): {"flashmla": 57.7, "trtllm": 119.8, "mega": 147.6},
    (64, 512, 2048): {"flashmla": 350.0, "trtllm": 851.8, "mega": 851.6},
    (128, 1, 2048): {"flashmla": 12.2, "trtllm": 38.3, "mega": 143.8},
    (128, 8, 2048): {"flashmla": 23.1, "trtllm": 63.2, "mega": 144.3},
    (128, 64, 2048): {"flashmla": 81.7, "trtllm": 215.4, "mega": 216.6},
    (128, 512, 2048): {"flashmla": 623.3, "trtllm": 1720.4, "mega": 1699.3},
    (16, 64, 8192): {"flashmla": 156.2, "trtllm": 208.3, "mega": 459.8},
    (64, 64, 8192): {"flashmla": 168.6, "trtllm": 425.0, "mega": 568.5},
    (128, 64, 8192): {"flashmla": 285.7, "trtllm": 837.6, "mega": 836.4},
    (16, 8, 32768): {"flashmla": 84.7, "trtllm": 235.0, "mega": 1768.6},
    (64, 8, 32768): {"flashmla": 91.7, "trtllm": 298.2, "mega": 2227.7},
    (128, 8, 32768): {"flashmla": 147.3, "trtllm": 674.3, "mega": 2234.5},
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
