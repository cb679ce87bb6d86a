"""Kernel benchmark: every sparse MLA path and the torch reference, timed inside CUDA graphs.

``python -m graphattn.bench.kernels [--json out.json] [--quick] [--sweep] [--kv-dtype fp8]
[--pool-tokens TOKENS ... [--rows-per-pool N] [--shape HxRxT]]``

Each timed step replays one CUDA graph holding ``reps`` calls that cycle through several input
copies (each copy its own q, indices and KV region, and each query row its own tokens), so the
KV comes from HBM, not L2. Reports time per call, achieved GB/s and TFLOP/s and the fraction of
the H200 roofline: ``max(bytes / 4.2 TB/s, flops / 790 TFLOP/s)`` with
``bytes = rows*topk*576*2 + q + out`` and ``flops = 2*rows*heads*topk*(576+512)`` (real heads:
the masked heads of a partly filled head block, e.g. 16 heads in flashmla's 64-head blocks,
are not counted). With ``--kv-dtype fp8`` the KV is 656-byte
FP8 tokens (``graphattn.common.kv_layout``) and counted at 656 bytes per token instead of 1152.

``--pool-tokens TOKENS ...`` measures flashmla under the conditions of FlashMLA's published
sparse benchmarks instead: every row's top-k drawn at random from a pool of ``TOKENS`` tokens
(one pool for all rows, or one per ``--rows-per-pool`` rows), the same inputs every call. Its
prefill case (the default ``--shape 128x4096x2048``, one pool of 8192-131072 tokens) keeps the
KV L2-resident (9.4 MB at 8192 tokens) or partly so; its decode case (``--shape 128x256x2048
--pool-tokens 32768 --rows-per-pool 2``: 128 sequences of 32768 tokens, 2 query rows each) is
mostly cold. Those numbers compare with FlashMLA's; the bars use the table's cold-KV method.
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
POOL_SHAPE = "128x4096x2048"  # FlashMLA's V3.2 sparse prefill case: h_q 128, s_q 4096, topk 2048
# (heads, rows, topk, kv_fp8) of issues 12 and 14's speed bars (docs/benchmarks.md, "Where issues
# 12 and 14 stand"), flashmla only: 1 and 8 rows at 16-128 heads, 64 heads x 64 rows, 128 heads
# from 64 rows (topk 2048 and 8192), 16-32 heads x 512 rows; with FP8 tokens 16 heads x 1, 8 and
# 512 rows and 128 heads from 64 rows.
BAR_SHAPES = ([(h, r, 2048, False) for r in (1, 8) for h in (16, 32, 64, 128)]
              + [(64, 64, 2048, False), (128, 64, 2048, False), (128, 512, 2048, False), (128, 64, 8192, False),
                 (16, 512, 2048, False), (32, 512, 2048, False)]
              + [(16, 1, 2048, True), (16, 8, 2048, True), (16, 512, 2048, True), (128, 64, 2048, True),
                 (128, 512, 2048, True), (128, 64, 8192, True)])


def roofline(rows: int, heads: int, topk: int, kv_fp8: bool = False) -> tuple[float, float, float]:
    """``(bytes, flops, seconds)`` of the roofline floor for one call (``kv_fp8``: KV read as
    656-byte tokens)."""
    nbytes = attention_bytes(rows, heads, topk, kv_token_bytes=TOKEN_BYTES if kv_fp8 else None)
    flops = attention_flops(rows, heads, topk)
    return nbytes, flops, max(nbytes / H200_BYTES_PER_S, flops / H200_FLOP_PER_S)


def cold_copies(rows: int, topk: int, kv_fp8: bool = False) -> int:
    """Input copies a graph cycles so that their KV (``rows * topk`` tokens each, 656 or 1152
    bytes) adds up to at least ``COLD_BYTES``: 2 to 64."""
    token_bytes = TOKEN_BYTES if kv_fp8 else 1152
    return max(2, min(64, math.ceil(COLD_BYTES / (rows * topk * token_bytes))))


def make_copies(rows: int, heads: int, topk: int, copies: int, device="cuda", kv_fp8: bool = False,
                pool_tokens: int | None = None, rows_per_pool: int | None = None) -> list[dict]:
    """``copies`` input sets; row ``r`` of copy ``c`` reads its own shuffled token block
    (``kv_fp8``: the KV is ``[tokens, 656]`` uint8 FP8 tokens). ``pool_tokens``: instead, pools
    of that many tokens shared by every copy, one per ``rows_per_pool`` rows (default: one for
    all rows), each row reading ``topk`` distinct tokens of its pool at random."""
    if pool_tokens is not None and pool_tokens < topk:
        raise ValueError(f"a pool of {pool_tokens} tokens cannot give a row {topk} distinct tokens: "
                         "pass at least topk")
    if rows_per_pool is not None and (pool_tokens is None or rows_per_pool < 1):
        raise ValueError(f"rows_per_pool={rows_per_pool} needs pool_tokens and at least 1 row a pool")
    per_pool = rows_per_pool or rows
    tokens = -(-rows // per_pool) * pool_tokens if pool_tokens else copies * rows * topk
    kv = torch.randn(tokens, 576, device=device, dtype=torch.bfloat16)
    if kv_fp8:
        kv = quantize_kv(kv)
    sets = []
    for c in range(copies):
        if pool_tokens:
            pick = torch.cat([torch.rand(min(256, rows - r0), pool_tokens, device=device).topk(topk, dim=1).indices
                              for r0 in range(0, rows, 256)])
            first = (torch.arange(rows, device=device) // per_pool * pool_tokens)[:, None]
            idx = (first + pick).to(torch.int32)
        else:
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


def capture_calls(fn: Callable[[dict], Any], sets: list[dict], reps: int) -> torch.cuda.CUDAGraph:
    """``reps`` calls of ``fn`` (cycling ``sets``) captured in one CUDA graph, after two warm-up
    calls outside the capture (compiles), replayed once."""
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
    return graph


def time_graph(fn: Callable[[dict], Any], sets: list[dict], reps: int, replays: int = 3, best: bool = False) -> float:
    """Seconds per call: ``reps`` calls (cycling ``sets``) captured in one graph, replayed
    ``replays`` times (the mean; ``best``: the fastest replay's)."""
    graph = capture_calls(fn, sets, reps)
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


def measure(heads: int, rows: int, topk: int, paths=PATHS, kv_fp8: bool = False,
            pool_tokens: int | None = None, rows_per_pool: int | None = None) -> list[dict[str, Any]]:
    """One result row per path at one shape (``kv_fp8``: 656-byte FP8 KV tokens; ``pool_tokens``,
    ``rows_per_pool``: the rows' top-k drawn from shared pools, two input sets, see
    ``make_copies``)."""
    nbytes, flops, floor = roofline(rows, heads, topk, kv_fp8)
    copies = 2 if pool_tokens else cold_copies(rows, topk, kv_fp8)
    sets = make_copies(rows, heads, topk, copies, kv_fp8=kv_fp8, pool_tokens=pool_tokens,
                       rows_per_pool=rows_per_pool)
    reps = max(copies, min(200, math.ceil(2e-3 / max(floor, 1e-6))))
    results = []
    for path in paths:
        if path == "torch" and rows * topk * heads > 64 * 8192 * 128:
            continue  # the gathered scores would not fit comfortably
        t = time_graph(path_fn(path, rows, heads, topk), sets, reps)
        results.append({
            "heads": heads, "rows": rows, "topk": topk, "path": path, "kv": "fp8" if kv_fp8 else "bf16",
            "pool_tokens": pool_tokens, "rows_per_pool": rows_per_pool, "us": t * 1e6,
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


def bars_markdown(results: list[dict[str, Any]]) -> str:
    """Markdown table of :data:`BAR_SHAPES`' results (one path each), KV layout first."""
    lines = ["| kv | heads | rows | topk | path | µs/call | GB/s | TFLOP/s | roofline |",
             "|---|---:|---:|---:|---|---:|---:|---:|---:|"]
    lines += [f"| {r['kv']} | {r['heads']} | {r['rows']} | {r['topk']} | {r['path']} | {r['us']:.2f} | "
              f"{r['GBps']:.0f} | {r['TFLOPs']:.1f} | {r['roofline']:.2f} |" for r in results]
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
    parser.add_argument("--bars", action="store_true",
                        help="flashmla at the shapes of issues 12 and 14's speed bars (bf16 and FP8 tokens "
                             "both, whatever --kv-dtype says)")
    parser.add_argument("--kv-dtype", choices=("bf16", "fp8"), default="bf16",
                        help="KV cache: bf16 [pool, 576] or 656-byte FP8 tokens (bytes counted at 656)")
    parser.add_argument("--pool-tokens", type=int, nargs="+", metavar="TOKENS",
                        help="FlashMLA's benchmark conditions instead of the table: every row's top-k from a "
                             "pool of TOKENS tokens (each size given), flashmla only")
    parser.add_argument("--rows-per-pool", type=int, metavar="N",
                        help="with --pool-tokens: one pool per N rows (default: one pool for all rows)")
    parser.add_argument("--shape", default=POOL_SHAPE, metavar="HxRxT",
                        help=f"with --pool-tokens: heads x rows x topk (default {POOL_SHAPE})")
    args = parser.parse_args(argv)
    if args.rows_per_pool is not None and not args.pool_tokens:
        parser.error("--rows-per-pool needs --pool-tokens")
    if sum(map(bool, (args.bars, args.sweep, args.pool_tokens, args.quick))) > 1:
        parser.error("--bars, --sweep, --pool-tokens and --quick each choose the shapes: give one")
    try:
        heads, rows, topk = (int(x) for x in args.shape.lower().split("x"))
    except ValueError:
        parser.error(f"--shape {args.shape!r}: expected HEADSxROWSxTOPK, e.g. {POOL_SHAPE}")
    if args.pool_tokens and min(args.pool_tokens) < topk:
        parser.error(f"--pool-tokens {min(args.pool_tokens)}: a pool needs at least topk ({topk}) tokens")
    if not torch.cuda.is_available():
        print("graphattn.bench.kernels needs a CUDA/HIP GPU", file=sys.stderr)
        return 2
    if args.pool_tokens:
        fp8 = args.kv_dtype == "fp8"
        results = [r for tokens in args.pool_tokens
                   for r in measure(heads, rows, topk, paths=("flashmla",), kv_fp8=fp8, pool_tokens=tokens,
                                    rows_per_pool=args.rows_per_pool)]
        for r in results:
            pools = f"one pool per {r['rows_per_pool']} rows" if r["rows_per_pool"] else "one pool"
            print(f"{r['kv']} kv, {r['heads']} heads x {r['rows']} rows x topk {r['topk']}, {pools} of "
                  f"{r['pool_tokens']} tokens: {r['us']:.1f} us, {r['TFLOPs']:.1f} TFLOP/s, {r['GBps']:.0f} GB/s")
    elif args.bars:
        results = [r for h, rows_, t, fp8 in BAR_SHAPES for r in measure(h, rows_, t, paths=("flashmla",), kv_fp8=fp8)]
        print(bars_markdown(results))
    elif args.sweep:
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
