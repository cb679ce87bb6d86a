"""Kernel benchmark: every sparse MLA path and the torch reference, timed inside CUDA graphs.

``python -m graphattn.bench.kernels [--json out.json] [--quick] [--sweep] [--kv-dtype fp8]``

Each timed step replays one CUDA graph holding ``reps`` calls that cycle through several input
copies (each copy its own q, indices and KV region, and each query row its own tokens), so the
KV comes from HBM, not L2. Reports time per call, achieved GB/s and TFLOP/s and the fraction of
the H200 roofline: ``max(bytes / 4.2 TB/s, flops / 790 TFLOP/s)`` with
``bytes = rows*topk*576*2 + q + out`` and ``flops = 2*rows*heads*topk*(576+512)`` (real heads:
the masked heads of a partly filled head block, e.g. 16 heads in flashmla's 64-head blocks,
are not counted). With ``--kv-dtype fp8`` the KV is 656-byte
FP8 tokens (``graphattn.common.kv_layout``) and counted at 656 bytes per token instead of 1152.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any, Callable

import torch

from ..common.kv_layout import TOKEN_BYTES, dequantize_kv, quantize_kv
from .workload import H200_BYTES_PER_S, H200_FLOP_PER_S, attention_bytes, attention_flops

COLD_BYTES = 256 << 20  # input copies per graph: at least this much KV (L2 is 50 MB)
SHAPES = [(h, r, 2048) for h in (16, 32, 64, 128) for r in (1, 8, 64, 512)]
SHAPES += [(h, 64, 8192) for h in (16, 64, 128)] + [(h, 8, 32768) for h in (16, 64, 128)]
QUICK_SHAPES = [(16, 1, 2048), (64, 8, 2048), (64, 64, 2048), (128, 512, 2048)]
PATHS = ("flashmla", "trtllm", "mega", "torch")


def roofline(rows: int, heads: int, topk: int, kv_fp8: bool = False) -> tuple[float, float, float]:
    """``(bytes, flops, seconds)`` of the roofline floor for one call (``kv_fp8``: KV read as
    656-byte tokens)."""
    nbytes = attention_bytes(rows, heads, topk, kv_token_bytes=TOKEN_BYTES if kv_fp8 else None)
    flops = attention_flops(rows, heads, topk)
    return nbytes, flops, max(nbytes / H200_BYTES_PER_S, flops / H200_FLOP_PER_S)


def make_copies(rows: int, heads: int, topk: int, copies: int, device="cuda", kv_fp8: bool = False) -> list[dict]:
    """``copies`` input sets; row ``r`` of copy ``c`` reads its own shuffled token block
    (``kv_fp8``: the pool is ``[pool, 656]`` uint8 FP8 tokens)."""
    pool = copies * rows * topk
    kv = torch.randn(pool, 576, device=device, dtype=torch.bfloat16)
    if kv_fp8:
        kv = quantize_kv(kv)
    sets = []
    for c in range(copies):
        base = (c * rows + torch.arange(rows, device=device)[:, None]) * topk
        perm = torch.argsort(torch.rand(rows, topk, device=device), dim=1)
        idx = (base + perm).to(torch.int32)
        q = torch.randn(rows, heads, 576, device=device, dtype=torch.bfloat16)
        sets.append({"q": q, "kv": kv, "idx": idx})
    return sets


def torch_reference(q, kv, idx, sm_scale):
    """Gather (+ dequantise FP8 tokens) + bf16 matmul + fp32 softmax + bf16 matmul (the
    plain-PyTorch baseline)."""
    k = kv[idx.clamp_min(0).long()]  # [rows, topk, 576], or [rows, topk, 656] uint8
    if k.dtype == torch.uint8:
        k = dequantize_kv(k, dtype=q.dtype)
    s = torch.einsum("rhd,rtd->rht", q, k).float() * sm_scale
    s = s.masked_fill((idx < 0)[:, None, :], float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse[..., None]).to(q.dtype)
    return torch.einsum("rht,rtv->rhv", p, k[..., :512]), lse


def path_fn(path: str, rows: int, heads: int, topk: int) -> Callable[[dict], Any]:
    """A closure running ``path`` on one input set, with its workspace allocated up front."""
    from graphattn.common.metadata import GraphMetadata
    from graphattn.kernels import split_plan, sparse_mla_flashmla, sparse_mla_mega, sparse_mla_trtllm

    scale = 1 / math.sqrt(576)
    if path == "torch":
        return lambda s: torch_reference(s["q"], s["kv"], s["idx"], scale)
    if path == "mega":
        return lambda s: sparse_mla_mega(s["q"], s["kv"], s["idx"], scale)
    plan = split_plan(path, heads, topk)
    md = GraphMetadata(rows, heads, topk, torch.bfloat16, "cuda", **plan.metadata_kwargs())
    ws = md.workspace_for(rows)
    if path == "flashmla":
        return lambda s: sparse_mla_flashmla(s["q"], s["kv"], s["idx"], scale, *ws)
    counter = md.counter_for(rows)
    return lambda s: sparse_mla_trtllm(s["q"], s["kv"], s["idx"], scale, counter, *ws)


def time_graph(fn: Callable[[dict], Any], sets: list[dict], reps: int, replays: int = 3, best: bool = False) -> float:
    """Seconds per call: ``reps`` calls (cycling ``sets``) captured in one graph, replayed
    ``replays`` times (the mean; ``best``: the fastest replay's)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for s in sets[:2]:
            fn(s)  # compile and warm up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(reps):
            fn(sets[i % len(sets)])
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    if best:
        times = []
        for _ in range(replays):
            start.record()
            graph.replay()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        return min(times) / 1e3 / reps
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / (replays * reps)


def measure(heads: int, rows: int, topk: int, paths=PATHS, kv_fp8: bool = False) -> list[dict[str, Any]]:
    """One result row per path at one shape (``kv_fp8``: 656-byte FP8 KV tokens)."""
    nbytes, flops, floor = roofline(rows, heads, topk, kv_fp8)
    token_bytes = TOKEN_BYTES if kv_fp8 else 1152
    copies = max(2, min(64, math.ceil(COLD_BYTES / (rows * topk * token_bytes))))
    sets = make_copies(rows, heads, topk, copies, kv_fp8=kv_fp8)
    reps = max(copies, min(200, math.ceil(2e-3 / max(floor, 1e-6))))
    results = []
    for path in paths:
        if path == "torch" and rows * topk * heads > 64 * 8192 * 128:
            continue  # the gathered scores would not fit comfortably
        t = time_graph(path_fn(path, rows, heads, topk), sets, reps)
        results.append({
            "heads": heads, "rows": rows, "topk": topk, "path": path, "kv": "fp8" if kv_fp8 else "bf16",
            "us": t * 1e6,
            "GBps": nbytes / t / 1e9, "TFLOPs": flops / t / 1e12, "roofline": floor / t,
        })
    del sets
    torch.cuda.empty_cache()
    return results


def markdown(results: list[dict[str, Any]]) -> str:
    """Markdown table; the best kernel path of each shape is in bold."""
    lines = ["| heads | rows | topk | path | µs/call | GB/s | TFLOP/s | roofline |",
             "|---:|---:|---:|---|---:|---:|---:|---:|"]
    best = {}
    for r in results:
        key = (r["heads"], r["rows"], r["topk"])
        if r["path"] != "torch" and (key not in best or r["us"] < best[key]["us"]):
            best[key] = r
    for r in results:
        mark = "**" if best.get((r["heads"], r["rows"], r["topk"])) is r else ""
        lines.append(f"| {r['heads']} | {r['rows']} | {r['topk']} | {mark}{r['path']}{mark} | "
                     f"{r['us']:.1f} | {r['GBps']:.0f} | {r['TFLOPs']:.1f} | {r['roofline']:.2f} |")
    return "\n".join(lines)


def sweep(shapes, candidates: list[dict[str, Any]], paths=("mega", "trtllm")) -> list[dict[str, Any]]:
    """Time every candidate tile setting (the launch table's ``override``) per path and shape."""
    from graphattn.common.platform import current_platform
    from graphattn.kernels.launch import clear_launch_plans

    table = current_platform().launch_table
    results = []
    for heads, rows, topk in shapes:
        for path in paths:
            for cand in candidates:
                with table.override(path, **cand):
                    clear_launch_plans()  # plans memoised under other settings
                    try:
                        r = measure(heads, rows, topk, paths=(path,))[0]
                    except Exception as exc:  # a candidate that does not compile is reported
                        print(f"sweep {path} {cand} failed: {type(exc).__name__}: {str(exc)[:200]}")
                        continue
                r["config"] = cand
                results.append(r)
                print(f"sweep h={heads} r={rows} t={topk} {path} {cand}: {r['us']:.1f} us "
                      f"roofline {r['roofline']:.2f}", flush=True)
    return results


def compile_report() -> list[str]:
    """Registers, spills and shared memory of every kernel variant compiled in this process."""
    from graphattn.kernels import flashmla, mega, trtllm

    fns = [flashmla._flashmla_split_kernel, flashmla._flashmla_combine_kernel, trtllm._trtllm_kernel, mega._mega_kernel]
    for module, fn in flashmla.GLUON_KERNELS.values():  # imported once flashmla has run them
        if f"graphattn.kernels.{module}" in sys.modules:
            fns.append(getattr(sys.modules[f"graphattn.kernels.{module}"], fn))
    lines = []
    for fn in fns:
        for cache in getattr(fn, "device_caches", {}).values():
            for compiled in cache[0].values():
                md = compiled.metadata
                consts = {k: v for k, v in getattr(md, "constants", {}).items()} if hasattr(md, "constants") else ""
                lines.append(f"{fn.__name__}: warps={md.num_warps} stages={md.num_stages} "
                             f"regs={compiled.n_regs} spills={compiled.n_spills} smem={md.shared} {consts}")
    return lines


SWEEP_CANDIDATES = [
    {"BLOCK_H": bh, "BLOCK_N": bn, "num_warps": w, "num_stages": st}
    for bh, bn, w, st in [(16, 64, 4, 2), (16, 32, 4, 3), (32, 32, 4, 2), (32, 32, 8, 2), (32, 64, 8, 2),
                          (64, 32, 8, 2), (64, 16, 8, 3), (16, 64, 4, 3)]
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="graphattn kernel benchmark (CUDA graphs)")
    parser.add_argument("--json", help="write results to this JSON file")
    parser.add_argument("--quick", action="store_true", help="four representative shapes only")
    parser.add_argument("--sweep", action="store_true", help="time tile candidates on a few shapes")
    parser.add_argument("--kv-dtype", choices=("bf16", "fp8"), default="bf16",
                        help="KV cache: bf16 [pool, 576] or 656-byte FP8 tokens (bytes counted at 656)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("graphattn.bench.kernels needs a CUDA/HIP GPU", file=sys.stderr)
        return 2
    if args.sweep:
        results = sweep([(16, 512, 2048), (64, 512, 2048), (128, 512, 2048), (64, 8, 2048)], SWEEP_CANDIDATES)
    else:
        fp8 = args.kv_dtype == "fp8"
        results = [r for shape in (QUICK_SHAPES if args.quick else SHAPES) for r in measure(*shape, kv_fp8=fp8)]
        print(markdown(results))
    print("\n".join(compile_report()), file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
