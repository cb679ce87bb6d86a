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
    (16, 1, 2048): {"flashmla": 10.4, "trtllm": 37.1, "mega": 243.1},
    (16, 8, 2048): {"flashmla": 17.6, "trtllm": 39.1, "mega": 247.8},
    (16, 64, 2048): {"flashmla": 67.1, "trtllm": 169.6, "mega": 250.0},
    (16, 512, 2048): {"flashmla": 442.0, "trtllm": 951.8, "mega": 980.1},
    (32, 1, 2048): {"flashmla": 11.4, "trtllm": 54.6, "mega": 309.1},
    (32, 8, 2048): {"flashmla": 19.4, "trtllm": 57.9, "mega": 300.2},
    (32, 64, 2048): {"flashmla": 68.7, "trtllm": 171.3, "mega": 304.5},
    (32, 512, 2048): {"flashmla": 445.6, "trtllm": 913.5, "mega": 913.5},
    (64, 1, 2048): {"flashmla": 12.8, "trtllm": 56.0, "mega": 306.0},
    (64, 8, 2048): {"flashmla": 23.0, "trtllm": 58.3, "mega": 307.6},
    (64, 64, 2048): {"flashmla": 73.6, "trtllm": 237.1, "mega": 303.9},
    (64, 512, 2048): {"flashmla": 457.5, "trtllm": 1782.2, "mega": 1784.6},
    (128, 1, 2048): {"flashmla": 13.6, "trtllm": 56.8, "mega": 303.4},
    (128, 8, 2048): {"flashmla": 29.4, "trtllm": 108.5, "mega": 302.4},
    (128, 64, 2048): {"flashmla": 119.0, "trtllm": 450.7, "mega": 448.3},
    (128, 512, 2048): {"flashmla": 883.0, "trtllm": 3459.9, "mega": 3483.0},
    (16, 64, 8192): {"flashmla": 228.7, "trtllm": 625.1, "mega": 980.0},
    (64, 64, 8192): {"flashmla": 237.4, "trtllm": 889.7, "mega": 1183.4},
    (128, 64, 8192): {"flashmla": 442.6, "trtllm": 1754.2, "mega": 1754.1},
    (16, 8, 32768): {"flashmla": 121.9, "trtllm": 471.3, "mega": 3864.0},
    (64, 8, 32768): {"flashmla": 126.7, "trtllm": 608.3, "mega": 4877.1},
    (128, 8, 32768): {"flashmla": 230.1, "trtllm": 1410.7, "mega": 4753.0},
}
