"""A/B of flashmla's Gluon kernels on sm_90 at the kernel table's method (one process, the same
inputs): the warp-specialised kernel (what runs) against its 8-warp predecessor.

    PYTHONPATH=. python3 scripts/ab_flashmla_kernels.py [--json out.json]

Prints one line per shape: µs per call, TFLOP/s, roofline fraction and split count of each.
"""
from __future__ import annotations

import argparse
import json

from graphattn.bench.kernels import measure
from graphattn.cuda import configs
from graphattn.kernels.flashmla import plan_flashmla
from graphattn.kernels.launch import clear_launch_plans

VARIANTS = {
    "wgmma": {"kernel": "wgmma", "BLOCK_H": 64, "BLOCK_N": 64, "STAGES": 2, "num_warps": 8, "num_stages": 1},
    "wgmma_ws": dict(configs._WGMMA_TILE),
}
SHAPES = [(128, 512, 2048), (128, 64, 2048), (128, 64, 8192), (64, 64, 2048), (64, 512, 2048), (32, 512, 2048),
          (16, 512, 2048), (128, 8, 2048), (64, 8, 2048), (16, 8, 2048), (128, 1, 2048), (128, 2, 2048)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write every measurement here")
    args = parser.parse_args()
    default, results = dict(configs._WGMMA_TILE), []
    try:
        for heads, rows, topk in SHAPES:
            line = f"{heads} x {rows} x {topk}:"
            for name, tile in VARIANTS.items():
                configs._WGMMA_TILE = tile  # kernel_config copies it per call
                clear_launch_plans()
                x = measure(heads, rows, topk, paths=("flashmla",))[0]
                splits = plan_flashmla(rows, heads, topk, 64).splits
                results.append({**x, "variant": name, "splits": splits})
                line += f"  {name} {x['us']:.1f} us ({x['TFLOPs']:.0f} TFLOP/s, {x['roofline']:.2f}, {splits} splits)"
            print(line, flush=True)
    finally:
        configs._WGMMA_TILE = default
        clear_launch_plans()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
