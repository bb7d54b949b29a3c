"""Every C status is one exception class carrying the C message; config
errors raise them with the message naming the field; the binding's own
refusals name the argument."""

import re

import pytest

import megamoe
from fakes import gpu_visible
from megamoe import _lib, errors

SMALL = dict(hidden=256, intermediate=256, num_experts=8, top_k=2, max_tokens_per_rank=64)


def _status_names():
    """The C status names, code by code, until the library says unknown."""
    names = {}
    for code in range(1, 1000):
        text = _lib.lib.megamoe_status_string(code).decode()
        name = text.split(":")[0]
        if name == "MEGAMOE_ERR_UNKNOWN":
            return names
        names[code] = name
    raise AssertionError("no end to the status list")


def test_one_class_per_c_status():
    names = _status_names()
    assert sorted(names) == sorted(errors.BY_STATUS), "a status without a class, or a class without a status"
    for code, c_name in names.items():
        cls = errors.BY_STATUS[code]
        assert cls.status == code and cls.status_name == c_name
        words = c_name[len("MEGAMOE_ERR_"):].split("_")
        assert cls.__name__ == "".join(w.capitalize() for w in words) + "Error"
        assert getattr(megamoe, cls.__name__) is cls
        assert issubclass(cls, megamoe.Error)
    assert issubclass(megamoe.TimeoutError, TimeoutError)
    assert issubclass(megamoe.BadArgumentError, ValueError)


def test_an_error_carries_the_c_message():
    with pytest.raises(megamoe.BadShapeError) as e:
        megamoe.Config(**{**SMALL, "hidden": 100}).check()
    err = e.value
    assert err.status == 2 and err.status_name == "MEGAMOE_ERR_BAD_SHAPE"
    assert err.call == "megamoe_check_config"
    assert err.message == "hidden = 100: must be a positive multiple of 128"
    assert str(err) == "megamoe_check_config: hidden = 100: must be a positive multiple of 128 [MEGAMOE_ERR_BAD_SHAPE]"


# (field overrides, num_ranks, expected class, text the message must hold)
CONFIG_CASES = [
    ({"hidden": 100}, 1, megamoe.BadShapeError, "hidden = 100"),
    ({"hidden": 32768}, 1, megamoe.BadShapeError, "hidden = 32768"),
    ({"intermediate": 8192}, 1, megamoe.BadShapeError, "intermediate = 8192"),
    ({"num_experts": 0}, 1, megamoe.BadExpertsError, "num_experts = 0"),
    ({"num_experts": 6}, 4, megamoe.BadExpertsError, "num_experts = 6: not divisible by the rank count 4"),
    ({"top_k": 0}, 1, megamoe.BadTopKError, "top_k = 0"),
    ({"top_k": 9}, 1, megamoe.BadTopKError, "top_k = 9"),
    ({"max_tokens_per_rank": 0}, 1, megamoe.BadMaxTokensError, "max_tokens_per_rank = 0"),
    ({"quant_group": 32}, 1, megamoe.BadQuantGroupError, "quant_group = 32"),
    ({"swiglu_clamp": -1.0}, 1, megamoe.BadClampError, "swiglu_clamp = -1"),
    ({"swiglu_clamp": float("nan")}, 1, megamoe.BadClampError, "swiglu_clamp = nan"),
    ({"swiglu_clamp": 1e39}, 1, megamoe.BadClampError, "swiglu_clamp = inf"),
    ({"arm": 7}, 1, megamoe.BadArmError, "arm = 7"),
    ({}, 9, megamoe.BadRanksError, "num_ranks = 9"),
    ({}, 0, megamoe.BadRanksError, "num_ranks = 0"),
    ({"max_tokens_per_rank": 2 ** 40}, 1, megamoe.SizeOverflowError, "max_tokens_per_rank"),
    ({"timeout_s": float("nan")}, 1, megamoe.BadArgumentError, "timeout_s = nan"),
    ({"pool_imbalance": 0.5}, 2, megamoe.BadArgumentError, "pool_imbalance = 0.5"),
]


@pytest.mark.parametrize("fields,ranks,cls,text", CONFIG_CASES, ids=[c[3] for c in CONFIG_CASES])
def test_config_errors_raise_their_class_naming_the_field(fields, ranks, cls, text):
    cfg = megamoe.Config(**{**SMALL, **fields})
    with pytest.raises(cls) as e:
        cfg.check(ranks)
    assert text in e.value.message
    assert type(e.value) is cls
    # The same error from every entry point that checks a config.
    with pytest.raises(cls):
        megamoe.layout(cfg, ranks)


# Values the C struct cannot hold: refused by the binding, naming the field.
BINDING_CASES = [
    ({"hidden": 2 ** 70}, megamoe.BadArgumentError, "hidden = 1180591620717411303424: does not fit in int64"),
    ({"num_experts": 2 ** 40}, megamoe.BadArgumentError, "num_experts = 1099511627776: does not fit in int32"),
    ({"hidden": "512"}, megamoe.BadArgumentError, "hidden = '512': must be an integer"),
    ({"top_k": 2.0}, megamoe.BadArgumentError, "top_k = 2.0: must be an integer"),
    ({"top_k": True}, megamoe.BadArgumentError, "top_k = True: must be an integer"),
    ({"timeout_s": "soon"}, megamoe.BadArgumentError, "timeout_s = 'soon': must be a number"),
    ({"arm": "fast"}, megamoe.BadArmError, "arm = 'fast': not one of staged, split, fused"),
    ({"arm": 1.5}, megamoe.BadArmError, "arm = 1.5"),
]


@pytest.mark.parametrize("fields,cls,text", BINDING_CASES, ids=[c[2][:30] for c in BINDING_CASES])
def test_unrepresentable_config_values_name_the_field(fields, cls, text):
    with pytest.raises(cls) as e:
        megamoe.Config(**{**SMALL, **fields}).check()
    assert text in e.value.message


def test_config_from_a_dict_and_its_errors():
    assert megamoe.layout(dict(SMALL), 2)["local_experts"] == 4
    with pytest.raises(megamoe.BadArgumentError, match="unknown field"):
        megamoe.layout({**SMALL, "hiden": 256})
    with pytest.raises(megamoe.BadArgumentError, match="config: a megamoe.Config or a dict"):
        megamoe.layout([256, 256])


def test_layer_refuses_a_bad_config_before_any_device_work():
    with pytest.raises(megamoe.BadQuantGroupError, match="quant_group = 48"):
        megamoe.Layer({**SMALL, "quant_group": 48})
    with pytest.raises(megamoe.BadExpertsError, match="num_experts = 8: not divisible by the rank count 3"):
        megamoe.Layer(SMALL, rank=0, world_size=3, unique_id=bytes(128))


def test_layer_checks_rank_world_size_and_unique_id():
    with pytest.raises(megamoe.BadRanksError, match=re.escape("rank = 2: must be in [0, world_size = 2)")):
        megamoe.Layer(SMALL, rank=2, world_size=2, unique_id=bytes(128))
    with pytest.raises(megamoe.BadRanksError, match="world_size = 0"):
        megamoe.Layer(SMALL, rank=0, world_size=0, unique_id=bytes(128))
    with pytest.raises(megamoe.BadArgumentError, match="rank and world_size"):
        megamoe.Layer(SMALL, unique_id=bytes(128))
    with pytest.raises(megamoe.BadArgumentError, match="unique_id: needed with world_size > 1"):
        megamoe.Layer(SMALL, rank=0, world_size=2)
    with pytest.raises(megamoe.BadArgumentError, match="unique_id: 128 bytes .* of 5 bytes"):
        megamoe.Layer(SMALL, rank=0, world_size=2, unique_id=b"12345")
    with pytest.raises(megamoe.BadArgumentError, match="rank = '0': must be an integer"):
        megamoe.Layer(SMALL, rank="0", world_size=2, unique_id=bytes(128))
    with pytest.raises(megamoe.BadArgumentError, match="group: given, but torch.distributed is not initialised"):
        megamoe.Layer(SMALL, group=object())


@pytest.mark.skipif(gpu_visible(), reason="a GPU is visible")
def test_layer_without_a_gpu_raises_no_device():
    with pytest.raises(megamoe.NoDeviceError, match="no CUDA device"):
        megamoe.Layer(SMALL)


def test_c_errors_outside_configs_name_their_argument():
    lib = _lib.lib
    # megamoe_layout: a region array too small.
    cfg = megamoe.Config(**SMALL).to_c()
    import ctypes
    info = _lib.megamoe_layout_info()
    regions = (_lib.megamoe_region * 2)()
    with pytest.raises(megamoe.BadArgumentError, match=r"capacity = 2: the layout has \d+ regions"):
        errors.check(lib.megamoe_layout(ctypes.byref(cfg), 1, ctypes.byref(info), regions, 2), "megamoe_layout")
    with pytest.raises(megamoe.NullPointerError, match="info is NULL"):
        errors.check(lib.megamoe_layout(ctypes.byref(cfg), 1, None, None, 0), "megamoe_layout")
    with pytest.raises(megamoe.NullPointerError, match="unique_id is NULL"):
        errors.check(lib.megamoe_unique_id(None), "megamoe_unique_id")
    with pytest.raises(megamoe.NullPointerError, match="device is NULL"):
        errors.check(lib.megamoe_get_device(None), "megamoe_get_device")
    # NULL communicators are accepted (nothing to free).
    errors.check(lib.megamoe_comm_destroy(None), "megamoe_comm_destroy")
    errors.check(lib.megamoe_comm_abort(None), "megamoe_comm_abort")
    # The layer calls on a NULL layer.
    with pytest.raises(megamoe.NullPointerError, match="layer is NULL"):
        errors.check(lib.megamoe_sync(None, None), "megamoe_sync")


def test_a_closed_layer_refuses_calls():
    layer = megamoe.Layer._for_argument_checks(SMALL)
    layer.close()
    layer.close()  # idempotent
    with pytest.raises(megamoe.LayerClosedError, match="forward: the layer was closed"):
        layer.forward(None, None, None, None)
    with pytest.raises(megamoe.LayerClosedError):
        layer.sync()
    with pytest.raises(megamoe.LayerClosedError):
        layer.info()
