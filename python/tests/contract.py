"""The numerics contract of docs/DESIGN.md section 1, written out again in
numpy float64 for the tests, independently of the C reference, and random
problems to feed it.

Bitwise agreement with the C reference is expected, not just closeness: every
block sum of e4m3 products is exact in float64 whatever the order (each
product has at most 8 significant bits and is a multiple of 2^-18, a 128-term
sum stays below 2^25), the scale products are exact, and the remaining steps
(the scaled block sums added in ascending block order, float32 and bf16
roundings, float32 division and accumulation) are IEEE operations numpy
performs as C does. exp is Python's math.exp (the C library's exp, the one
the reference calls), not numpy's own.
"""

import math

import numpy as np

E4M3_MAX = 448.0


def _e4m3_table():
    codes = np.arange(256)
    exponent = (codes >> 3) & 0xF
    mantissa = (codes & 7).astype(np.float64)
    value = np.where(exponent == 0, mantissa / 8.0 * 2.0 ** -6, (1.0 + mantissa / 8.0) * 2.0 ** (exponent - 7.0))
    value = np.where(codes & 0x80, -value, value)
    value[(codes & 0x7F) == 0x7F] = np.nan  # e4m3fn: no infinity, 0x7F / 0xFF are NaN
    return value


E4M3_VALUES = _e4m3_table()


def e4m3_decode(codes):
    return E4M3_VALUES[np.asarray(codes, dtype=np.uint8)]


def e4m3_encode(a):
    """float32 -> e4m3fn codes: round to nearest, ties to even; finite overflow
    and +-inf saturate to +-448; NaN -> 0x7F; the sign of zero kept."""
    a = np.asarray(a, dtype=np.float32)
    mag = np.abs(a.astype(np.float64))
    finite_mag = np.where(np.isfinite(mag), mag, 0.0)
    _, ex = np.frexp(finite_mag)           # mag = f * 2^ex, f in [0.5, 1)
    e = ex.astype(np.int64) - 1             # mag in [2^e, 2^(e+1))
    q = np.rint(finite_mag / np.ldexp(1.0, e - 3)).astype(np.int64)  # 3 mantissa bits: q in [8, 16]
    carry = q == 16
    e = np.where(carry, e + 1, e)
    q = np.where(carry, 8, q)
    normal = ((e + 7) << 3) | (q - 8)
    subnormal = np.rint(np.minimum(finite_mag, 2.0 ** -6) / 2.0 ** -9).astype(np.int64)  # steps of 2^-9; 8: 2^-6
    code = np.where(finite_mag < 2.0 ** -6, subnormal, normal)
    code = np.where(mag >= E4M3_MAX, 0x7E, code)  # saturating (covers +-inf)
    code = code | np.where(np.signbit(a), 0x80, 0)
    code = np.where(np.isnan(a), 0x7F, code)
    return code.astype(np.uint8)


def bf16_encode(a):
    """float32 -> bf16 bits: round to nearest, ties to even; NaN -> 0x7FFF."""
    a = np.asarray(a, dtype=np.float32)
    bits = a.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(a), np.uint16(0x7FFF), rounded).astype(np.uint16)


def bf16_decode(bits):
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def quantize_groups(a, group):
    """Per `group` contiguous columns of float32 rows: amax over the non-NaN
    elements, sf = max(amax, 1e-10) / 448 and q = e4m3(a / sf), both divisions
    in float32."""
    a = np.asarray(a, dtype=np.float32)
    rows, cols = a.shape
    blocks = a.reshape(rows, cols // group, group)
    amax = np.where(np.isnan(blocks), np.float32(0), np.abs(blocks)).max(axis=2)
    sf = np.maximum(amax, np.float32(1e-10)) / np.float32(E4M3_MAX)
    q = e4m3_encode(blocks / sf[:, :, None])
    return q.reshape(rows, cols), sf.astype(np.float32)


def _exp(v):
    return math.exp(v) if v < 709.0 else math.inf


_vexp = np.vectorize(_exp, otypes=[np.float64])


def _block_scaled(a_dec, a_sf, b_dec, b_sf, block):
    """out[m, n] = float32(sum over K blocks kb, ascending, of
    (a_sf[m, kb] * b_sf[n / 128, kb * block / 128]) * S(m, n, kb)), S exact."""
    rows, depth = a_dec.shape
    cols = b_dec.shape[0]
    acc = np.zeros((rows, cols))
    col_block = np.arange(cols) // 128
    for kb in range(depth // block):
        lo, hi = kb * block, (kb + 1) * block
        s = a_dec[:, lo:hi] @ b_dec[:, lo:hi].T
        scale = a_sf[:, kb].astype(np.float64)[:, None] * b_sf[col_block, lo // 128].astype(np.float64)[None, :]
        acc = acc + scale * s
    return acc.astype(np.float32)


def layer_forward(cfg, x, x_sf, topk_idx, topk_w, w1, w1_sf, w2, w2_sf):
    """y (bf16 bits) of T tokens. cfg: hidden, intermediate, top_k, quant_group,
    swiglu_clamp (None or c). Weights of every expert: w1 [E, 2I, H] codes,
    w1_sf [E, 2I/128, H/128], w2 [E, H, I] codes, w2_sf [E, H/128, I/128]."""
    H, I, K, G = cfg.hidden, cfg.intermediate, cfg.top_k, cfg.quant_group
    T = x.shape[0]
    idx = np.asarray(topk_idx, dtype=np.int64)
    x_dec = e4m3_decode(x)
    slot_out = np.zeros((T, K, H), dtype=np.uint16)
    for e in sorted(set(idx[idx >= 0].tolist())):
        tokens, slots = np.nonzero(idx == e)
        # L1 with 128-wide K blocks.
        h = _block_scaled(x_dec[tokens], x_sf[tokens], e4m3_decode(w1[e]), w1_sf[e], 128)
        # SwiGLU with the clamp, times the routing weight (before quantization).
        g, u = h[:, :I], h[:, I:]
        if cfg.swiglu_clamp is not None:
            c = np.float32(cfg.swiglu_clamp)
            g = np.where(g > c, c, g)
            u = np.where(u > c, c, np.where(u < -c, -c, u))
        gd = g.astype(np.float64)
        weight = topk_w[tokens, slots].astype(np.float64)[:, None]
        act = (((gd / (1.0 + _vexp(-gd))) * u.astype(np.float64)) * weight).astype(np.float32)
        # Per-G e4m3 quantization, then L2 with G-wide K blocks.
        q, q_sf = quantize_groups(act, G)
        o = _block_scaled(e4m3_decode(q), q_sf, e4m3_decode(w2[e]), w2_sf[e], G)
        slot_out[tokens, slots] = bf16_encode(o)
    # Combine: float32 sum of the live slots in slot order, then bf16.
    acc = np.zeros((T, H), dtype=np.float32)
    for k in range(K):
        live = idx[:, k] >= 0
        acc[live] = acc[live] + bf16_decode(slot_out[live, k])
    return bf16_encode(acc)


class Problem:
    """A random layer problem: weights of all experts, one rank's tokens."""

    def __init__(self, cfg, num_tokens, seed, mask_ratio=0.2, repeat_experts=True, weight_seed=None):
        H, I, E, K = cfg.hidden, cfg.intermediate, cfg.num_experts, cfg.top_k
        wg = np.random.default_rng(seed if weight_seed is None else weight_seed)
        g = np.random.default_rng([seed, 1])
        self.cfg = cfg
        # Weights in the fp8 range with block scales that make each effective
        # weight ~ N(0, 1/depth): activations stay O(1).
        self.w1, self.w1_sf = self._weights(wg, E, 2 * I, H)
        self.w2, self.w2_sf = self._weights(wg, E, H, I)
        # Tokens quantized the way a producer does: per 128 channels, sf = amax / 448.
        self.x, self.x_sf = quantize_groups(g.standard_normal((num_tokens, H)).astype(np.float32), 128)
        idx = np.empty((num_tokens, K), dtype=np.int32)
        for t in range(num_tokens):
            idx[t] = g.permutation(E)[:K]
        w = (0.05 + g.random((num_tokens, K))).astype(np.float32)
        if repeat_experts and K >= 2:
            idx[0::3, 1] = idx[0::3, 0]          # two slots on one expert
        masked = g.random((num_tokens, K)) < mask_ratio
        idx[masked] = -1
        w[masked] = np.nan                      # nothing may read a masked slot's weight
        self.topk_idx, self.topk_w = idx, w

    @staticmethod
    def _weights(g, experts, rows, cols):
        codes = e4m3_encode((g.standard_normal((experts, rows, cols)) * 64.0).astype(np.float32))
        sf = ((0.5 + g.random((experts, rows // 128, cols // 128))) / 64.0 / math.sqrt(cols)).astype(np.float32)
        return codes, sf

    def weights(self):
        return self.w1, self.w1_sf, self.w2, self.w2_sf

    def rank_weights(self, rank, num_ranks):
        El = self.cfg.num_experts // num_ranks
        return tuple(w[rank * El:(rank + 1) * El] for w in self.weights())

    def inputs(self):
        return self.x, self.x_sf, self.topk_idx, self.topk_w
