"""Distributed shared memory from Gluon on sm_90: can a kernel write into the shared memory of
another CTA of its thread-block cluster, and what does an exchange cost?

Gluon (triton 3.6) has no API for it; inline PTX does it: ``mapa.shared::cluster`` maps a
shared address (``global_smem``, the kernel's dynamic shared memory, plus the offset Triton's
allocator gave the buffer) to a peer CTA's, and ``st.async`` or ``cp.async.bulk.shared::cluster``
write there, completing on the peer's mbarrier. Three checks, then timings:

* ``_dsmem_kernel``, compiled with ``num_ctas=2`` (every layout then needs a CGA basis, and a
  store of a tensor replicated over the cluster is made by one CTA: the result is stored by hand);
* ``_dsmem_kernel_1cta``: ordinary one-CTA code launched in clusters of two by setting the
  compiled kernel's ``num_ctas`` (Triton's launcher takes the cluster shape from it);
* ``_exchange_kernel``: clusters of 2, 4 and 8 CTAs, each sending its 64 KB in ``C`` chunks (chunk
  ``j`` to CTA ``j``) by bulk copies, timed with ``%globaltimer`` from the first copy to the
  last byte received; and the same with each chunk in 64 copies.

``PYTHONPATH=. python scripts/dsmem_probe.py run`` on an sm_90 GPU (exit 1 if a check fails);
without ``run`` it compiles the kernels for sm_90 and prints their shared memory. The buffers'
offsets here are those triton 3.6 gives (``scripts/smem_offsets.py``-style discovery is what a
kernel would need; see docs/benchmarks.md). The numbers from an H200 are in docs/benchmarks.md.
"""
import sys

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier

N = 128
WORDS = 16384  # the exchange's 64 KB a CTA
# Kernel signatures (constexprs by name) for compiling outside the JIT.
SWAP_SIG = {"out_ptr": "*i32", "ASM": "constexpr", "N": "constexpr"}
EXCHANGE_SIG = {"t_ptr": "*i64", "ASM_SEND": "constexpr", "C": "constexpr", "WORDS": "constexpr"}
# Where triton's allocator puts the kernels' buffers (bytes into global_smem; the CPU test reads
# them back with smem_offsets): the swap kernels' (buf, bar), the exchange kernel's (stage, recv, bar).
SWAP_OFFSETS = (0, N * 4)


def exchange_offsets(words: int = WORDS) -> tuple[int, int, int]:
    """``_exchange_kernel``'s (stage, recv, bar) offsets for ``words`` int32 words a buffer."""
    return 0, words * 4, 2 * words * 4


def in_clusters(fn, size: int, clusters: int, *args, **kwargs):
    """Compile one-CTA Gluon code ``fn`` for ``args``/``kwargs`` and return ``launch()``, which runs
    it as ``clusters`` clusters of ``size`` CTAs: the compiled kernel's ``num_ctas`` is what
    Triton's launcher takes the cluster shape from (and multiplies the grid by)."""
    k = fn.warmup(*args, grid=(clusters * size,), **kwargs)
    k.packed_metadata = (k.packed_metadata[0], size, k.packed_metadata[2])
    return lambda: fn[(clusters,)](*args, **kwargs)


@gluon.jit
def _cluster_barrier(INIT: gl.constexpr = 0):
    """``barrier.cluster`` (release / acquire) in every thread; ``INIT``: after mbarrier inits,
    made visible to the cluster first."""
    if INIT:
        gl.inline_asm_elementwise("fence.mbarrier_init.release.cluster; barrier.cluster.arrive.release.aligned; "
                                  "barrier.cluster.wait.acquire.aligned; mov.u32 $0, 0;", "=r", [],
                                  dtype=gl.int32, is_pure=False, pack=1)
    else:
        gl.inline_asm_elementwise("barrier.cluster.arrive.release.aligned; barrier.cluster.wait.acquire.aligned; "
                                  "mov.u32 $0, 0;", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _swap_with_peer(buf, bar, pid, ASM: gl.constexpr, N: gl.constexpr, layout: gl.constexpr):
    """Write ``pid * 100000 + rank * 1000 + i`` into the peer's ``buf`` (``ASM``: st.async per
    word), wait for the peer's N words in mine; returns them."""
    mbarrier.init(bar, count=1)
    mbarrier.expect(bar, N * 4)
    _cluster_barrier(1)  # every CTA's barrier initialised, cluster-wide, before any peer writes
    i = gl.arange(0, N, layout=layout)
    rank = gl.inline_asm_elementwise("mov.u32 $0, %cluster_ctarank;", "=r,r", [i], dtype=gl.int32, is_pure=True, pack=1)
    gl.inline_asm_elementwise(ASM, "=r,r,r,r", [i, rank ^ 1, pid * 100000 + rank * 1000 + i], dtype=gl.int32,
                              is_pure=False, pack=1)
    mbarrier.wait(bar, 0)  # the peer's N values have landed here
    return buf.load(layout)


@gluon.jit
def _dsmem_kernel(out_ptr, ASM: gl.constexpr, N: gl.constexpr):
    """Compiled with num_ctas=2: two CTAs per cluster, each holding the whole tensor (a zero CTA
    basis: replicated)."""
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0], [[0]])
    buf = gl.allocate_shared_memory(gl.int32, [N], gl.SwizzledSharedLayout(1, 1, 1, [0], [[0]]))
    bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout([[0]]))
    i = gl.arange(0, N, layout=layout)
    blk = gl.inline_asm_elementwise("mov.u32 $0, %ctaid.x;", "=r,r", [i], dtype=gl.int32, is_pure=True, pack=1)
    got = _swap_with_peer(buf, bar, blk, ASM, N, layout)
    # st.global by hand: a store of a tensor replicated over the cluster's CTAs is made by one CTA
    dst = out_ptr + blk.to(gl.int64) * N + i
    gl.inline_asm_elementwise("st.global.b32 [$1], $2; mov.u32 $0, 0;", "=r,l,r", [dst, got], dtype=gl.int32,
                              is_pure=False, pack=1)
    _cluster_barrier()  # neither CTA exits while the other may still write to it


@gluon.jit
def _dsmem_kernel_1cta(out_ptr, ASM: gl.constexpr, N: gl.constexpr):
    """The same, compiled as ordinary one-CTA code (no CGA layouts), launched in clusters of two
    by setting the compiled kernel's num_ctas (Triton's launcher then sets the cluster shape)."""
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    buf = gl.allocate_shared_memory(gl.int32, [N], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    pid = gl.program_id(0)
    got = _swap_with_peer(buf, bar, pid, ASM, N, layout)
    gl.store(out_ptr + pid.to(gl.int64) * N + gl.arange(0, N, layout=layout), got)
    _cluster_barrier()


def remote_store_asm(off_buf: int, off_bar: int) -> str:
    """st.async of $3 into word $1 of the buffer at shared offset off_buf of cluster CTA $2,
    completing on its mbarrier at off_bar."""
    return ("{ .reg .u32 a, b, ra, rb; mov.u32 a, global_smem; add.u32 a, a, %d; mad.lo.u32 a, $1, 4, a; "
            "mov.u32 b, global_smem; add.u32 b, b, %d; mapa.shared::cluster.u32 ra, a, $2; "
            "mapa.shared::cluster.u32 rb, b, $2; "
            "st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [ra], $3, [rb]; mov.u32 $0, 0; }"
            % (off_buf, off_bar))


def compile_all() -> dict:
    """The three kernels compiled for sm_90 (no GPU needed): name -> compiled kernel."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    target = GPUTarget("cuda", 90, 32)
    out = {}
    for name, fn, ctas in (("dsmem_kernel", _dsmem_kernel, 2), ("dsmem_kernel_1cta", _dsmem_kernel_1cta, 1)):
        src = GluonASTSource(fn=fn, signature=SWAP_SIG, constexprs={"ASM": remote_store_asm(*SWAP_OFFSETS), "N": N})
        out[name] = triton.compile(src, target=target, options={"num_warps": 4, "num_ctas": ctas})
    src = GluonASTSource(fn=_exchange_kernel, signature=EXCHANGE_SIG,
                         constexprs={"ASM_SEND": send_asm(8, WORDS, *exchange_offsets()), "C": 8, "WORDS": WORDS})
    out["exchange_kernel"] = triton.compile(src, target=target, options={"num_warps": 4})
    return out


def run():
    """Launch on the GPU: 2 clusters of 2 CTAs; each CTA must hold its peer's values."""
    asm = remote_store_asm(*SWAP_OFFSETS)
    out = torch.full((4, N), -1, dtype=torch.int32, device="cuda")
    _dsmem_kernel[(2,)](out, ASM=asm, N=N, num_warps=4, num_ctas=2)
    torch.cuda.synchronize()
    i = torch.arange(N, device="cuda", dtype=torch.int32)
    # CTA b receives from its peer b ^ 1 (cluster rank (b ^ 1) % 2)
    want = torch.stack([(b ^ 1) * 100000 + ((b ^ 1) % 2) * 1000 + i for b in range(4)])
    print("got:", out[:, :2].tolist(), "want:", want[:, :2].tolist())
    ok1 = torch.equal(out, want)
    print("DSMEM st.async through the cluster (num_ctas=2 compile):", "OK" if ok1 else "MISMATCH")
    out.fill_(-1)
    in_clusters(_dsmem_kernel_1cta, 2, 2, out, ASM=asm, N=N, num_warps=4)()
    torch.cuda.synchronize()
    ok2 = torch.equal(out, want)
    print("got:", out[:, :2].tolist())
    print("DSMEM st.async, one-CTA code launched as clusters of two:", "OK" if ok2 else "MISMATCH")
    return ok1 and ok2


@gluon.jit
def _exchange_kernel(t_ptr, ASM_SEND: gl.constexpr, C: gl.constexpr, WORDS: gl.constexpr):
    """Clusters of C CTAs (one-CTA code): each holds WORDS int32 words staged as C chunks and sends
    chunk j to CTA j's receive buffer (its own chunk k lands at position k there) with one bulk
    shared::cluster copy per peer, then waits for the C - 1 chunks it receives. Writes the
    exchange's duration (ns, globaltimer) per CTA and a checksum of what arrived."""
    layout: gl.constexpr = gl.BlockedLayout([4], [32], [4], [0])
    flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    stage = gl.allocate_shared_memory(gl.int32, [WORDS], flat)
    recv = gl.allocate_shared_memory(gl.int32, [WORDS], flat)
    bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    CHUNK: gl.constexpr = WORDS // C
    mbarrier.init(bar, count=1)
    mbarrier.expect(bar, (C - 1) * CHUNK * 4)
    pid = gl.program_id(0)
    w = gl.arange(0, WORDS, layout=layout)
    stage.store(pid * 1000000 + w)
    recv.store(gl.full([WORDS], -1, gl.int32, layout))
    fence_async_shared()  # the staged words (generic stores) before the bulk copies read them
    _cluster_barrier(1)
    t0 = gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)
    gl.inline_asm_elementwise(ASM_SEND, "=r", [], dtype=gl.int32, is_pure=False, pack=1)
    mbarrier.wait(bar, 0)
    t1 = gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)
    got = recv.load(layout)
    gl.store(t_ptr + pid * 2, t1 - t0)
    gl.store(t_ptr + pid * 2 + 1, gl.sum(got.to(gl.int64), axis=0))
    _cluster_barrier()


def send_asm(c: int, words: int, off_stage: int, off_recv: int, off_bar: int, pieces: int = 1) -> str:
    """Thread 0 of the CTA sends chunk j of its stage to peer j (j != own rank): bulk copies into
    the peer's recv at chunk (own rank), completing on the peer's barrier."""
    chunk = words * 4 // c
    body = ["{ .reg .u32 r, t, base, src, dst, bar, rdst, rbar; .reg .pred p, q;",
            "mov.u32 t, %tid.x; setp.eq.u32 p, t, 0; mov.u32 r, %cluster_ctarank; mov.u32 base, global_smem;"]
    piece = chunk // pieces
    for j in range(c):
        for q_ in range(pieces):
            body.append(f"setp.ne.u32 q, r, {j}; and.pred q, q, p;"
                        f" add.u32 src, base, {off_stage + j * chunk + q_ * piece};"
                        f" mad.lo.u32 dst, r, {chunk}, base; add.u32 dst, dst, {off_recv + q_ * piece};"
                        f" add.u32 bar, base, {off_bar};"
                        f" mapa.shared::cluster.u32 rdst, dst, {j}; mapa.shared::cluster.u32 rbar, bar, {j};"
                        " @q cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes"
                        f" [rdst], [src], {piece}, [rbar];")
    body.append("mov.u32 $0, 0; }")
    return " ".join(body)


def exchange(c: int, words: int = WORDS, clusters: int = 16, pieces: int = 1):
    """Time the exchange in clusters of c CTAs (one-CTA code, launched with num_ctas = c); each
    chunk in `pieces` bulk copies (from one thread)."""
    asm = send_asm(c, words, *exchange_offsets(words), pieces=pieces)
    t = torch.zeros(clusters * c * 2, dtype=torch.int64, device="cuda")
    launch = in_clusters(_exchange_kernel, c, clusters, t, ASM_SEND=asm, C=c, WORDS=words, num_warps=4)
    for _ in range(3):
        launch()
    torch.cuda.synchronize()
    ns = t[0::2].double()
    # what CTA p should have received: chunk k of peer j (j's words k*chunk..) at position j
    chunk = words // c
    want = []
    for p in range(clusters * c):
        first, k = p - p % c, p % c
        s = 0
        for j in range(c):
            if j == k:
                s += -1 * chunk
            else:
                pj = first + j
                base = pj * 1000000 + k * chunk
                s += chunk * base + chunk * (chunk - 1) // 2
        want.append(s)
    ok = t[1::2].tolist() == want
    print(f"[{pieces} copies a chunk] cluster {c}: {words * 4 // 1024} KB a CTA, "
          f"{c - 1} chunks of {chunk * 4 // 1024} KB out and in: median {ns.median().item() / 1000:.2f} us, "
          f"max {ns.max().item() / 1000:.2f} us, data {'OK' if ok else 'WRONG'}")
    return ok


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "run":
        ok = run()
        for c in (2, 4, 8):
            ok = exchange(c) and ok
        ok = exchange(8, pieces=64) and ok
        sys.exit(0 if ok else 1)
    for name, c in compile_all().items():
        print(f"{name}: shared {c.metadata.shared} B, num_ctas {c.metadata.num_ctas}, cubin {len(c.asm['cubin'])} B")
