"""The ``graphattn bench`` command line: its options and the checked request they make.

Every value is checked before anything runs: numbers by their argparse types
(:mod:`graphattn.common.argtypes`), the combinations and the backend by
:func:`request_from_args`, which raises ``ValueError`` naming the option, so the command line
can refuse them in one line instead of replacing them with defaults or failing mid-run.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from typing import Any

import torch

from ..backends import AUTO, add_attn_backend_arg, load_error, resolve_backend
from ..backends.registry import env_default_note
from ..common.argtypes import choice_list, new_file, non_negative_int, positive_float, positive_int
from ..common.argtypes import positive_int_list, seed
from ..common.kv_layout import KV_FP8, TOKEN_BYTES, kv_dtype_name, resolve_kv_dtype
from ..common.metadata import D_QK, D_V
from ..common.platform import Platform
from ..common.validation import check_indices_default
from ..graphs.sanitizer import sanitize_enabled
from .decode import MODES, default_timing, human_bytes, platform_peaks
from .workload import DecodeWorkload

DTYPES = ("bfloat16", "float16", "float32")


def add_bench_args(parser: argparse.ArgumentParser) -> None:
    """The ``graphattn bench`` options (unset shape options take the platform's defaults)."""
    add_attn_backend_arg(parser)
    g = parser.add_argument_group("workload (defaults: realistic on a GPU, small on the CPU)")
    g.add_argument("--heads", type=positive_int,
                   help="query heads per row, all ranks together with --tp (GPU default 128)")
    g.add_argument("--topk", type=positive_int, help="indices per row (GPU default 2048)")
    g.add_argument("--pool-tokens", type=positive_int, help="KV pool tokens per layer (GPU default 262144)")
    g.add_argument("--batch-sizes", type=positive_int_list, help="rows per step, e.g. 1,2,4,8 (GPU default 1..128)")
    g.add_argument("--layers", type=positive_int, help="model layers (GPU default 61)")
    g.add_argument("--measure-layers", type=positive_int, help="layers materialised and timed (GPU default 4)")
    g.add_argument("--dtype", choices=DTYPES, help="q/kv dtype")
    g.add_argument("--kv-dtype", choices=("auto", "bf16", "fp16", "fp8"), default="auto",
                   help="KV cache: auto or bf16/fp16 (q's dtype, [pool, 576]) or fp8 (656-byte FP8 "
                   "tokens; bytes counted at 656 per token)")
    g.add_argument("--seed", type=seed, default=0, help="RNG seed")
    r = parser.add_argument_group("run")
    r.add_argument("--modes", type=choice_list(MODES), default=MODES,
                   help="comma-separated subset of eager,full,breakable")
    r.add_argument("--iters", type=positive_int,
                   help="timed steps per point; the point is their median (GPU default 50 in samples of 10, CPU 15)")
    r.add_argument("--warmup", type=non_negative_int, help="untimed steps per point (GPU default 3, CPU 2)")
    r.add_argument("--sanitize", action="store_true", help="check captured buffers before each replay")
    r.add_argument("--no-check", action="store_true", help="skip the comparison with the reference")
    r.add_argument("--peak-bw", type=positive_float, help="roofline bytes/s (default: per device)")
    r.add_argument("--peak-flops", type=positive_float, help="roofline flop/s (default: per device)")
    r.add_argument("--json", metavar="PATH", type=new_file, help="also write the report as JSON")
    r.add_argument("--tp", type=positive_int, default=1,
                   help="tensor parallelism: split --heads over N ranks (torch.distributed: NCCL/RCCL on "
                   "GPUs, gloo on the CPU), each with its own backend, metadata and graphs, and an "
                   "all-reduce of the output projection in every layer; spawns N processes, or runs "
                   "as one rank under torchrun (default 1)")


@dataclass
class BenchRequest:
    """A checked ``graphattn bench`` run: what :func:`graphattn.bench.decode.run_bench` needs."""

    workload: DecodeWorkload
    backend: str  # the name as requested (``auto`` or a backend name / class path)
    modes: tuple[str, ...]
    iters: int
    warmup: int
    window: int
    sanitize: bool | None = None  # None: GRAPHATTN_SANITIZE decides (off when unset)
    check: bool = True
    peaks: tuple[float, float, str] | None = None
    json_path: str | None = None
    platform: Platform | None = field(default=None, repr=False)
    tp: int = 1  # ranks the heads are split over (graphattn.bench.tp)

    def run_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``run_bench``."""
        return dict(wl=self.workload, backend_name=self.backend, modes=self.modes, iters=self.iters,
                    warmup=self.warmup, sanitize=self.sanitize, check=self.check, peaks=self.peaks,
                    platform=self.platform, window=self.window)


def workload_from_args(args: argparse.Namespace, platform: Platform) -> DecodeWorkload:
    """The default workload of ``platform`` with the options given on the command line.

    Raises:
        ValueError: options that contradict each other or the defaults, named as options.
    """
    base = DecodeWorkload.default_for(platform)

    def given(value: Any, default: Any) -> tuple[Any, str]:
        # (value, how to name it in a message): an unset option takes the platform's default.
        return (default, f"{default}, the default") if value is None else (value, str(value))

    layers, layers_s = given(args.layers, base.num_layers)
    measure, measure_s = given(args.measure_layers, min(base.measure_layers, layers))
    topk, topk_s = given(args.topk, base.topk)
    pool, pool_s = given(args.pool_tokens, max(base.pool_tokens, topk))
    if measure > layers:
        raise ValueError(f"--measure-layers ({measure_s}) must be <= --layers ({layers_s})")
    if pool < topk:
        raise ValueError(f"--pool-tokens ({pool_s}) must be >= --topk ({topk_s}): "
                         "each row's indices are distinct tokens of the pool")
    kv_arg = getattr(args, "kv_dtype", "auto")
    # --kv-dtype bf16/fp16 names the model dtype (a plain cache is in q's dtype): it sets q's
    # dtype unless --dtype does (then they must agree; resolve_kv_dtype says so, naming both).
    dtype_name = args.dtype or {"bf16": "bfloat16", "fp16": "float16"}.get(kv_arg)
    dtype = getattr(torch, dtype_name) if dtype_name else base.dtype
    return DecodeWorkload(
        num_heads=given(args.heads, base.num_heads)[0], topk=topk, pool_tokens=pool,
        batch_sizes=given(args.batch_sizes, base.batch_sizes)[0], num_layers=layers, measure_layers=measure,
        dtype=dtype, seed=args.seed, kv_dtype=resolve_kv_dtype(kv_arg, dtype),
    )


def request_from_args(args: argparse.Namespace, platform: Platform) -> BenchRequest:
    """Check every ``graphattn bench`` input against each other and this platform.

    Raises:
        ValueError: the first problem, naming the option (``--attn-backend``, ``--dtype``, ...).
    """
    wl = workload_from_args(args, platform)
    tp = getattr(args, "tp", 1)
    check_tp(tp, wl.num_heads, "the default" if args.heads is None else None, platform)
    # The debug switches the run reads, checked now rather than at the first plan() or capture.
    check_indices_default()  # GRAPHATTN_CHECK_INDICES
    sanitize = args.sanitize or None  # --sanitize, else GRAPHATTN_SANITIZE
    sanitize_enabled(sanitize)
    name = args.attn_backend
    if name != AUTO:
        error = load_error(name)
        if error:
            raise ValueError(f"argument --attn-backend: {error}{env_default_note(name)}")
    try:
        resolve_backend(name, wl.num_heads // tp, wl.dtype, wl.topk, platform, wl.kv_dtype)  # heads per rank
    except (ValueError, RuntimeError) as exc:  # refused configuration / auto found none
        raise ValueError(f"argument --attn-backend: {exc}{env_default_note(name)}") from None
    timing = default_timing(platform)
    iters = args.iters if args.iters is not None else timing["iters"]
    peaks = None
    if args.peak_bw is not None or args.peak_flops is not None:
        bw, fl, _ = platform_peaks(platform, wl.dtype)
        peaks = (args.peak_bw or bw, args.peak_flops or fl, "command line")
    check_memory(wl, tp, platform)
    return BenchRequest(
        workload=wl, backend=name, modes=args.modes, iters=iters,
        warmup=args.warmup if args.warmup is not None else timing["warmup"],
        window=min(timing["window"], iters), sanitize=sanitize, check=not args.no_check,
        peaks=peaks, json_path=args.json, platform=platform, tp=tp,
    )


def check_tp(tp: int, heads: int, heads_note: str | None, platform: Platform) -> None:
    """Refuse a ``--tp`` that cannot split ``heads`` evenly, that needs more GPUs than this
    process sees, or that disagrees with torchrun's ``WORLD_SIZE``.

    Raises:
        ValueError: naming ``--tp`` and what it must be.
    """
    heads_s = f"{heads}, {heads_note}" if heads_note else str(heads)
    if heads % tp:
        raise ValueError(f"--heads ({heads_s}) must be a multiple of --tp ({tp}): each rank takes "
                         f"heads / tp heads; pick a --tp that divides {heads}")
    world = os.environ.get("WORLD_SIZE")
    torchrun = world is not None and "RANK" in os.environ
    # Under torchrun every WORLD_SIZE must match (a world of 1 with --tp 2 ran one rank with all
    # the heads); elsewhere a stray WORLD_SIZE > 1 still says the launch is not what --tp says.
    if world is not None and (torchrun or (world.strip().isdigit() and int(world) > 1)) \
            and world.strip() != str(tp):
        raise ValueError(f"--tp ({tp}) must equal torchrun's WORLD_SIZE ({world}): under torchrun each "
                         f"process is one rank; run torchrun --nproc-per-node {tp}, or pass --tp {world}")
    if tp > 1 and platform.has_gpu:
        gpus = torch.cuda.device_count()
        if world is None and tp > gpus:
            raise ValueError(f"--tp {tp} needs {tp} GPUs (one per rank), this process sees {gpus}; "
                             f"use --tp {gpus} or fewer, or check CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES")


# -- memory -----------------------------------------------------------------------------------------
def rank_bytes(wl: DecodeWorkload, tp: int) -> dict[str, int]:
    """A lower bound of what one rank allocates at once, by what sets it (the KV pools, the
    random draw that picks each row's top-k, one step's q and outputs). The backend's own
    buffers, the reference check and the graphs come on top."""
    elt = torch.empty((), dtype=wl.dtype).element_size()
    rows, heads = wl.max_rows, wl.num_heads
    fp8 = kv_dtype_name(wl.kv_dtype) == KV_FP8
    kv = wl.measure_layers * wl.pool_tokens * (TOKEN_BYTES if fp8 else D_QK * elt)
    if fp8:  # each pool is drawn in float32, then quantised
        kv += wl.pool_tokens * D_QK * 4
    return {
        "KV pools (--pool-tokens x --measure-layers)": kv,
        "top-k draw (--batch-sizes x --pool-tokens)": rows * wl.pool_tokens * 4,  # float32 keys per row
        "q and outputs (--batch-sizes x --heads x --measure-layers)":
            wl.measure_layers * rows * (heads * D_QK * elt + heads // tp * (D_V * elt + 4)),
    }


def memory_limit(platform: Platform, tp: int) -> tuple[int, str] | None:
    """``(bytes, what)``: the most one rank can allocate here: a GPU's total memory (the
    smallest of the ranks' GPUs), or on the CPU the host's available memory shared by the
    ranks that run on it. ``None`` when it cannot be read."""
    try:
        if platform.has_gpu:
            if tp == 1 or "RANK" in os.environ:  # this process's GPU (bind_local_rank set it)
                devices = [torch.cuda.current_device()]
            else:  # spawned ranks: cuda:0 .. cuda:tp-1
                devices = list(range(tp))
            total = min(torch.cuda.get_device_properties(i).total_memory for i in devices)
            return total, f"the GPU's total memory ({human_bytes(total)})"
        available = _host_available_bytes()
        if available is None:
            return None
        ranks = tp if "RANK" not in os.environ else int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
        share = available // max(ranks, 1)
        what = f"the host's available memory ({human_bytes(available)}" + (
            f", shared by {ranks} ranks)" if ranks > 1 else ")")
        return share, what
    except (RuntimeError, OSError, ValueError, AssertionError):
        return None


def _host_available_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_memory(wl: DecodeWorkload, tp: int, platform: Platform) -> None:
    """Refuse a workload whose inputs alone cannot fit (:func:`rank_bytes` against
    :func:`memory_limit`), instead of an allocator traceback after setup.

    Raises:
        ValueError: naming the options that set the size and what they need.
    """
    limit = memory_limit(platform, tp)
    if limit is None:
        return
    parts = rank_bytes(wl, tp)
    need = sum(parts.values())
    if need <= limit[0]:
        return
    detail = ", ".join(f"{k} {human_bytes(v)}" for k, v in sorted(parts.items(), key=lambda kv: -kv[1]) if v)
    raise ValueError(f"the workload needs at least {human_bytes(need)} per rank ({detail}), more than "
                     f"{limit[1]}; make --pool-tokens, --batch-sizes, --heads or --measure-layers smaller")
