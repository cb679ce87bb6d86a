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
    (16, 1, 2048): {"flashmla": 12.1, "trtllm": 36.2, "mega": 213.9},
    (16, 8, 2048): {"flashmla": 20.9, "trtllm": 37.3, "mega": 212.3},
    (16, 64, 2048): {"flashmla": 118.5, "trtllm": 165.7, "mega": 216.0},
    (16, 512, 2048): {"flashmla": 886.9, "trtllm": 872.4, "mega": 871.6},
    (32, 1, 2048): {"flashmla": 21.3, "trtllm": 73.5, "mega": 430.4},
    (32, 8, 2048): {"flashmla": 36.7, "trtllm": 76.0, "mega": 436.6},
    (32, 64, 2048): {"flashmla": 236.1, "trtllm": 192.7, "mega": 443.8},
    (32, 512, 2048): {"flashmla": 979.5, "trtllm": 968.9, "mega": 968.0},
    (64, 1, 2048): {"flashmla": 35.0, "trtllm": 74.7, "mega": 430.1},
    (64, 8, 2048): {"flashmla": 43.6, "trtllm": 75.4, "mega": 433.7},
    (64, 64, 2048): {"flashmla": 261.2, "trtllm": 266.4, "mega": 435.5},
    (64, 512, 2048): {"flashmla": 1888.4, "trtllm": 1882.9, "mega": 1881.2},
    (128, 1, 2048): {"flashmla": 61.6, "trtllm": 74.8, "mega": 427.9},
    (128, 8, 2048): {"flashmla": 72.9, "trtllm": 118.9, "mega": 430.4},
    (128, 64, 2048): {"flashmla": 474.1, "trtllm": 474.4, "mega": 473.6},
    (128, 512, 2048): {"flashmla": 3677.6, "trtllm": 3673.8, "mega": 3668.3},
    (16, 64, 8192): {"flashmla": 441.6, "trtllm": 605.6, "mega": 844.8},
    (64, 64, 8192): {"flashmla": 986.8, "trtllm": 1005.2, "mega": 1719.0},
    (128, 64, 8192): {"flashmla": 1865.0, "trtllm": 1868.2, "mega": 1866.1},
    (16, 8, 32768): {"flashmla": 227.1, "trtllm": 449.5, "mega": 3328.3},
    (64, 8, 32768): {"flashmla": 501.3, "trtllm": 918.1, "mega": 6882.6},
    (128, 8, 32768): {"flashmla": 972.3, "trtllm": 1587.9, "mega": 6824.2},
}
