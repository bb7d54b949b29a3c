"""megamoe.reference (the C CPU reference) against the contract written out
in numpy here (contract.py), bitwise; the rank-split invariance; the checker
through the binding; and planted errors that each check must catch."""

import math

import numpy as np
import pytest

import contract
import megamoe


def cfg_of(H=256, I=256, E=4, K=2, T=16, G=128, clamp=None, num_ranks=1):
    return megamoe.Config(hidden=H, intermediate=I, num_experts=E, top_k=K, max_tokens_per_rank=T, quant_group=G,
                          swiglu_clamp=clamp)


def run_reference(p, num_ranks=1, **over):
    x, x_sf, idx, w = p.inputs()
    args = dict(x=x, x_sf=x_sf, topk_idx=idx, topk_w=w)
    args.update(over)
    return megamoe.reference(p.cfg, **args, w1=p.w1, w1_sf=p.w1_sf, w2=p.w2, w2_sf=p.w2_sf, num_ranks=num_ranks)


# ---- the number formats of the contract, checked on their own ----------------

def test_e4m3_encoder_round_trips_and_rounds_to_nearest_even():
    codes = np.arange(256, dtype=np.uint8)
    values = contract.e4m3_decode(codes)
    finite = ~np.isnan(values)
    assert (contract.e4m3_encode(values[finite].astype(np.float32)) == codes[finite]).all()
    # Against a brute-force nearest search (ties to the even code) on random and midpoint inputs.
    pos = np.unique(values[finite & (values >= 0)])
    rng = np.random.default_rng(5)
    probes = np.concatenate([(pos[:-1] + pos[1:]) / 2, rng.uniform(0, 470, 4000), rng.uniform(0, 2 ** -5, 2000)])
    probes = probes.astype(np.float32).astype(np.float64)
    for v in probes:
        if v >= 448:
            want = 448.0
        else:
            dist = np.abs(pos - v)
            best = np.flatnonzero(dist == dist.min())
            codes_best = [int(contract.e4m3_encode(np.float32(pos[b]))) for b in best]
            want = pos[best[np.argmin([c & 1 for c in codes_best])]] if len(best) > 1 else pos[best[0]]
        got = contract.e4m3_decode(contract.e4m3_encode(np.float32(v)))
        assert got == want, (v, got, want)
    special = np.array([np.inf, -np.inf, np.nan, -0.0, 1e30], np.float32)
    assert contract.e4m3_encode(special).tolist() == [0x7E, 0xFE, 0x7F, 0x80, 0x7E]


def test_bf16_encoder():
    a = np.array([1.0, 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, -2.5, np.inf, np.nan, 3.4e38], np.float32)
    got = contract.bf16_encode(a)
    assert got.tolist() == [0x3F80, 0x3F80, 0x3F82, 0xC020, 0x7F80, 0x7FFF, 0x7F80]
    assert (contract.bf16_decode(got[:4]) == np.array([1.0, 1.0, 1.0 + 2 ** -6, -2.5], np.float32)).all()


# ---- the reference through the binding against the contract -------------------

CASES = [dict(), dict(G=64), dict(clamp=0.75), dict(K=3, E=8, G=64, clamp=2.0), dict(H=384, I=128, K=1),
         dict(T=40, E=8, K=4)]


@pytest.mark.parametrize("case", CASES, ids=[",".join(f"{k}={v}" for k, v in c.items()) or "base" for c in CASES])
def test_reference_equals_the_contract_bitwise(case):
    cfg = cfg_of(**case)
    p = contract.Problem(cfg, cfg.max_tokens_per_rank, seed=11 + len(case))
    y = run_reference(p)
    want = contract.layer_forward(cfg, *p.inputs(), *p.weights())
    assert y.dtype == np.uint16 and y.shape == (cfg.max_tokens_per_rank, cfg.hidden)
    assert (p.topk_idx < 0).any() and (p.topk_idx >= 0).any(), "the problem should mix live and masked slots"
    assert np.abs(contract.bf16_decode(y)).max() > 0.01, "outputs should not be trivially zero"
    assert np.array_equal(y, want), f"{np.count_nonzero(y != want)} elements differ from the contract"
    # The C checker agrees with itself (and says so in words).
    result = megamoe.check_output(y, want, p.topk_idx)
    assert result and result.max_rel_err == 0.0 and result.summary.startswith("PASS")


def test_int64_indices_and_masked_tokens():
    cfg = cfg_of(T=12)
    p = contract.Problem(cfg, 12, seed=3)
    p.topk_idx[4] = -1  # a token with every slot masked: its row must be exactly +0
    p.topk_w[4] = np.nan
    y32 = run_reference(p)
    y64 = run_reference(p, topk_idx=p.topk_idx.astype(np.int64))
    assert np.array_equal(y32, y64)
    assert (y32[4] == 0).all()
    assert np.array_equal(y32, contract.layer_forward(cfg, *p.inputs(), *p.weights()))


def test_rank_split_does_not_change_the_numbers():
    cfg = cfg_of(E=8, T=24)
    p = contract.Problem(cfg, 24, seed=21)
    y1 = run_reference(p, num_ranks=1)
    for R in (2, 4, 8):
        per_rank = [p.rank_weights(r, R) for r in range(R)]
        y = megamoe.reference(cfg, *p.inputs(), w1=[w[0] for w in per_rank], w1_sf=[w[1] for w in per_rank],
                              w2=[w[2] for w in per_rank], w2_sf=[w[3] for w in per_rank], num_ranks=R)
        assert np.array_equal(y, y1), R


def test_zero_tokens():
    cfg = cfg_of()
    p = contract.Problem(cfg, 0, seed=1)
    y = run_reference(p)
    assert y.shape == (0, cfg.hidden)


# ---- planted errors: each comparison must be able to fail ---------------------

def test_a_wrong_routing_weight_fails_both_comparisons():
    cfg = cfg_of(T=48)
    p = contract.Problem(cfg, 48, seed=7, mask_ratio=0.0)
    y_ref = run_reference(p)
    bad_w = p.topk_w.copy()
    bad_w[9, 1] *= 1.5  # one slot of one token
    y_bad = run_reference(p, topk_w=bad_w)
    # The contract computed with the true weight no longer matches bitwise...
    want = contract.layer_forward(cfg, *p.inputs(), *p.weights())
    assert np.array_equal(y_ref, want)
    assert not np.array_equal(y_bad, want)
    assert set(np.nonzero(y_bad != want)[0].tolist()) == {9}, "only token 9 should differ"
    # ...and the per-token checker fails at that token.
    result = megamoe.check_output(y_bad, y_ref, p.topk_idx)
    assert not result
    assert result.first_failure in ("row rel err", "row max abs/scale")
    assert result.first_failure_token == 9 and result.tokens_failed == 1
    assert "FAIL" in result.summary and "token 9" in result.summary


def test_the_checker_catches_planted_faults():
    cfg = cfg_of(T=40)
    p = contract.Problem(cfg, 40, seed=8)
    p.topk_idx[3] = -1
    y_ref = run_reference(p)
    ok = megamoe.check_output(y_ref, y_ref, p.topk_idx)
    masked = int((p.topk_idx < 0).all(axis=1).sum())
    assert masked >= 1
    assert ok.passed and ok.tokens_masked == masked and ok.tokens_checked == 40 and ok.diff_judged
    assert ok.diff == 0.0 and ok.diff_min_tokens == 32
    live = [t for t in range(40) if (p.topk_idx[t] >= 0).any()]

    def fails(y, why, token):
        r = megamoe.check_output(y, y_ref, p.topk_idx)
        assert not r.passed and r.first_failure == why and r.first_failure_token == token, r.summary

    y = y_ref.copy()
    y[3, 5] = contract.bf16_encode(np.float32(1e-3))      # a masked token not exactly zero
    fails(y, "all slots masked but y != 0", 3)
    y = y_ref.copy()
    y[live[2], 7] = 0x7FC0                                 # a NaN
    fails(y, "NaN/Inf in y", live[2])
    y = y_ref.copy()
    y[live[4]] = 0                                         # a zeroed row
    fails(y, "row rel err", live[4])
    y = y_ref.copy()
    y[live[5]] = y_ref[live[6]]                            # a neighbour's row
    fails(y, "row rel err", live[5])
    # A bounds override: loose bounds let a scaled row through, the defaults do not.
    y = contract.bf16_encode(contract.bf16_decode(y_ref) * np.float32(1.05))
    assert not megamoe.check_output(y, y_ref, p.topk_idx)
    loose = megamoe.check_output(y, y_ref, p.topk_idx, bounds={"row_rel_err": 0.5, "row_abs_over_scale": 2.0,
                                                                "diff": 0.01})
    assert loose.passed and loose.bounds.row_rel_err == 0.5 and loose.bounds.scale_floor == 1e-6


# ---- argument checks ----------------------------------------------------------

def test_reference_argument_errors_name_the_argument():
    cfg = cfg_of(T=8)
    p = contract.Problem(cfg, 8, seed=2)
    bad_idx = p.topk_idx.copy()
    bad_idx[2, 1] = cfg.num_experts
    text = r"args->topk_idx\[5\] \(token 2, slot 1\) = 4: outside \[-1, 4\)"
    with pytest.raises(megamoe.BadTopkIndexError, match=text):
        run_reference(p, topk_idx=bad_idx)
    with pytest.raises(megamoe.BadTopkIndexError, match="= -2"):
        run_reference(p, topk_idx=np.full_like(p.topk_idx, -2, dtype=np.int64))
    big = contract.Problem(cfg, 9, seed=2)
    with pytest.raises(megamoe.TooManyTokensError, match="args->num_tokens = 9: above max_tokens_per_rank = 8"):
        run_reference(big)
    cases = [
        (dict(x_sf=p.x_sf.astype(np.float64)), "x_sf: dtype float64, expected float32"),
        (dict(x=p.x.astype(np.int16)), "x: dtype int16, expected uint8"),
        (dict(x_sf=p.x_sf[:, :1]), "x_sf: shape (8, 1), expected (8, 2)"),
        (dict(topk_idx=p.topk_idx[:7]), "topk_idx: shape (7, 2), expected (8, 2)"),
        (dict(topk_idx=p.topk_idx.astype(np.float32)), "topk_idx: dtype float32"),
        (dict(topk_w=p.topk_w[:, :1]), "topk_w: shape (8, 1)"),
        (dict(x="tokens"), "x: a str is not an array"),
    ]
    for over, text in cases:
        with pytest.raises(megamoe.BadArgumentError) as e:
            run_reference(p, **over)
        assert text in str(e.value), (over.keys(), str(e.value))
    x, x_sf, idx, w = p.inputs()
    with pytest.raises(megamoe.BadArgumentError, match=r"w1: shape \(3, 512, 256\), expected \(4, 512, 256\)"):
        megamoe.reference(cfg, x, x_sf, idx, w, p.w1[:3], p.w1_sf, p.w2, p.w2_sf)
    with pytest.raises(megamoe.BadArgumentError, match="w2: 3 per-rank arrays, expected num_ranks = 2"):
        megamoe.reference(cfg, x, x_sf, idx, w, p.w1, p.w1_sf, [p.w2[:2]] * 3, p.w2_sf, num_ranks=2)
    with pytest.raises(megamoe.BadArgumentError, match=r"w2_sf\[1\]: shape"):
        megamoe.reference(cfg, x, x_sf, idx, w, p.w1, p.w1_sf, p.w2, [p.w2_sf[:2], p.w2_sf[:1]], num_ranks=2)
    with pytest.raises(megamoe.BadExpertsError, match="not divisible by the rank count 3"):
        megamoe.reference(cfg, x, x_sf, idx, w, *p.weights(), num_ranks=3)


def test_check_output_argument_errors():
    y = np.zeros((4, 256), np.uint16)
    idx = np.zeros((4, 2), np.int32)
    with pytest.raises(megamoe.BadArgumentError, match=r"y_ref: shape \(4, 128\), expected \(4, 256\)"):
        megamoe.check_output(y, y[:, :128], idx)
    with pytest.raises(megamoe.BadArgumentError, match="y: dtype float32, expected uint16"):
        megamoe.check_output(y.astype(np.float32), y, idx)
    with pytest.raises(megamoe.BadArgumentError, match=r"topk_idx: shape \(3, 2\)"):
        megamoe.check_output(y, y, idx[:3])
    with pytest.raises(megamoe.BadArgumentError, match=r"bounds->diff = -1: must be positive and finite"):
        megamoe.check_output(y, y, idx, bounds={"diff": -1.0})
    with pytest.raises(megamoe.BadArgumentError, match=r"bounds->row_rel_err = nan"):
        megamoe.check_output(y, y, idx, bounds=megamoe.CheckBounds(math.nan, 1, 1, 1))
    with pytest.raises(megamoe.BadArgumentError, match="bounds: a CheckBounds or a dict"):
        megamoe.check_output(y, y, idx, bounds=0.1)
