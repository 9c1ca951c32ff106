"""Schedule configs: which resource communicates, the SM split, tile sizes and orders.

A `Config` is one point of the space the tuner searches: the generic knobs below, which any
lowering may read, and the op knobs op families declare (`knobs.register_knob`: a GEMM's
variant, where a reduction sums, ...), read as attributes like the generic ones. The space
of allowed values, and the one check of a config against a bound pattern, are
`space.ConfigSpace`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from ..errors import ConfigError, closest
from .knobs import OP_KNOBS, reserve_names

# "none": the non-overlapped plan (the collectives, then the computation: NCCL + cuBLAS on
# GPUs), for shapes where overlap cannot pay; no kernel is generated for it
COMM_RESOURCES = ("sm", "copy_engine", "none")
ORDERS = ("own_first", "natural")


@dataclass(frozen=True, init=False, repr=False)
class Config:
    """One schedule. Sizes are elements; `num_programs` is the persistent grid size.

    The fields are the generic knobs; the op knobs (`knobs.OP_KNOBS`) are keyword arguments
    and attributes too (`Config(comm="copy_engine", capturable=1)`, `cfg.capturable`, and
    `dataclasses.replace` takes them), held in `op_values` where set to another value than
    their default (so equal configs are equal and hash alike whatever the registry holds)."""

    comm: str = "sm"  # "sm": a role in the kernel on reserved programs; "copy_engine"
    comm_programs: int = 2  # programs (SMs) given to communication when comm == "sm"
    num_programs: int = 4  # persistent grid: never more than co-resident CTAs
    block_m: int = 64
    block_n: int = 64
    block_k: int = 32
    comm_block_m: int = 64  # chunk rows moved (and signalled) at once
    comm_block_n: int = 64  # reduce_scatter: chunk columns (all_gather copies whole rows)
    order: str = "own_first"  # compute tile order: the tiles whose data is ready first go first
    group_m: int = 8  # grouped ordering of output tiles (L2 reuse)
    stages: int = 3
    warps: int = 4
    flatten: int = 0  # GPU: software-pipeline the K loop across consecutive tiles (tl.range)
    # how the non-overlapped plan (comm=none) runs its collectives: "nccl", or a library
    # variant that op families register (`lowering.register_library_comm`), e.g. torch
    # symmetric memory's all-reduce kernels
    library_comm: str = "nccl"
    # Debug only, never searched: 1 gives consumer roles LOWER program ids than their
    # producers, breaking the program-order rule on purpose so that tests can check the
    # emulated world's hang report. Allowed on the interp target only (a GPU could deadlock).
    debug_reverse_roles: int = 0
    # 1: the generated kernels time every role, every item of a role's loop and every wait
    # into a profile buffer (`tilelink profile`, docs/profile.md); 0 compiles it all out
    profile: int = 0

    # the op knobs set to another value than their default, (name, value) sorted by name
    op_values: tuple = field(default=())

    def __init__(self, **values):
        ops = dict(values.pop("op_values", ()))
        for f in _GENERIC:
            object.__setattr__(self, f.name, values.pop(f.name, f.default))
        for k, v in values.items():
            if k not in OP_KNOBS:
                raise _unknown(k)
            ops[k] = v
        object.__setattr__(self, "op_values", tuple(sorted(
            (k, v) for k, v in ops.items() if k not in OP_KNOBS or v != OP_KNOBS[k].default)))

    def __getattr__(self, name: str):
        # (only asked for names that are not fields: an op knob's value, else no such name)
        knob = OP_KNOBS.get(name)
        if knob is None or name == "op_values":
            raise AttributeError(name)
        return dict(self.op_values).get(name, knob.default)

    def value(self, knob: str):
        """The value of knob `knob` (generic or op knob), named by a string: how code that
        holds knob names (the registry's, a lowering's `variant_knob`) reads them.
        AttributeError for a name no knob has."""
        fields_ = self.__dict__  # (a frozen dataclass keeps its fields there)
        return fields_[knob] if knob in fields_ and knob != "op_values" else \
            self.__getattr__(knob)

    @staticmethod
    def knob_names() -> tuple[str, ...]:
        """Every knob, generic and registered, in the config text's order: the generic
        fields, each op knob after the knob its declaration names (`Knob.after`)."""
        return _knob_order()

    @staticmethod
    def knob_types() -> dict[str, type]:
        """Every knob's value type (int or str)."""
        out = {f.name: type(f.default) for f in _GENERIC}
        out.update({k.name: type(k.default) for k in OP_KNOBS.values()})
        return out

    def with_values(self, values: dict[str, str]) -> Config:
        """A copy with `KEY=VALUE` strings applied (from `--config`); unknown keys fail."""
        known = self.knob_types()
        out = {}
        for k, v in values.items():
            if k not in known:
                raise _unknown(k)
            if known[k] is int:
                try:
                    out[k] = int(v)
                except ValueError:
                    raise ConfigError(f"config {k}={v!r} must be an integer") from None
            else:
                out[k] = v
        return replace(self, **out)

    def as_dict(self) -> dict:
        return {k: self.value(k) for k in self.knob_names()}

    def __str__(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.as_dict().items() if self.shown(k))

    def __repr__(self) -> str:
        return "Config(" + ", ".join(f"{k}={v!r}" for k, v in self.as_dict().items()) + ")"

    def shown(self, knob: str) -> bool:
        """Whether `knob` is written out: debug knobs, library_comm, profile and the quiet op
        knobs (`Knob.quiet`) only when set to another value than their default (so the
        configs, and the generated modules' headers, of everything before them read as they
        did)."""
        quiet = knob.startswith("debug_") or knob in ("library_comm", "profile") or \
            (knob in OP_KNOBS and OP_KNOBS[knob].quiet)
        return not quiet or self.value(knob) != default_value(knob)


_GENERIC = tuple(f for f in fields(Config) if f.name != "op_values")
GENERIC_KNOBS = tuple(f.name for f in _GENERIC)
reserve_names(GENERIC_KNOBS)  # (no op knob may take a generic knob's name)
_ORDER: dict[tuple, tuple[str, ...]] = {}  # (the registry's (name, after) pairs) -> order


def _knob_order() -> tuple[str, ...]:
    """The generic knobs, each followed by the op knobs declared after it (depth first, in
    registration order); op knobs after an unknown or no knob at the end."""
    key = tuple((k.name, k.after) for k in OP_KNOBS.values())
    if key not in _ORDER:
        after: dict[str, list[str]] = {}
        for k in OP_KNOBS.values():
            after.setdefault(k.after, []).append(k.name)
        out: list[str] = []

        def emit(name: str) -> None:
            out.append(name)
            for child in after.get(name, []):
                emit(child)

        for name in GENERIC_KNOBS:
            emit(name)
        for k in OP_KNOBS.values():
            if k.name not in out:
                emit(k.name)
        _ORDER[key] = tuple(out)
    return _ORDER[key]


def _unknown(key: str) -> ConfigError:
    """The error for config key `key` that no knob has, with the closest one."""
    known = Config.knob_names()
    hint = closest(key, known)
    return ConfigError(f"unknown config key '{key}'",
                       hint=f"did you mean '{hint}'?" if hint else "keys: " + ", ".join(known))


def default_value(knob: str):
    """`knob`'s default value (a generic field's, or the op knob's declared one)."""
    if knob in OP_KNOBS:
        return OP_KNOBS[knob].default
    return _DEFAULT.value(knob)


_DEFAULT = Config()
