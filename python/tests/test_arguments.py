"""The argument checks of forward() and prepare_weights(), on stand-in device
tensors (fakes.py): each bad argument raises BadArgumentError naming it, before
any CUDA call; good arguments pass every check and reach the C call, which
refuses the test's NULL layer (NullPointerError, "layer is NULL")."""

import sys

import numpy as np
import pytest

import megamoe
from fakes import BASE, DL_BFLOAT, DL_FLOAT, DL_FLOAT8_E4M3FN, DL_UINT, FakeCAI, FakeDLPack

H, I, E, K, TMAX = 256, 384, 8, 2, 64
CFG = dict(hidden=H, intermediate=I, num_experts=E, top_k=K, max_tokens_per_rank=TMAX)
T = 5


@pytest.fixture
def layer():
    return megamoe.Layer._for_argument_checks(CFG, world_size=2, device=0)


def good_args(T=T):
    return dict(x=FakeCAI((T, H), "|u1", BASE), x_sf=FakeCAI((T, H // 128), "<f4", BASE + 0x10000),
                topk_idx=FakeCAI((T, K), "<i4", BASE + 0x20000), topk_w=FakeCAI((T, K), "<f4", BASE + 0x30000),
                out=FakeCAI((T, H), "<u2", BASE + 0x40000))


def reaches_c(call):
    with pytest.raises(megamoe.NullPointerError, match="layer is NULL"):
        call()


def test_good_arguments_reach_the_c_layer(layer):
    reaches_c(lambda: layer.forward(**good_args(), stream=0))
    # int64 indices, a token bound, an explicit stream handle, zero tokens.
    args = good_args()
    args["topk_idx"] = FakeCAI((T, K), "<i8", BASE + 0x20000)
    reaches_c(lambda: layer.forward(**args, num_tokens_bound=TMAX, stream=0x1234))
    reaches_c(lambda: layer.forward(**good_args(0), stream=0))
    # More tokens than T_max pass the binding: the C layer owns that check.
    reaches_c(lambda: layer.forward(**good_args(TMAX + 1), stream=0))


def test_dlpack_tensors_with_fp8_and_bf16_types(layer):
    x = FakeDLPack((T, H), DL_FLOAT8_E4M3FN, 8)
    out = FakeDLPack((T, H), DL_BFLOAT, 16, ptr=BASE + 0x40000)
    args = {**good_args(), "x": x, "out": out}
    reaches_c(lambda: layer.forward(**args, stream=0))
    assert x.streams == [1], "the legacy default stream (0) is DLPack's 1"
    reaches_c(lambda: layer.forward(**args, stream=0x5000))
    assert x.streams[-1] == 0x5000 and out.streams[-1] == 0x5000


# (argument, replacement, text the message must hold)
BAD_FORWARD = [
    ("x", FakeCAI((T, H), "<f4"), "x: dtype float32, expected float8_e4m3fn or uint8"),
    ("x", FakeCAI((T * H,), "|u1"), f"x: shape ({T * H},), expected (*, {H})"),
    ("x", FakeCAI((T, H + 128), "|u1"), f"x: shape ({T}, {H + 128}), expected (*, {H})"),
    ("x", FakeCAI((T, H), "|u1", strides=(2 * H, 1)), "x: not contiguous"),
    ("x", FakeCAI((H, T), "|u1", strides=(1, H)), f"x: shape ({H}, {T})"),
    ("x", np.zeros((T, H), np.uint8), "x: in cpu memory"),
    ("x", [[0] * H] * T, "x: a list is not a device tensor"),
    ("x", FakeDLPack((T, H), DL_FLOAT8_E4M3FN, 8, device_id=1), "x: on cuda:1, the layer runs on cuda:0"),
    ("x", FakeDLPack((T, H), DL_FLOAT8_E4M3FN, 8, device_type=1), "x: in cpu memory"),
    ("x", FakeDLPack((T, H), DL_FLOAT8_E4M3FN, 8, strides=(1, T)), "x: not contiguous"),
    ("x_sf", FakeCAI((T, H // 64), "<f4"), f"x_sf: shape ({T}, {H // 64}), expected ({T}, {H // 128})"),
    ("x_sf", FakeCAI((T + 1, H // 128), "<f4"), f"x_sf: shape ({T + 1}, {H // 128}), expected ({T}, {H // 128})"),
    ("x_sf", FakeCAI((T, H // 128), "<f8"), "x_sf: dtype float64, expected float32"),
    ("x_sf", FakeCAI((T, H // 128), "<f4", BASE + 2), "x_sf: address 0x7f3a00000002 is not 4-byte aligned"),
    ("topk_idx", FakeCAI((T, K), "<i2"), "topk_idx: dtype int16, expected int32 or int64"),
    ("topk_idx", FakeCAI((T, K), "<f4"), "topk_idx: dtype float32"),
    ("topk_idx", FakeCAI((T, K + 1), "<i4"), f"topk_idx: shape ({T}, {K + 1}), expected ({T}, {K})"),
    ("topk_idx", FakeCAI((T, K), "<i8", BASE + 4), "topk_idx: address 0x7f3a00000004 is not 8-byte aligned"),
    ("topk_idx", FakeDLPack((T, K), DL_UINT, 32), "topk_idx: dtype uint32"),
    ("topk_w", FakeCAI((T, K), "<f2"), "topk_w: dtype float16, expected float32"),
    ("topk_w", FakeCAI((T,), "<f4"), f"topk_w: shape ({T},), expected ({T}, {K})"),
    ("out", FakeCAI((T, H), "<f4"), "out: dtype float32, expected bfloat16 or uint16 or int16"),
    ("out", FakeCAI((T, H // 2), "<u2"), f"out: shape ({T}, {H // 2}), expected ({T}, {H})"),
    ("out", FakeCAI((T, H), "<u2", BASE + 8), "out: address 0x7f3a00000008 is not 16-byte aligned"),
    ("out", FakeCAI((T, H), "<u2", readonly=True), "out: read-only"),
    ("out", FakeDLPack((T, H), DL_FLOAT, 16), "out: dtype float16"),
]


@pytest.mark.parametrize("name,value,text", BAD_FORWARD, ids=[c[2][:40] for c in BAD_FORWARD])
def test_forward_refuses_a_bad_argument_by_name(layer, name, value, text):
    args = {**good_args(), name: value}
    with pytest.raises(megamoe.BadArgumentError) as e:
        layer.forward(**args, stream=0)
    assert text in str(e.value)
    # Refused in the binding, which still enqueued the empty forward that keeps
    # the peers in step (here refused by the C layer: NULL layer), and will say so at sync.
    assert layer._binding_rejects and text in layer._binding_rejects[-1]


def test_forward_refuses_bad_options(layer):
    for bound, text in ((-1, "num_tokens_bound = -1"), ("8", "num_tokens_bound = '8'"),
                        (True, "num_tokens_bound = True")):
        with pytest.raises(megamoe.BadArgumentError, match=text):
            layer.forward(**good_args(), num_tokens_bound=bound, stream=0)
    for stream, text in (("s", "stream: a str is not a CUDA stream"), (-1, "stream: -1 is not a stream handle"),
                         (True, "stream: True")):
        with pytest.raises(megamoe.BadArgumentError, match=text):
            layer.forward(**good_args(), stream=stream)


def test_forward_needs_torch_to_allocate_out(layer, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    args = good_args()
    del args["out"]
    with pytest.raises(megamoe.BadArgumentError, match="out: None needs torch to allocate the output"):
        layer.forward(**args, stream=0)


def test_the_first_check_that_fails_is_reported(layer):
    args = {**good_args(), "x_sf": FakeCAI((T, 1), "<f8"), "out": FakeCAI((T, H), "<f4")}
    with pytest.raises(megamoe.BadArgumentError, match="x_sf: dtype float64"):
        layer.forward(**args, stream=0)


El = E // 2


def good_weights():
    return dict(w1=FakeCAI((El, 2 * I, H), "|u1", BASE),
                w1_sf=FakeCAI((El, 2 * I // 128, H // 128), "<f4", BASE + 0x100000),
                w2=FakeCAI((El, H, I), "|u1", BASE + 0x200000),
                w2_sf=FakeCAI((El, H // 128, I // 128), "<f4", BASE + 0x300000))


def test_good_weights_reach_the_c_layer(layer):
    reaches_c(lambda: layer.prepare_weights(**good_weights(), stream=0))
    reaches_c(lambda: layer.prepare_weights(**good_weights(), in_place=True, stream=0))
    w = {**good_weights(), "w1": FakeDLPack((El, 2 * I, H), DL_FLOAT8_E4M3FN, 8)}
    reaches_c(lambda: layer.prepare_weights(**w, stream=0))


BAD_WEIGHTS = [
    ("w1", FakeCAI((El, I, H), "|u1"), f"w1: shape ({El}, {I}, {H}), expected ({El}, {2 * I}, {H})"),
    ("w1", FakeCAI((E, 2 * I, H), "|u1"), f"w1: shape ({E}, {2 * I}, {H}), expected ({El}, {2 * I}, {H})"),
    ("w1", FakeCAI((El, 2 * I, H), "|i1"), "w1: dtype int8"),
    ("w1", FakeCAI((El, 2 * I, H), "|u1", BASE + 8), "w1: address 0x7f3a00000008 is not 16-byte aligned"),
    ("w1_sf", FakeCAI((El, 2 * I // 128, H // 128), "<f8"), "w1_sf: dtype float64"),
    ("w1_sf", FakeCAI((El, H // 128, 2 * I // 128), "<f4"), "w1_sf: shape"),
    ("w2", FakeCAI((El, I, H), "|u1"), f"w2: shape ({El}, {I}, {H}), expected ({El}, {H}, {I})"),
    ("w2_sf", FakeCAI((El, H // 128, I // 128), "<f4", BASE + 2), "w2_sf: address 0x7f3a00000002 is not 4-byte"),
    ("w2", np.zeros((El, H, I), np.uint8), "w2: in cpu memory"),
]


@pytest.mark.parametrize("name,value,text", BAD_WEIGHTS, ids=[c[2][:40] for c in BAD_WEIGHTS])
def test_prepare_weights_refuses_a_bad_weight_by_name(layer, name, value, text):
    with pytest.raises(megamoe.BadArgumentError) as e:
        layer.prepare_weights(**{**good_weights(), name: value}, stream=0)
    assert text in str(e.value)


def test_in_place_weights_must_be_writable_and_16_byte_aligned(layer):
    w = {**good_weights(), "w1": FakeCAI((El, 2 * I, H), "|u1", readonly=True)}
    reaches_c(lambda: layer.prepare_weights(**w, stream=0))  # the copying mode only reads w1
    with pytest.raises(megamoe.BadArgumentError, match="w1: read-only"):
        layer.prepare_weights(**w, in_place=True, stream=0)
    w = {**good_weights(), "w2_sf": FakeCAI((El, H // 128, I // 128), "<f4", BASE + 4)}
    reaches_c(lambda: layer.prepare_weights(**w, stream=0))
    with pytest.raises(megamoe.BadArgumentError, match="w2_sf: address .* is not 16-byte aligned"):
        layer.prepare_weights(**w, in_place=True, stream=0)


def test_sync_names_the_forwards_the_binding_rejected(layer):
    with pytest.raises(megamoe.BadArgumentError):
        layer.forward(**{**good_args(), "x": FakeCAI((T, H), "<f4")}, stream=0)
    with pytest.raises(megamoe.BadArgumentError):
        layer.forward(**{**good_args(), "out": FakeCAI((T, H), "<f4")}, stream=0)
    with pytest.raises(megamoe.NullPointerError) as e:  # the NULL layer's sync, annotated
        layer.sync(stream=0)
    assert "the binding rejected 2 forward(s) since the last sync, the first: forward: x: dtype float32" in str(e.value)
    with pytest.raises(megamoe.NullPointerError) as e:
        layer.sync(stream=0)
    assert "rejected" not in str(e.value), "the count starts again after a sync"


def test_info_and_error_word_of_a_layer(layer):
    d = layer.info()
    assert d["rank"] == 0 and d["device"] == 0 and d["weights_mode"] is None
    want = megamoe.layout(CFG, 2)
    assert {k: v for k, v in d.items() if k in want} == want
    with pytest.raises(megamoe.NullPointerError, match="layer is NULL"):
        layer.error_word()
    with pytest.raises(megamoe.NullPointerError, match="layer is NULL"):
        layer.set_programmatic_launch(True)


class _BrokenProducer:
    def __init__(self, result):
        self.result = result

    def __dlpack_device__(self):
        return (2, 0)

    def __dlpack__(self, stream=None):
        if isinstance(self.result, Exception):
            raise self.result
        return self.result


def test_any_failure_reading_the_arguments_still_keeps_the_peers_in_step(layer):
    with pytest.raises(megamoe.BadArgumentError, match="x: __dlpack__ gave no DLPack tensor capsule"):
        layer.forward(**{**good_args(), "x": _BrokenProducer("not a capsule")}, stream=0)
    with pytest.raises(RuntimeError, match="producer broke"):
        layer.forward(**{**good_args(), "x_sf": _BrokenProducer(RuntimeError("producer broke"))}, stream=0)
    # Both were counted as rejected forwards (an empty forward was enqueued for each).
    assert len(layer._binding_rejects) == 2 and "RuntimeError: producer broke" in layer._binding_rejects[1]
    with pytest.raises(megamoe.BadArgumentError, match="stream: a str"):
        layer.forward(**good_args(), stream="s")
    assert len(layer._binding_rejects) == 3
