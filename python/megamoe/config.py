"""megamoe.Config: the layer's shape and options, the Python side of megamoe_config.

The defaults are read from the library (megamoe_config_make) and every check
is the library's (megamoe_check_config); the binding only refuses values that
cannot be represented in the C struct (a non-integer, an int beyond its C
type) before they get there.
"""

import ctypes
import dataclasses
import math
import operator
from typing import Optional, Union

from . import _lib
from .errors import BadArgumentError, BadArmError, check

_lib_ = _lib.lib
_DEFAULTS = _lib_.megamoe_config_make(128, 128, 1, 1, 1)


def arm_names():
    """The arms the library knows, in megamoe_arm order ("staged", "split", "fused")."""
    names = []
    while True:
        name = _lib_.megamoe_arm_name(len(names)).decode()
        if name == "unknown":
            return names
        names.append(name)


_INT_FIELDS = {"hidden": ctypes.c_int64, "intermediate": ctypes.c_int64, "num_experts": ctypes.c_int32,
               "top_k": ctypes.c_int32, "max_tokens_per_rank": ctypes.c_int64, "quant_group": ctypes.c_int32}


def _int_field(name, value):
    if isinstance(value, bool):
        raise BadArgumentError(f"{name} = {value!r}: must be an integer", "Config")
    if not isinstance(value, int):
        try:
            value = operator.index(value)  # numpy integers
        except TypeError:
            raise BadArgumentError(f"{name} = {value!r}: must be an integer", "Config") from None
    bits = ctypes.sizeof(_INT_FIELDS[name]) * 8
    if not -(1 << (bits - 1)) <= value < (1 << (bits - 1)):
        raise BadArgumentError(f"{name} = {value}: does not fit in int{bits}", "Config")
    return value


def _float_field(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        try:
            value = float(value)  # numpy floats
        except (TypeError, ValueError):
            raise BadArgumentError(f"{name} = {value!r}: must be a number", "Config") from None
    return float(value)


@dataclasses.dataclass
class Config:
    """The layer's config (megamoe_config; DESIGN.md section 1 names the shapes).

    hidden H, intermediate I (multiples of 128), num_experts E (over all
    ranks), top_k K, max_tokens_per_rank T_max; quant_group G (64 or 128);
    swiglu_clamp: None (no clamp) or c > 0; arm: "staged", "split" (or the
    megamoe_arm number); timeout_s: the deadline of every cross-rank wait;
    pool_imbalance: 0 (worst-case pool) or a factor in [1, num_ranks].
    """

    hidden: int
    intermediate: int
    num_experts: int
    top_k: int
    max_tokens_per_rank: int
    quant_group: int = _DEFAULTS.quant_group
    swiglu_clamp: Optional[float] = None
    arm: Union[str, int] = arm_names()[_DEFAULTS.arm]
    timeout_s: float = _DEFAULTS.timeout_s
    pool_imbalance: float = _DEFAULTS.pool_imbalance

    def to_c(self):
        """The megamoe_config struct (from megamoe_config_make, then these fields)."""
        c = _lib_.megamoe_config_make(1, 1, 1, 1, 1)
        for name in _INT_FIELDS:
            setattr(c, name, _int_field(name, getattr(self, name)))
        if self.swiglu_clamp is None:
            c.has_swiglu_clamp = 0
            c.swiglu_clamp = 0.0
        else:
            c.has_swiglu_clamp = 1
            clamp = _float_field("swiglu_clamp", self.swiglu_clamp)
            # Beyond float32's range: the C check sees it as inf and refuses it by name.
            c.swiglu_clamp = clamp if abs(clamp) < 3.4e38 or math.isnan(clamp) else math.copysign(math.inf, clamp)
        c.arm = self._arm_code()
        c.timeout_s = _float_field("timeout_s", self.timeout_s)
        c.pool_imbalance = _float_field("pool_imbalance", self.pool_imbalance)
        return c

    def _arm_code(self):
        arm = self.arm
        if isinstance(arm, str):
            names = arm_names()
            if arm not in names:
                raise BadArmError(f"arm = {arm!r}: not one of {', '.join(names)}", "Config")
            return names.index(arm)
        if isinstance(arm, bool) or not isinstance(arm, int) or not -(1 << 31) <= arm < (1 << 31):
            raise BadArmError(f"arm = {arm!r}: must be an arm name or a megamoe_arm number", "Config")
        return arm  # the library checks the number (BadArmError naming arm)

    @classmethod
    def from_c(cls, c):
        arm = c.arm
        names = arm_names()
        return cls(hidden=c.hidden, intermediate=c.intermediate, num_experts=c.num_experts, top_k=c.top_k,
                   max_tokens_per_rank=c.max_tokens_per_rank, quant_group=c.quant_group,
                   swiglu_clamp=float(c.swiglu_clamp) if c.has_swiglu_clamp else None,
                   arm=names[arm] if 0 <= arm < len(names) else arm, timeout_s=c.timeout_s,
                   pool_imbalance=c.pool_imbalance)

    def check(self, num_ranks=1):
        """megamoe_check_config for num_ranks ranks: raises the error class of the first problem."""
        c = self.to_c()
        check(_lib_.megamoe_check_config(ctypes.byref(c), _rank_count(num_ranks)), "megamoe_check_config")
        return self

    def as_dict(self):
        return dataclasses.asdict(self)


def _rank_count(num_ranks):
    if isinstance(num_ranks, bool) or not isinstance(num_ranks, int):
        raise BadArgumentError(f"num_ranks = {num_ranks!r}: must be an integer", "Config")
    if not -(1 << 31) <= num_ranks < (1 << 31):
        raise BadArgumentError(f"num_ranks = {num_ranks}: does not fit in int32", "Config")
    return num_ranks


def as_config(config):
    """A Config from a Config or a dict of its fields."""
    if isinstance(config, Config):
        return config
    if isinstance(config, dict):
        unknown = set(config) - {f.name for f in dataclasses.fields(Config)}
        if unknown:
            raise BadArgumentError(f"config: unknown field(s) {', '.join(sorted(unknown))}", "Config")
        try:
            return Config(**config)
        except TypeError as e:
            raise BadArgumentError(f"config: {e}", "Config") from None
    raise BadArgumentError(f"config: a megamoe.Config or a dict, not {type(config).__name__}", "Config")
