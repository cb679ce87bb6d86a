"""Time flashmla's combines alone (a CUDA graph of 50 launches each, L2-warm workspace): the
head-major Triton combine, the Gluon combine of partials in the accumulator's order
(``graphattn.kernels.wgmma_combine._flashmla_combine_native_kernel``), and two Triton versions of the
latter kept here for the record (82124c6's ``[BLOCK_S, 512]`` tile, whose weights change layout
through shared memory, 13 barriers; a loop over the splits). The Triton versions' outputs are
checked against the Gluon one's (docs/benchmarks.md, "split partials in the accumulator's order, landed").
``PYTHONPATH=. python scripts/combine_time.py`` on an H200."""
import torch
import triton
import triton.language as tl

from graphattn.bench.kernels import time_graph
from graphattn.kernels.flashmla import _flashmla_combine_kernel
from graphattn.kernels.wgmma_combine import _flashmla_combine_native_kernel


@triton.jit
def native_tl(
    ws_out_ptr, ws_lse_ptr, out_ptr, lse_ptr, H, num_splits,
    stride_wr, stride_ws, stride_wh, stride_lr, stride_ls,
    BLOCK_S: tl.constexpr, D_NOPE: tl.constexpr,
):
    # The combine of partials a Gluon kernel stored in its accumulator's order (PARTIAL_NATIVE:
    # graphattn.kernels.wgmma_ws._store_partial; H a multiple of 64). A head block's partial is
    # 64 contiguous runs of 512 floats: run g holds columns [8 g, 8 g + 8) of all 64 heads, as
    # [64 k, 8 c], row k being head m(k) = 16 (k // 8 % 4) + 8 (k // 32) + k % 8. One program per
    # (row, head block, run), its [BLOCK_S, 512] tile loaded as the head-major combine loads its
    # own (each split's 2 KB contiguous), the heads' weights [BLOCK_S, 64] broadcast over their 8
    # columns.
    RUNS: tl.constexpr = D_NOPE // 8
    pid = tl.program_id(0)
    g = pid % RUNS
    hb = (pid // RUNS) % (H // 64)
    row = (pid // (RUNS * (H // 64))).to(tl.int64)
    s_offs = tl.arange(0, BLOCK_S)
    s_mask = s_offs < num_splits
    # The partials' load first: issued after the lse's reductions (their barriers), its latency
    # would follow theirs instead of overlapping them.
    j = tl.arange(0, 512)
    o_s = tl.load(ws_out_ptr + row * stride_wr + hb * 64 * stride_wh + g * 512 + s_offs[:, None] * stride_ws
                  + j[None, :], mask=s_mask[:, None], other=0.0)
    k = tl.arange(0, 64)
    h = hb * 64 + (k // 8 % 4) * 16 + (k // 32) * 8 + k % 8
    lse_s = tl.load(ws_lse_ptr + row * stride_lr + s_offs[:, None] * stride_ls + h[None, :], mask=s_mask[:, None],
                    other=float("-inf"))
    m = tl.max(lse_s, 0)
    m_ref = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp(lse_s - m_ref[None, :])  # 0 for empty and unused splits
    w_sum = tl.sum(w, 0)
    w8 = tl.reshape(tl.broadcast_to(w[:, :, None], [BLOCK_S, 64, 8]), [BLOCK_S, 512])
    sum8 = tl.reshape(tl.broadcast_to(w_sum[:, None], [64, 8]), [512])
    out = tl.sum(w8 * o_s, 0) / tl.where(sum8 == 0.0, 1.0, sum8)
    h8 = tl.reshape(tl.broadcast_to(h[:, None], [64, 8]), [512])
    tl.store(out_ptr + (row * H + h8) * D_NOPE + g * 8 + j % 8, out.to(out_ptr.dtype.element_ty))
    if g == 0:
        lse = tl.where(w_sum == 0.0, float("-inf"), m_ref + tl.log(tl.where(w_sum == 0.0, 1.0, w_sum)))
        tl.store(lse_ptr + row * H + h, lse)


@triton.jit
def native_loop(ws_out_ptr, ws_lse_ptr, out_ptr, lse_ptr, H, num_splits, stride_wr, stride_ws, stride_wh, stride_lr,
                stride_ls, BLOCK_S: tl.constexpr, D_NOPE: tl.constexpr):
    RUNS: tl.constexpr = D_NOPE // 8
    pid = tl.program_id(0)
    g = pid % RUNS
    hb = (pid // RUNS) % (H // 64)
    row = (pid // (RUNS * (H // 64))).to(tl.int64)
    k = tl.arange(0, 64)
    h = hb * 64 + (k // 8 % 4) * 16 + (k // 32) * 8 + k % 8
    c = tl.arange(0, 8)
    block = ws_out_ptr + row * stride_wr + hb * 64 * stride_wh + g * 512
    m = tl.full([64], float("-inf"), tl.float32)
    for s in range(num_splits):
        m = tl.maximum(m, tl.load(ws_lse_ptr + row * stride_lr + s * stride_ls + h))
    m_ref = tl.where(m == float("-inf"), 0.0, m)
    acc = tl.zeros([64, 8], tl.float32)
    w_sum = tl.zeros([64], tl.float32)
    for s in range(num_splits):
        w = tl.exp(tl.load(ws_lse_ptr + row * stride_lr + s * stride_ls + h) - m_ref)
        w_sum += w
        acc += w[:, None] * tl.load(block + s * stride_ws + k[:, None] * 8 + c[None, :])
    out = acc / tl.where(w_sum == 0.0, 1.0, w_sum)[:, None]
    tl.store(out_ptr + (row * H + h[:, None]) * D_NOPE + g * 8 + c[None, :], out.to(out_ptr.dtype.element_ty))
    if g == 0:
        tl.store(lse_ptr + row * H + h, tl.where(w_sum == 0.0, float("-inf"), m_ref + tl.log(w_sum)))


def time(fn, reps=50):
    """µs per launch of ``fn``: a CUDA graph of ``reps`` launches replayed (the kernel table's
    :func:`graphattn.bench.kernels.time_graph`), so that the host's launch cost (10-15 µs a Triton
    launch from Python) is not what is timed."""
    return time_graph(lambda _: fn(), [None], reps, replays=10) * 1e6

for rows, H, S in ((8, 128, 8), (1, 128, 32), (8, 64, 16), (4, 128, 16), (2, 64, 32)):
    ws = torch.randn(rows, S, H, 512, device="cuda")
    wl = torch.randn(rows, S, H, device="cuda")
    BS = max(2, triton.next_power_of_2(S))
    outs = {}

    def run(name, kernel, **kw):
        out = torch.empty(rows, H, 512, device="cuda", dtype=torch.bfloat16)
        lse = torch.empty(rows, H, device="cuda")
        args = (ws, wl, out, lse, H, S, *ws.stride()[:3], *wl.stride()[:2])
        outs[name] = (out, lse)
        return time(lambda: kernel[(rows * H,)](*args, BLOCK_S=BS, D_NOPE=512, **kw))

    res = {"head-major": run("head-major", _flashmla_combine_kernel, num_warps=4),
           "native (gluon)": run("native", _flashmla_combine_native_kernel, num_warps=4),
           "native tl 82124c6": run("tl", native_tl, num_warps=4),
           "native tl loop": run("loop", native_loop, num_warps=4)}
    diffs = {name: max((outs[name][0].float() - outs["native"][0].float()).abs().max().item(),
                       (outs[name][1] - outs["native"][1]).abs().max().item()) for name in ("tl", "loop")}
    print(f"{H}x{rows} splits {S}: " + ", ".join(f"{k} {v:.2f} us" for k, v in res.items())
          + f"; max |diff| against the gluon one: {diffs}", flush=True)
