"""Host cost of what Triton 3.6's launcher does per pointer argument (NVIDIA GPU): the driver's
cuPointerGetAttribute through ctypes (against a no-op driver call), ``data_ptr()``, and a raw
launch of one compiled kernel with tensor against int pointers. Run from the repository root:
``PYTHONPATH=. python scripts/ptr_cost.py``."""
import ctypes, time, torch, triton, triton.language as tl
cuda = ctypes.CDLL("libcuda.so.1")
t = torch.empty(1 << 20, device="cuda")
p = ctypes.c_uint64()
CU_POINTER_ATTRIBUTE_DEVICE_POINTER = 2
def best(f, n=20000):
    r = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            f()
        r.append((time.perf_counter() - t0) / n * 1e6)
    return min(r)
ptr = t.data_ptr()
get = cuda.cuPointerGetAttribute
print(f"ctypes cuPointerGetAttribute: {best(lambda: get(ctypes.byref(p), CU_POINTER_ATTRIBUTE_DEVICE_POINTER, ctypes.c_uint64(ptr))):.3f} us")
print(f"ctypes no-op (time): {best(lambda: cuda.cuCtxGetDevice(ctypes.byref(p))):.3f} us")
print(f"t.data_ptr(): {best(t.data_ptr):.3f} us")

@triton.jit
def k(a, b, c, d, e, f, g, h, n):
    pass
args = [torch.empty(16, device="cuda") for _ in range(8)]
ck = k[(1,)](*args, 1)
from graphattn.kernels.launch import _Triton
_Triton.load()
raw = _Triton.raw_launcher(ck.run)
print("raw launcher:", raw is not None)
if raw is not None:
    entry, coop, pdl = raw
    dev = torch.cuda.current_device()
    stream = _Triton.stream(dev)
    mid = (coop, pdl, None, None, ck.packed_metadata, None, None, None)
    ints = [a.data_ptr() for a in args]
    fn = ck.function
    torch.cuda.synchronize()
    tt = best(lambda: entry(1, 1, 1, stream, fn, *mid, *args, 1), 5000)
    torch.cuda.synchronize()
    ti = best(lambda: entry(1, 1, 1, stream, fn, *mid, *ints, 1), 5000)
    torch.cuda.synchronize()
    print(f"raw launch, 8 tensor pointers: {tt:.3f} us; 8 int pointers: {ti:.3f} us")
