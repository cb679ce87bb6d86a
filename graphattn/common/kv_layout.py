"""KV-cache layouts, defined once: the model dtype, and DeepSeek's 656-byte FP8 token.

A backend takes the latent KV cache in one of two layouts (``kv_dtype``):

* ``"auto"``: ``kv [pool_tokens, 576]`` in q's dtype (bf16/fp16); V = ``kv[:, :512]``.
* ``"fp8"``: ``kv [pool_tokens, 656]`` ``uint8``, one 656-byte token per row (FlashMLA's layout for
  DeepSeek V3.2 sparse MLA; vLLM calls it ``fp8_ds_mla``)::

      bytes   0 .. 511   512 float8_e4m3 values of the latent ("nope") part
      bytes 512 .. 527   4 float32 scales, scale[t] for nope values [128 t, 128 t + 128)
      bytes 528 .. 655   64 bfloat16 rotary ("rope") values, not quantised

  Dequantised (what attention reads, :func:`dequantize_kv`), in q's dtype:
  ``nope[i] = dtype(float32(fp8[i]) * scale[i // 128])`` (the product in float32, rounded once to
  q's dtype: bf16 or fp16; float32 q keeps the float32 product), ``rope`` = the stored bf16
  values in q's dtype; V = the dequantised nope part. Attention over FP8 tokens is attention
  over that cache, exactly as over a plain cache in q's dtype (as FlashMLA's FP8 sparse decode
  does: dequantise to bf16, then bf16 products). With fp16 q a product beyond fp16's range
  becomes inf: an fp16 model's cache holds no such values. 656 bytes is 57% of a bf16 token's 1152.

The bytes are the same everywhere; the FP8 *format* of the 512 values is the hardware's
(``Platform.fp8_dtype``): ``float8_e4m3fn`` on NVIDIA and gfx950, ``float8_e4m3fnuz`` on gfx942
(max 240 instead of 448, so its scales are ``amax / 240``). A cache is read with the format it
was written with; the quantiser and dequantiser take the platform's unless told otherwise.

Every function here is made of torch ops with static shapes and no host synchronisation, so
engines can quantise and write KV inside a captured decode graph.
"""

from __future__ import annotations

import torch

from .platform import current_platform

KV_AUTO = "auto"  # kv in q's dtype: [pool_tokens, 576]
KV_FP8 = "fp8"  # the 656-byte FP8 token: [pool_tokens, 656] uint8
KV_DTYPES = (KV_AUTO, KV_FP8)
_ALIASES = {"fp8_ds_mla": KV_FP8}  # vLLM's name for this layout

D_NOPE = 512  # quantised latent values per token (V)
D_ROPE = 64  # bf16 rotary values per token
TILE = 128  # nope values per scale
NUM_TILES = D_NOPE // TILE
SCALE_OFFSET = D_NOPE  # byte offset of the 4 float32 scales
ROPE_OFFSET = SCALE_OFFSET + 4 * NUM_TILES  # byte offset of the 64 bf16 rope values (528)
TOKEN_BYTES = ROPE_OFFSET + 2 * D_ROPE  # 656
# Kernel constexpr ``KV_FP8``: 0 = kv in q's dtype, else the FP8 format of 656-byte tokens.
FP8_KERNEL_CODES = {torch.float8_e4m3fn: 1, torch.float8_e4m3fnuz: 2}
FP8_DTYPES = tuple(FP8_KERNEL_CODES)


def kv_dtype_name(name: str) -> str:
    """The layout name ``name`` means (``"auto"`` or ``"fp8"``; ``"fp8_ds_mla"`` is ``"fp8"``).

    Raises:
        ValueError: an unknown name (the message lists the valid ones).
    """
    key = str(name).strip().lower()
    key = _ALIASES.get(key, key)
    if key not in KV_DTYPES:
        raise ValueError(
            f"Unknown kv_dtype: {name!r}. Valid options are: {', '.join(KV_DTYPES)} "
            f"('auto' = kv in q's dtype, 'fp8' = 656-byte FP8 tokens)"
        )
    return key


def resolve_kv_dtype(name: str, dtype: torch.dtype) -> str:
    """A command line's ``--kv-dtype`` for q dtype ``dtype``: ``auto``/``fp8`` as
    :func:`kv_dtype_name`, or a dtype name (``bf16``, ``bfloat16``, ``fp16``, ``float16``,
    ``float32``) that must be q's dtype (KV in the model dtype is ``auto``).

    Raises:
        ValueError: an unknown name, or a dtype other than q's.
    """
    named = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16,
             "float16": torch.float16, "float32": torch.float32, "fp32": torch.float32}
    key = str(name).strip().lower()
    if key not in named:
        return kv_dtype_name(name)
    if named[key] != dtype:
        raise ValueError(
            f"kv dtype {name!r} must be q's dtype {str(dtype).replace('torch.', '')} (a plain KV "
            "cache is in the model dtype); pass --dtype to change both, or --kv-dtype fp8"
        )
    return KV_AUTO


def describe_kv_dtype(kv_dtype: str) -> str:
    """One phrase for messages: ``"fp8 ([pool, 656] uint8 FP8 tokens)"``."""
    return {KV_AUTO: "auto ([pool, 576] in q's dtype)",
            KV_FP8: f"fp8 ([pool, {TOKEN_BYTES}] uint8 FP8 tokens)"}[kv_dtype_name(kv_dtype)]


def is_fp8_kv(kv: torch.Tensor) -> bool:
    """Whether ``kv`` is passed in the FP8 layout (``uint8`` rows of 656 bytes)."""
    return kv.dtype == torch.uint8


def fp8_format(fp8_dtype: torch.dtype | None = None) -> torch.dtype:
    """``fp8_dtype`` checked, or the platform's (``current_platform().fp8_dtype``)."""
    fp8 = fp8_dtype if fp8_dtype is not None else current_platform().fp8_dtype
    if fp8 not in FP8_KERNEL_CODES:
        raise TypeError(
            f"FP8 KV format must be one of {[str(d) for d in FP8_DTYPES]}, got {fp8}; leave it "
            "unset to use the platform's (Platform.fp8_dtype)"
        )
    return fp8


def fp8_kernel_code(fp8_dtype: torch.dtype) -> int:
    """The kernels' ``KV_FP8`` constexpr for tokens in format ``fp8_dtype`` (1 e4m3fn, 2 fnuz)."""
    return FP8_KERNEL_CODES[fp8_format(fp8_dtype)]


def check_fp8_kv(where: str, kv: torch.Tensor) -> None:
    """``kv [..., 656]`` uint8 with a contiguous last dim and 4-byte aligned rows (the float32
    scales are read as float32). Reads shapes and strides only (works on fake tensors)."""
    if kv.dtype != torch.uint8 or kv.dim() < 1 or kv.shape[-1] != TOKEN_BYTES:
        raise ValueError(
            f"{where}: an FP8 KV cache must be [pool_tokens, {TOKEN_BYTES}] uint8 (656-byte "
            f"tokens), got {tuple(kv.shape)} {kv.dtype}; write it with graphattn.common.kv_layout."
            "quantize_kv or write_kv_fp8_"
        )
    if kv.stride(-1) != 1 or any(s % 4 for s in kv.stride()[:-1]) or kv.storage_offset() % 4:
        raise ValueError(
            f"{where}: FP8 KV rows must be contiguous and 4-byte aligned (the scales are float32), "
            f"got strides {kv.stride()} and storage offset {kv.storage_offset()}; pass a "
            f"[pool, {TOKEN_BYTES}] slice of a contiguous buffer"
        )


def _check_model_kv(where: str, kv: torch.Tensor) -> None:
    if not kv.is_floating_point() or kv.dim() != 2 or kv.shape[1] != D_NOPE + D_ROPE:
        raise ValueError(
            f"{where}: expected kv [tokens, {D_NOPE + D_ROPE}] floating point, got "
            f"{tuple(kv.shape)} {kv.dtype}"
        )


def quantize_kv(kv: torch.Tensor, fp8_dtype: torch.dtype | None = None,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """Quantise ``kv [tokens, 576]`` (bf16/fp16/fp32) into 656-byte tokens. Capturable.

    Per 128-value tile of the nope part: ``scale = amax / max(fp8_dtype)`` (448 for e4m3fn, 240
    for e4m3fnuz) in float32, at least float32's smallest normal (2^-126), a tile of zeros gets
    scale 1; values ``x / scale`` rounded to nearest in ``fp8_dtype``. The rope part is stored
    as bf16. A NaN or inf in a tile makes the whole tile read back NaN (nothing checks, so
    nothing syncs with the host).

    Args:
        kv: ``[tokens, 576]`` floating point; V = ``kv[:, :512]``.
        fp8_dtype: the FP8 format (default: the platform's, ``Platform.fp8_dtype``).
        out: optional ``[tokens, 656]`` uint8 to write into (a slice of a pool works).

    Returns:
        ``out``, or a new ``[tokens, 656]`` uint8 tensor on kv's device.
    """
    fp8 = fp8_format(fp8_dtype)
    _check_model_kv("quantize_kv", kv)
    tokens = kv.shape[0]
    if out is None:
        out = torch.empty(tokens, TOKEN_BYTES, dtype=torch.uint8, device=kv.device)
    else:
        check_fp8_kv("quantize_kv(out=)", out)
        if out.shape[0] != tokens or out.dim() != 2:
            raise ValueError(f"quantize_kv: out must be [{tokens}, {TOKEN_BYTES}], got {tuple(out.shape)}")
    nope = kv[:, :D_NOPE].float().reshape(tokens, NUM_TILES, TILE)  # [tokens, 4, 128]
    fmax = torch.finfo(fp8).max
    amax = nope.abs().amax(dim=-1)  # [tokens, 4]
    # The scale stays a normal float32: amax / fmax of a tile of fp32 values below ~1e-43 would
    # underflow to 0, and 0 / 0 then gives NaN for its zeros. A NaN amax (a NaN in the tile) is
    # not == 0, so its scale is NaN and the whole tile reads back NaN, as an inf makes it.
    scale = torch.where(amax == 0, torch.ones_like(amax), (amax / fmax).clamp_min(torch.finfo(torch.float32).tiny))
    # x / (amax / fmax) can round a hair above fmax; clamp before the cast (which would give NaN).
    values = (nope / scale[..., None]).clamp_(-fmax, fmax).to(fp8)
    out[:, :D_NOPE].copy_(values.reshape(tokens, D_NOPE).view(torch.uint8))
    out[:, SCALE_OFFSET:ROPE_OFFSET].copy_(scale.view(torch.uint8))
    out[:, ROPE_OFFSET:].copy_(kv[:, D_NOPE:].to(torch.bfloat16).contiguous().view(torch.uint8))
    return out


def dequantize_kv(kv: torch.Tensor, fp8_dtype: torch.dtype | None = None,
                  dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """656-byte tokens ``kv [..., 656]`` uint8 -> the dequantised cache ``[..., 576]`` in ``dtype``.
    Capturable.

    ``nope[i] = dtype(float32(fp8[i]) * scale[i // 128])``: the product in float32, rounded once
    to ``dtype``; ``rope`` = the stored bf16 values converted to ``dtype``. With ``dtype`` = q's
    dtype (bf16, fp16 or float32) this is the cache every attention path reads (the kernels
    round each value the same way, then multiply as for a plain cache); the float64 reference
    takes it and converts it to float64. ``dtype=float64`` instead computes the product in
    float64: the exact values of the tokens (for measuring the quantiser), which no attention
    path reads. fp16 overflows to inf above 65504. ``fp8_dtype`` is the format the tokens were
    written in (default: the platform's).
    """
    fp8 = fp8_format(fp8_dtype)
    check_fp8_kv("dequantize_kv", kv)
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    lead = kv.shape[:-1]
    nope = kv[..., :D_NOPE].view(fp8).to(compute).unflatten(-1, (NUM_TILES, TILE))
    # The float32 scales are promoted to `compute` by the multiply (exactly), not by a copy of
    # their own: the torch backend dequantises on every call, where each op costs host time.
    scale = kv[..., SCALE_OFFSET:ROPE_OFFSET].view(torch.float32)  # [..., 4]
    nope = (nope * scale[..., None]).reshape(*lead, D_NOPE).to(dtype)  # one rounding to dtype
    rope = kv[..., ROPE_OFFSET:].view(torch.bfloat16).to(dtype)
    return torch.cat([nope, rope], dim=-1)


def write_kv_fp8_(pool: torch.Tensor, slots: torch.Tensor, kv: torch.Tensor,
                  fp8_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Quantise ``kv [n, 576]`` and write it into rows ``slots [n]`` of ``pool [pool_tokens, 656]``
    uint8, in place. Capturable (no host sync, static shapes): engines call it in decode graphs.

    A slot outside ``[0, pool_tokens)`` (−1: an inert padding row of a graph bucket) is skipped.
    Without a host sync it cannot be dropped from the scatter, so it is sent to a row that is
    written anyway, with that row's bytes (the first written slot; or row 0 with its own bytes
    when no slot is valid): duplicate writes of equal bytes agree whatever their order. Distinct
    valid slots must be distinct rows (as in any KV write). Returns ``pool``.
    """
    check_fp8_kv("write_kv_fp8_", pool)
    if pool.dim() != 2:
        raise ValueError(f"write_kv_fp8_: pool must be [pool_tokens, {TOKEN_BYTES}], got {tuple(pool.shape)}")
    if slots.dim() != 1 or slots.shape[0] != kv.shape[0] or slots.is_floating_point():
        raise ValueError(
            f"write_kv_fp8_: slots must be integer [n={kv.shape[0]}], got {tuple(slots.shape)} {slots.dtype}"
        )
    if not kv.shape[0]:
        return pool
    tokens = quantize_kv(kv, fp8_dtype)  # [n, 656]
    slots = slots.long()
    valid = (slots >= 0) & (slots < pool.shape[0])  # [n]
    # index_select, not slots[first]: indexing with a 0-d tensor reads it back to the host.
    first = valid.int().argmax().view(1)  # the first valid slot (index 0 when none is)
    any_valid = valid.any()
    fallback_slot = torch.where(any_valid, slots.index_select(0, first), 0)  # [1]
    fallback_bytes = torch.where(any_valid, tokens.index_select(0, first), pool[:1])  # [1, 656]
    target = torch.where(valid, slots, fallback_slot)
    pool.index_copy_(0, target, torch.where(valid[:, None], tokens, fallback_bytes))
    return pool
