"""Random compressor inputs at the published widths, shared by kernels_attention.py and tune_compressor_decode.py.

`rope_table` is the compress RoPE table (cos, sin) on the GPU; `inputs` draws x, wkv, wgate, the two
RMSNorm weights and the indexer key's wk (bf16, weights scaled by 1/sqrt(fan-in)) plus the entries'
positions and cache rows; `bufs` allocates the outputs (KV codes, KV scales, index codes, index scales,
latent); `call` binds one `compress` / `compress_ref` call over them.
"""
from __future__ import annotations

import math

import torch

DEV = "cuda"
D, C, CI = 5120, 512, 128  # hidden, compressed KV width, indexer head width


def rope_table(P=1 << 16, n=32, theta=160000.0):
    inv = 1.0 / (theta ** (torch.arange(n, dtype=torch.float64, device=DEV) / n))
    ang = torch.arange(P, dtype=torch.float64, device=DEV)[:, None] * inv[None]
    return torch.cos(ang).float(), torch.sin(ang).float()


def inputs(ratio, T, pos0=0):
    """T tokens -> J = T // ratio compressed entries at positions pos0, pos0 + ratio, ..."""
    x = torch.randn(T, D, device=DEV).to(torch.bfloat16)
    wkv = (torch.randn(C, D, device=DEV) / math.sqrt(D)).to(torch.bfloat16)
    wg = (torch.randn(C, D, device=DEV) / math.sqrt(D)).to(torch.bfloat16)
    nw = (1 + 0.1 * torch.randn(C, device=DEV)).to(torch.bfloat16)
    wk = (torch.randn(CI, C, device=DEV) / math.sqrt(C)).to(torch.bfloat16)
    knw = (1 + 0.1 * torch.randn(CI, device=DEV)).to(torch.bfloat16)
    J = T // ratio
    pos = torch.arange(J, dtype=torch.int32, device=DEV) * ratio + pos0
    rows = torch.arange(J, dtype=torch.int32, device=DEV)
    return dict(x=x, wkv=wkv, wg=wg, nw=nw, wk=wk, knw=knw, pos=pos, rows=rows, J=J)


def bufs(ratio, J):
    def u8(n):
        return torch.zeros(J, n, dtype=torch.uint8, device=DEV)
    return (u8(C // 2), u8(C // 16), u8(CI // 2), u8(CI // 32),
            torch.zeros(J, C, dtype=torch.bfloat16 if ratio == 1 else torch.float32, device=DEV))


def call(fn, ratio, a, cos, sin, o, **kw):
    return lambda: fn(a["x"], a["wkv"], a["nw"], cos, sin, a["pos"], a["rows"], o[0], o[1], ratio=ratio,
                      wgate=a["wg"] if ratio == 2 else None, latent_out=o[4], wk=a["wk"], k_norm_w=a["knw"],
                      idx_cache=o[2], idx_scale=o[3], **kw)
