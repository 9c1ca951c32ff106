"""Op knobs: config knobs whose meaning belongs to an op family, declared by that family.

The config (`Config`) has generic knobs, which every lowering may read (the comm resource,
tile sizes, program counts, order, stages, warps, flatten, library_comm, profile, debug_*),
and op knobs: a GEMM's variant, where a reduction sums, an all-reduce's algorithm, ... An op
family declares each of its op knobs (`Knob`: name, default, allowed values or a check, a
line of help, how it is written and searched) with `register_knob` at import, next to the
lowerings that read it (their `knobs`), as it registers those lowerings. The config space
is the union of the generic knobs and the registered ones; generic code asks this registry
(and the lowerings) about op knobs and never names one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# knob name -> its declaration, in registration order
OP_KNOBS: dict[str, Knob] = {}
# names no op knob may take: the generic knobs' (`config` reserves them when it is imported,
# which importing any module of `tilelink.schedule` does first)
_RESERVED: set[str] = set()


@dataclass(frozen=True)
class Knob:
    """One op knob's declaration.

    `family`: the op kind whose family declares it (messages name it). `values`: the allowed
    values; empty: any value of the default's type that `check` accepts (`check_text` says
    which, for messages). `quiet`: written in the config text only when set to another value
    than the default (so configs from before the knob existed read, and hash, as they did).
    `feature`: it turns something on, so a value other than the default is refused where no
    lowering of the pattern reads it (it would change nothing). `names_plan`: its value says
    which overlapped plan a config is (messages name it next to `comm`). `searched`: the
    tuner crosses it (values its readers' `Lowering.tune_axes` propose per site, from
    `search_values` where given). `after`: the knob it follows in the config text (empty:
    at the end)."""

    name: str
    default: int | str
    help: str
    family: str
    values: tuple = ()
    check: Callable[[object], bool] | None = None
    check_text: str = ""
    quiet: bool = False
    feature: bool = True
    names_plan: bool = False
    searched: bool = False
    search_values: tuple = ()
    after: str = ""

    @property
    def is_int(self) -> bool:
        """Whether the knob takes integers (its default is one): `--config` parses them."""
        return isinstance(self.default, int)

    def why_invalid(self, value) -> str | None:
        """Why `value` is not a value of this knob (None: it is)."""
        of = f"({self.family}'s knob: {self.help})"
        if self.values and value not in self.values:
            return f"{self.name}={value} is not one of {', '.join(map(str, self.values))} {of}"
        if self.is_int and not isinstance(value, int):
            return f"{self.name}={value!r} must be an integer {of}"
        if self.check is not None and not self.check(value):
            return f"{self.name}={value} must be {self.check_text or 'valid'} {of}"
        return None


def register_knob(knob: Knob) -> Knob:
    """Declare op knob `knob` (an op family module calls this at import, next to the
    lowerings reading it). A name may be declared once, and not as a generic knob's."""
    if knob.name in OP_KNOBS or knob.name in _RESERVED:
        raise ValueError(f"config knob '{knob.name}' is already declared")
    if knob.values and knob.default not in knob.values:
        raise ValueError(f"knob {knob.name}: default {knob.default!r} is not one of its values")
    OP_KNOBS[knob.name] = knob
    return knob


def reserve_names(names) -> None:
    """Keep `names` (the generic knobs) from being declared as op knobs."""
    _RESERVED.update(names)


def feature_knobs() -> tuple[Knob, ...]:
    """The registered knobs that turn a feature on (`Knob.feature`)."""
    return tuple(k for k in OP_KNOBS.values() if k.feature)


def plan_knobs() -> tuple[Knob, ...]:
    """The registered knobs whose value says which overlapped plan a config is."""
    return tuple(k for k in OP_KNOBS.values() if k.names_plan)
