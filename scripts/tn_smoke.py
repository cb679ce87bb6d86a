"""flashmla's heads-on-N Gluon kernel (wgmma_tn, <= 32 heads, sm_90) on a GPU: correctness against
the float64 reference (bf16/fp16 kv and FP8 tokens; ``check``), then timing against what the
launch table ran before it (``TN_MAX_HEADS = 0``; ``time``: one CUDA graph of 20 calls on the same
inputs, the fastest of 5 replays, so part of the KV may come from L2; the timer is the kernel
table's ``time_graph``, whose warm-up runs on a side stream where the script's own copy of it,
which measured the numbers in docs/benchmarks.md, made 3 calls first; the kernel table's method is
``python -m graphattn.bench.kernels``). Run from the repository root:
``PYTHONPATH=. python scripts/tn_smoke.py [check|time|all]``."""
import math, sys, torch
sys.path.insert(0, "tests")
from test_kernels import make_inputs  # noqa: E402
from graphattn.bench.kernels import time_graph  # noqa: E402
from graphattn.common import kv_layout  # noqa: E402
from graphattn.common.metadata import GraphMetadata  # noqa: E402
from graphattn.common.reference import sparse_mla_reference  # noqa: E402
from graphattn.common.tolerances import tolerance  # noqa: E402
from graphattn.cuda import configs  # noqa: E402
from graphattn.kernels.flashmla import kernel_name, sparse_mla_flashmla  # noqa: E402
from graphattn.kernels.launch import clear_launch_plans  # noqa: E402
from graphattn.kernels.plan import split_plan  # noqa: E402

FMT = torch.float8_e4m3fn
SCALE = 1 / math.sqrt(576)


def fp8_inputs(rows, heads, topk, pool, dtype, amp=4.0):
    """q, 656-byte FP8 tokens and indices (make_inputs' mix); unselected tokens' bytes are 0xFF
    (NaN scale and rope), so a kernel that reads one returns NaN."""
    q, kv, idx = make_inputs(rows, heads, topk, pool, dtype)
    kv8 = kv_layout.quantize_kv(kv.float() * amp, FMT)
    sel = torch.zeros(pool, dtype=torch.bool, device=kv8.device)
    ok = (idx >= 0) & (idx < pool)
    sel[idx[ok].long()] = True
    kv8[~sel] = 0xFF
    return q, kv8, idx


def deq_qdtype(kv8, dtype):
    """The cache dequantised into q's dtype, computed here (not with the library's dequantiser)."""
    nope = kv8[:, :512].contiguous().view(FMT).float()
    sc = kv8[:, 512:528].contiguous().view(torch.float32).repeat_interleave(128, dim=1)
    rope = kv8[:, 528:656].contiguous().view(torch.bfloat16).to(dtype)
    return torch.cat([(nope * sc).to(dtype), rope], dim=1)


def workspace(rows, heads, topk, dtype, fp8=True):
    plan = split_plan("flashmla", heads, topk, kv_fp8=fp8)
    md = GraphMetadata(rows, heads, topk, dtype, torch.device("cuda"), **plan.metadata_kwargs())
    ws_out, ws_lse = md.workspace_for(rows)
    return md, ws_out, ws_lse


def check(heads, rows, topk, dtype, fp8, all_invalid=False):
    pool = min(rows * topk + 4096, 400000)
    if fp8:
        q, kv, idx = fp8_inputs(rows, heads, topk, pool, dtype)
        kv_ref = deq_qdtype(kv, dtype)
    else:
        q, kv, idx = make_inputs(rows, heads, topk, pool, dtype)
        kv_ref = kv
    if all_invalid:
        idx[rows - 1] = -1
    md, ws_out, ws_lse = workspace(rows, heads, topk, dtype, fp8)
    ws_out.fill_(float("nan")); ws_lse.fill_(float("nan"))
    out, lse = sparse_mla_flashmla(q, kv, idx, SCALE, ws_out, ws_lse)
    torch.cuda.synchronize()
    name = kernel_name(q, kv, topk)
    ref_out, ref_lse = sparse_mla_reference(q, kv_ref, idx, SCALE)
    tol = tolerance(dtype)
    eo = (out.double() - ref_out).abs()
    r_o = float((eo / (tol.atol + tol.rtol * ref_out.abs())).nan_to_num(nan=1e9).max())
    fin = torch.isfinite(ref_lse)
    el = (lse.double() - ref_lse).abs()
    r_l = float((el[fin] / (tol.lse_atol + tol.lse_rtol * ref_lse.abs())[fin]).max()) if fin.any() else 0.0
    bad_inf = bool(((lse == float("-inf")) != (ref_lse == float("-inf"))).any())
    ok = r_o <= 1 and r_l <= 1 and not bad_inf and not torch.isnan(out).any()
    print(f"{heads}x{rows}x{topk} {str(dtype)[6:]} {'fp8' if fp8 else 'kv'} {name}: {'ok' if ok else 'FAIL'} "
          f"out/tol {r_o:.3f} lse/tol {r_l:.3f}{' -inf mismatch' if bad_inf else ''}", flush=True)
    return ok


def time_us(heads, rows, topk, fp8, reps=20):
    dtype = torch.bfloat16
    pool = min(rows * topk + 4096, 1 << 20)
    q, kv, idx = make_inputs(rows, heads, topk, pool, dtype, invalid_frac=0.0)
    if fp8:
        kv = kv_layout.quantize_kv(kv.float(), FMT)
    idx = torch.stack([torch.randperm(pool, device="cuda")[:topk] for _ in range(rows)]).int()
    md, ws_out, ws_lse = workspace(rows, heads, topk, dtype, fp8)
    fn = lambda _: sparse_mla_flashmla(q, kv, idx, SCALE, ws_out, ws_lse)  # noqa: E731
    best = time_graph(fn, [None], reps, replays=5, best=True)  # the kernel table's graph timer
    return best * 1e6, kernel_name(q, kv, topk)


def roof_us(heads, rows, topk, fp8):
    from graphattn.bench.kernels import roofline
    return roofline(rows, heads, topk, fp8)[2] * 1e6


def main(mode):
    if mode in ("all", "check"):
        torch.manual_seed(0)
        shapes = [(16, 4, 2048), (32, 3, 2048), (1, 2, 70), (7, 5, 300), (17, 9, 2048), (20, 5, 8229),
                  (32, 64, 2048), (16, 1, 64), (24, 2, 100), (31, 8, 4096), (16, 33, 2048), (8, 1, 1)]
        fails = 0
        for heads, rows, topk in shapes:
            for dtype in (torch.bfloat16, torch.float16):
                for fp8 in (False, True):
                    fails += not check(heads, rows, topk, dtype, fp8, all_invalid=rows > 2)
        print(f"CHECK fails={fails}", flush=True)
    if mode in ("all", "time"):
        for heads, rows, topk in [(16, 512, 2048), (32, 512, 2048), (16, 64, 2048), (32, 64, 2048), (16, 8, 2048),
                                  (32, 8, 2048), (16, 1, 2048), (32, 1, 2048), (16, 4, 2048), (16, 8, 32768)]:
            for fp8 in (False, True):
                new, n_new = time_us(heads, rows, topk, fp8)
                old_max = configs.TN_MAX_HEADS
                configs.TN_MAX_HEADS = 0
                clear_launch_plans()
                old, n_old = time_us(heads, rows, topk, fp8)
                configs.TN_MAX_HEADS = old_max
                clear_launch_plans()
                r = roof_us(heads, rows, topk, fp8)
                print(f"TIME {heads}x{rows}x{topk} {'fp8' if fp8 else 'bf16'}: new {new:.1f} ({n_new}, {r / new:.2f} roof) "
                      f"| before {old:.1f} ({n_old}, {r / old:.2f} roof)", flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "all")
