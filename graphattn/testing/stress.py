"""Randomized replay stress test: many steps on one captured runner per backend and graph mode.

Each operation is one engine step on a :class:`~graphattn.graphs.GraphRunner` whose buckets
were captured once: a random row count picks a bucket replay, an eager step above the largest
bucket (slices of the captured buffers) or an eager step above the metadata's reserved rows
(temporaries). Around every step the allocator cache is flushed and victim tensors filled with
a sentinel are allocated where a freed captured buffer would be handed out; after it they are
checked, as are the captured buffers' addresses (and, for an oversized step, their contents).
Every ``check_every`` steps the output is compared with the float64 reference; every
``determinism_every`` steps the same step is run again and must match bitwise.

Usage (the GPU run is ``scripts/gpu_stress.sh``)::

    python -m graphattn.testing.stress --ops 10000 --json stress.json        # every backend
    python -m graphattn.testing.stress --sum out/*.json                      # add runs up
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import asdict, dataclass, field, fields

import torch

from ..backends.base import accepts_out
from ..backends.registry import builtin_backends, get_backend_class
from ..common.metadata import D_QK, GraphMetadata
from ..common.platform import current_platform
from ..common.reference import sparse_mla_reference
from ..common.tolerances import tolerance
from ..graphs import GraphRunner, default_buckets, eager_on_graph
from .case import SENTINEL
from .graph_checks import _held_tensor_sizes, check_shared_pool

MODES = ("full", "breakable")
KINDS = ("replay", "eager", "oversized")  # within a bucket, above every bucket, above capacity
FAILURES = ("stale_writes", "wrong", "nondeterministic", "captured_touched", "unexpected_errors")


@dataclass(frozen=True)
class StressConfig:
    """Sizes and rates of one stress run (per backend and mode).

    Attributes:
        ops: steps to run (fewer if ``time_limit`` runs out first).
        heads, topk, pool, dtype: ``q [rows, heads, 576]``, ``indices [rows, topk]`` into ``kv [pool, 576]``.
        buckets: graph buckets (captured largest first into one pool).
        reserved: rows the metadata reserves (``make_metadata``); >= the largest bucket.
        oversize: the most rows an oversized step has above ``reserved``.
        weights: relative frequency of replay / eager-above-bucket / oversized steps.
        check_every, determinism_every: reference and bitwise-replay checks every N steps.
        sanitize: the capture sanitizer on replays (off: freed buffers must show as stale writes).
        seed: draws rows, indices and data.
        time_limit: seconds per backend and mode (0: none).
    """

    ops: int = 200
    heads: int = 16
    topk: int = 2048
    pool: int = 32768
    dtype: str = "bfloat16"
    buckets: tuple[int, ...] = tuple(default_buckets(64))
    reserved: int = 96
    oversize: int = 160
    weights: tuple[float, float, float] = (0.7, 0.15, 0.15)
    check_every: int = 10
    determinism_every: int = 7
    sanitize: bool = False
    seed: int = 0
    time_limit: float = 0.0

    @classmethod
    def small(cls, **kw) -> "StressConfig":
        """CPU sizes (Triton interpreter, emulated graphs): a few rows, small top-k."""
        base = dict(heads=8, topk=24, pool=64, dtype="float16", buckets=(1, 2, 4), reserved=6,
                    oversize=3, check_every=2, determinism_every=3)
        return cls(**{**base, **kw})


@dataclass
class StressCounts:
    """What one backend x mode run did and found (the failure counts must all be 0)."""

    backend: str
    mode: str
    ops: int = 0
    replay: int = 0
    eager: int = 0
    oversized: int = 0
    reference_checks: int = 0
    determinism_checks: int = 0
    stale_writes: int = 0
    wrong: int = 0
    nondeterministic: int = 0
    captured_touched: int = 0
    unexpected_errors: int = 0
    pools: int = 0
    seconds: float = 0.0
    messages: list[str] = field(default_factory=list)

    @property
    def failures(self) -> int:
        """Sum of the failure counts (0 for a clean run); a pool per bucket counts too."""
        return sum(getattr(self, f) for f in FAILURES) + (self.pools != 1)

    def fail(self, what: str, message: str) -> None:
        setattr(self, what, getattr(self, what) + 1)
        if len(self.messages) < 10:  # the first few, for the report
            self.messages.append(f"[{what}] op {self.ops}: {message}")


class _Harness:
    """One backend's metadata, KV pool and captured runner, and the checks around each step."""

    def __init__(self, name: str, mode: str, cfg: StressConfig, counts: StressCounts):
        self.cfg, self.counts, self.platform = cfg, counts, current_platform()
        self.dtype = getattr(torch, cfg.dtype)
        self.backend = get_backend_class(name)(cfg.heads, cfg.topk, self.dtype)
        self.metadata: GraphMetadata = self.backend.make_metadata(cfg.reserved)
        self.gen = torch.Generator(device=self.platform.device).manual_seed(cfg.seed)
        self.kv = self._randn(cfg.pool, D_QK)  # [pool, 576]
        out_kw = "out" if accepts_out(self.backend.forward) else None
        # A break in breakable mode, replayed through the backend's replay call where it has one.
        attention = eager_on_graph(self.backend.forward, out=out_kw, bind=getattr(self.backend, "bind_break", None))

        def step(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            out, lse = attention(q.clone(), self.kv, self.metadata)  # segment, break, segment
            return out.clone(), lse.clone()

        static = torch.zeros(max(cfg.buckets), cfg.heads, D_QK, dtype=self.dtype, device=self.platform.device)
        self.runner = GraphRunner(step, {"q": static}, {"q": 0.0}, metadata=self.metadata,
                                  buckets=list(cfg.buckets), mode=mode, sanitize=cfg.sanitize)
        self.runner.capture()
        self.held = _held_tensor_sizes(self.backend, self.metadata)
        self.addresses = {b.name: b.data_ptr() for b in self.metadata.buffers()}
        pools = self.runner.pools()
        counts.pools = len([p for i, p in enumerate(pools) if all(p is not o for o in pools[:i])])

    def _randn(self, *shape: int, std: float = 1.0) -> torch.Tensor:
        t = torch.randn(*shape, generator=self.gen, device=self.platform.device) * std
        return t.to(self.dtype)

    def inputs(self, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``q [rows, heads, 576]`` (logit std ~3) and ``indices [rows, topk]`` int32 with −1s."""
        cfg, dev = self.cfg, self.platform.device
        idx = torch.randint(0, cfg.pool, (rows, cfg.topk), generator=self.gen, device=dev, dtype=torch.int32)
        skip = torch.rand(rows, cfg.topk, generator=self.gen, device=dev) < 0.1
        return self._randn(rows, cfg.heads, D_QK, std=3.0), idx.masked_fill_(skip, -1)

    def row_buffers(self) -> list[torch.Tensor]:
        md = self.metadata
        return [b.tensor for b in (md.q_pad, md.counter, md.indices) if b is not None]

    def run(self, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out, lse = self.runner.run(q=q)
        self.platform.synchronize()
        return out.clone(), lse.clone()  # the next run overwrites a replay's outputs

    def step(self, i: int, kind: str, rows: int) -> None:
        cfg, counts = self.cfg, self.counts
        q, idx = self.inputs(rows)
        self.backend.plan(self.metadata, idx)  # the runner pads it to the bucket
        before = [t.clone() for t in self.row_buffers()] if kind == "oversized" else None
        self.platform.empty_cache()  # freed blocks go back, so a stale address gets reused
        victims = [torch.full((n,), SENTINEL, dtype=torch.uint8, device=self.platform.device) for n in self.held]
        out, lse = self.run(q)
        bad = sum(int((v != SENTINEL).sum()) for v in victims)
        if bad:
            counts.fail("stale_writes", f"{kind} of {rows} rows wrote {bad} bytes into victim tensors")
        moved = [b.name for b in self.metadata.buffers() if b.data_ptr() != self.addresses[b.name]]
        if before is not None and any(not torch.equal(a, b) for a, b in zip(before, self.row_buffers())):
            moved.append("contents")
        if moved:
            counts.fail("captured_touched", f"{kind} of {rows} rows moved or wrote captured buffers {moved}")
        if self.metadata.counter is not None and int(self.metadata.counter.tensor.abs().sum()):
            counts.fail("wrong", f"{kind} of {rows} rows left multi-CTA counters non-zero")
        if i % cfg.check_every == 0:
            counts.reference_checks += 1
            self.check_reference(kind, q, idx, out, lse)
        if i % cfg.determinism_every == 0:
            counts.determinism_checks += 1
            again = self.run(q)  # same plan, same inputs, same bucket
            if not (torch.equal(out, again[0]) and torch.equal(lse, again[1])):
                counts.fail("nondeterministic", f"{kind} of {rows} rows differs bitwise when run again")

    def check_reference(self, kind: str, q, idx, out, lse) -> None:
        ref_out, ref_lse = sparse_mla_reference(q, self.kv, idx, self.backend.sm_scale)
        tol = tolerance(self.dtype)
        ok = torch.allclose(out.double(), ref_out, atol=tol.atol, rtol=tol.rtol) and torch.allclose(
            lse.double(), ref_lse, atol=tol.lse_atol, rtol=tol.lse_rtol, equal_nan=False)
        if not ok:
            err = float((out.double() - ref_out).abs().nan_to_num(float("inf")).max())
            self.counts.fail("wrong", f"{kind} of {q.shape[0]} rows: out max error {err:.3g} vs the float64 reference")


def draw_rows(rng: random.Random, cfg: StressConfig) -> tuple[str, int]:
    """``(kind, rows)`` of one step: a bucket replay, an eager step above every bucket (up to
    the reserved rows), or an oversized eager step (above the reserved rows)."""
    top = max(cfg.buckets)
    weights = list(cfg.weights)
    if cfg.reserved <= top:
        weights[1] = 0.0  # no rows between the largest bucket and the reserved rows
    kind = rng.choices(KINDS, weights=weights)[0]
    if kind == "replay":
        return kind, rng.randint(1, top)
    if kind == "eager":
        return kind, rng.randint(top + 1, cfg.reserved)
    return kind, rng.randint(cfg.reserved + 1, cfg.reserved + max(1, cfg.oversize))


def run_stress(backend: str, mode: str, cfg: StressConfig) -> StressCounts:
    """Capture one runner for ``backend`` in ``mode`` and run ``cfg.ops`` random steps on it.

    Never raises for what it finds: every failure is counted (and the first messages kept)
    in the returned :class:`StressCounts`.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if cfg.reserved < max(cfg.buckets):
        raise ValueError(f"reserved ({cfg.reserved}) must be >= the largest bucket ({max(cfg.buckets)})")
    counts = StressCounts(backend, mode)
    t0 = time.perf_counter()
    try:
        harness = _Harness(backend, mode, cfg, counts)
    except Exception as exc:  # a refused configuration or a failed capture: nothing else runs
        counts.fail("unexpected_errors", f"setup: {type(exc).__name__}: {exc}")
        return counts
    rng = random.Random(f"{cfg.seed}/{backend}/{mode}")
    for i in range(cfg.ops):
        if cfg.time_limit and time.perf_counter() - t0 > cfg.time_limit:
            break
        kind, rows = draw_rows(rng, cfg)
        try:
            harness.step(i, kind, rows)
        except Exception as exc:  # counted, and the run goes on: the next plan starts afresh
            counts.fail("unexpected_errors", f"{kind} of {rows} rows: {type(exc).__name__}: {exc}")
        counts.ops += 1
        setattr(counts, kind, getattr(counts, kind) + 1)
    counts.seconds = round(time.perf_counter() - t0, 2)
    return counts


def add_up(results: list[dict]) -> list[dict]:
    """Sum result dicts (from one or more JSON reports) per (backend, mode)."""
    total: dict[tuple[str, str], dict] = {}
    numeric = [f.name for f in fields(StressCounts) if f.type in ("int", "float") and f.name != "pools"]
    for r in results:
        key = (r["backend"], r["mode"])
        acc = total.setdefault(key, {"backend": key[0], "mode": key[1], "runs": 0, "pools": 1,
                                     **{n: 0 for n in numeric}})
        acc["runs"] += 1
        acc["pools"] = max(acc["pools"], r.get("pools", 1))
        for n in numeric:
            acc[n] += r.get(n, 0)
    return list(total.values())


def _table(rows: list[dict]) -> str:
    cols = ("backend", "mode", "ops", "replay", "eager", "oversized", "reference_checks",
            "determinism_checks", *FAILURES, "pools")
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r.get(c, "")) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m graphattn.testing.stress", description=__doc__.split("\n")[0])
    p.add_argument("--backends", nargs="+", default=None, help="default: every built-in backend")
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument("--ops", type=int, default=None, help="steps per backend and mode")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--time-limit", type=float, default=0.0, help="seconds per backend and mode (0: none)")
    p.add_argument("--sanitize", action="store_true", help="capture sanitizer on every replay")
    p.add_argument("--small", action="store_true", help="CPU sizes (the default without a GPU)")
    p.add_argument("--json", default=None, help="write the config, platform and counts here")
    p.add_argument("--sum", nargs="+", default=None, metavar="JSON", help="add up earlier reports and exit")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Command line; exit status 0 only when every count of a failure is 0."""
    args = _parse(argv)
    if args.sum:
        rows = add_up([r for path in args.sum for r in json.load(open(path))["results"]])
        print(_table(rows))
        return 0 if all(sum(r[f] for f in FAILURES) == 0 and r["pools"] == 1 for r in rows) else 1
    platform = current_platform()
    kw = {"seed": args.seed, "time_limit": args.time_limit, "sanitize": args.sanitize}
    if args.ops is not None:
        if args.ops < 1:
            print(f"error: --ops must be >= 1, got {args.ops}", file=sys.stderr)
            return 2
        kw["ops"] = args.ops
    small = args.small or not platform.has_gpu
    cfg = StressConfig.small(**kw) if small else StressConfig(**kw)
    runs = []
    for name in args.backends or builtin_backends():
        for mode in args.modes:
            runs.append(run_stress(name, mode, cfg))
            print(_table([asdict(runs[-1])]).splitlines()[-1], flush=True)
            for m in runs[-1].messages:
                print(f"    {m}", flush=True)
    results = [asdict(c) for c in runs]
    report = {"config": asdict(cfg), "platform": platform.describe(), "command": sys.argv, "results": results}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    print(_table(results))
    return 0 if all(c.failures == 0 for c in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
