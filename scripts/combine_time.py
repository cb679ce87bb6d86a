"""Time flashmla's head-major and native combines alone (CUDA events, 200 launches each, L2-warm
workspace) with variants of the native one (warps, no output store, a loop over the splits), to find
why the native combine measured ~5-6 us slower in the kernel table's method (docs/benchmarks.md,
branch partial-native). `PYTHONPATH=. python scripts/combine_time.py` on an H200; not run yet."""
import torch, triton, triton.language as tl
from graphattn.kernels.flashmla import _flashmla_combine_kernel, _flashmla_combine_native_kernel


@triton.jit
def native_var(ws_out_ptr, ws_lse_ptr, out_ptr, lse_ptr, H, num_splits, stride_wr, stride_ws, stride_wh, stride_lr,
               stride_ls, BLOCK_S: tl.constexpr, D_NOPE: tl.constexpr, STORE: tl.constexpr, LOOP: tl.constexpr):
    GROUPS: tl.constexpr = D_NOPE // 8
    pid = tl.program_id(0)
    g = pid % GROUPS
    hb = (pid // GROUPS) % (H // 64)
    row = (pid // (GROUPS * (H // 64))).to(tl.int64)
    k = tl.arange(0, 64)
    h = hb * 64 + (k // 8 % 4) * 16 + (k // 32) * 8 + k % 8
    c = tl.arange(0, 8)
    block = ws_out_ptr + row * stride_wr + hb * 64 * stride_wh + g * 512
    if LOOP:
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
    else:
        s_offs = tl.arange(0, BLOCK_S)
        s_mask = s_offs < num_splits
        lse_s = tl.load(ws_lse_ptr + row * stride_lr + s_offs[:, None] * stride_ls + h[None, :], mask=s_mask[:, None],
                        other=float("-inf"))
        m = tl.max(lse_s, 0)
        m_ref = tl.where(m == float("-inf"), 0.0, m)
        w = tl.exp(lse_s - m_ref[None, :])
        w_sum = tl.sum(w, 0)
        o_s = tl.load(block + s_offs[:, None, None] * stride_ws + k[None, :, None] * 8 + c[None, None, :],
                      mask=s_mask[:, None, None], other=0.0)
        out = tl.sum(w[:, :, None] * o_s, 0) / tl.where(w_sum == 0.0, 1.0, w_sum)[:, None]
    if STORE:
        tl.store(out_ptr + (row * H + h[:, None]) * D_NOPE + g * 8 + c[None, :], out.to(out_ptr.dtype.element_ty))
    if g == 0:
        tl.store(lse_ptr + row * H + h, m_ref)


def time(fn, reps=200):
    fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) * 1000 / reps


for rows, H, S in ((8, 128, 8), (1, 128, 32), (8, 64, 16)):
    ws = torch.randn(rows, S, H, 512, device="cuda")
    wl = torch.randn(rows, S, H, device="cuda")
    out = torch.empty(rows, H, 512, device="cuda", dtype=torch.bfloat16)
    lse = torch.empty(rows, H, device="cuda")
    BS = max(2, triton.next_power_of_2(S))
    args = (ws, wl, out, lse, H, S, *ws.stride()[:3], *wl.stride()[:2])
    res = {}
    res["plain"] = time(lambda: _flashmla_combine_kernel[(rows * H,)](*args, BLOCK_S=BS, D_NOPE=512, num_warps=4))
    res["native"] = time(lambda: _flashmla_combine_native_kernel[(rows * H,)](*args, BLOCK_S=BS, D_NOPE=512, num_warps=4))
    res["native w8"] = time(lambda: _flashmla_combine_native_kernel[(rows * H,)](*args, BLOCK_S=BS, D_NOPE=512, num_warps=8))
    res["native w2"] = time(lambda: _flashmla_combine_native_kernel[(rows * H,)](*args, BLOCK_S=BS, D_NOPE=512, num_warps=2))
    res["native nostore"] = time(lambda: native_var[(rows * H,)](*args, BLOCK_S=BS, D_NOPE=512, STORE=0, LOOP=0, num_warps=4))
    res["native loop"] = time(lambda: native_var[(rows * H,)](*args, BLOCK_S=BS, D_NOPE=512, STORE=1, LOOP=1, num_warps=4))
    res["native loop w2"] = time(lambda: native_var[(rows * H,)](*args, BLOCK_S=BS, D_NOPE=512, STORE=1, LOOP=1, num_warps=2))
    print(f"{H}x{rows} splits {S}: " + ", ".join(f"{k} {v:.2f}" for k, v in res.items()), flush=True)
