"""One kernel of a generated module: its arguments, constants and roles, laid out with the
call protocol around the roles' bodies (`KernelBuilder`; the module builder makes one per
kernel of the schedule's composition)."""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING

from ..schedule.compose import kernel_programs
from . import profile, protocol
from .escape import comment_text, doc_text
from .views import View, ident, indent, wrap_items

if TYPE_CHECKING:
    from .module import ModuleBuilder

_FIXED = ("ctl_ptr", "heap_bases", "abort_ptr", "diag_ptr", "me", "spin_limit")
_FIXED_SIG = {"ctl_ptr": "*i32", "heap_bases": "*i64", "abort_ptr": "*i32", "diag_ptr": "*i32",
              "me": "i32", "spin_limit": "i32"}
_FIXED_HOST = {"ctl_ptr": 'sym["ctl"]', "heap_bases": "rt.heap_bases", "abort_ptr": "rt.abort",
               "diag_ptr": "rt.diag", "me": "rt.rank", "spin_limit": "rt.spin_limit"}


class KernelBuilder:
    """One kernel of a module: its arguments, constants and roles (see ModuleBuilder)."""

    def __init__(self, mb: ModuleBuilder, index: int, roles):
        self.mb, self.index, self.roles = mb, index, roles
        name = mb.bp.name
        # the first kernel is the pattern's; later ones are named after what they do
        self.name = f"{name}_kernel" if index == 0 else f"{name}_{_kernel_word(roles)}_kernel"
        if any(k.name == self.name for k in mb.kernels[:index]):
            self.name = f"{name}_k{index}_kernel"
        self.programs = kernel_programs(roles)
        self.params: dict[str, str] = {k: _FIXED_SIG[k] for k in _FIXED}
        for k in _FIXED:
            mb.arguments.setdefault(k, (_FIXED_SIG[k], _FIXED_HOST[k]))
        self.sig = dict(self.params)
        self.host: dict[str, str] = dict(_FIXED_HOST)
        self.consts: dict[str, str] = {}  # local constexpr name -> module constant
        self.prologue: list[str] = []
        self.buffers: dict[str, str] = {}
        self.warps = mb.config.warps  # a step's lowering may set another
        self.gluon = False
        self.lines: list[str] = []
        self.launch: list[str] | None = None  # launch() lines, where a lowering writes them
        # host lines launch() runs right before this kernel's launch (a library call whose
        # result the kernel's roles read)
        self.host_before: list[str] = []
        self.also: list[str] = []  # more kernels its lowering laid out (same consts, warps)
        self.docstring = ""
        self.profiled = False  # its roles record profile events (profile=1)

    # ---- what lowerings call ------------------------------------------------------------

    @property
    def programs_const(self) -> str:
        """The module constant of this kernel's grid size."""
        if self.index == 0:
            return "NUM_PROGRAMS"
        return f"{ident(self.name[:-len('_kernel')])}_PROGRAMS"

    def param(self, name: str, sig: str, host: str) -> str:
        """Runtime argument `name` of this kernel (type `sig`), passed `host` by launch();
        a name stands for one argument in every kernel of the module."""
        known = self.mb.arguments.setdefault(name, (sig, host))
        if known != (sig, host):
            raise self.mb.names.clash(name, f"kernel argument {name} would be both {known[1]} "
                                      f"({known[0]}) and {host} ({sig})")
        if name not in self.params:
            self.params[name] = sig
            self.sig[name] = sig
            self.host[name] = host
        return name

    def const(self, local: str, module: str | None = None, value=None, comment: str = "") -> str:
        """Constexpr argument `local` of this kernel, bound to module constant `module`
        (declared with `value` when given)."""
        module = module or local
        if value is not None:
            self.mb.const(module, value, comment)
        old = self.consts.get(local)
        if old is not None and old != module:
            raise self.mb.names.clash(local, f"kernel constant {local} of {self.name} is bound "
                                      f"to {old} and to {module}")
        self.consts[local] = module
        return local

    def buffered(self, tensor: str, ptr: str, numel: int) -> str:
        """The base of this call's copy of a double-buffered heap tensor (epoch parity)."""
        name = f"{tensor}_buf"
        if name not in self.buffers:
            self.buffers[name] = f"{name} = {ptr} + buf * {numel}  # this call's copy of {tensor}"
        return name

    def view(self, tensor: str) -> View:
        return self.mb.view(tensor, self)

    # ---- rendering ----------------------------------------------------------------------

    def render(self) -> None:
        mb = self.mb
        first = self.roles[0]
        laid = first.lowering.render_kernel(first, self) if len(self.roles) == 1 else None
        if laid is not None:
            # a lowering that lays its kernels and host calls out itself (gemm=library); no
            # lines: host calls only (a library GEMM storing straight into its result)
            self.lines, self.launch = laid
            return
        codes = [role.lowering.render_step(role, self) for role in self.roles]
        local = mb.stays_local()
        if mb.config.profile:
            if self.gluon:
                profile.refuse_gluon(self)
            codes = [profile.instrument_role(code, profile.role_index(mb, role),
                                             "0" if local else "epoch", role.count)
                     for role, code in zip(self.roles, codes)]
            self.param(f"{profile.BUFFER}_ptr", "*i64", f"sym[{profile.BUFFER!r}]")
            self.const("PROFILE_ROWS")
            self.profiled = True
        self.const("WORLD", "WORLD")
        self.const("NUM_PROGRAMS", self.programs_const, self.programs,
                   "programs of each kernel (its persistent grid)")
        # one branch per range of program ids; a joined tile loop runs in its lead's branch,
        # after it
        branches: list[tuple] = []
        for role, code in zip(self.roles, codes):
            after = f", after {role.after.name}" if role.after is not None else ""
            head = textwrap.wrap(comment_text(
                f"# ---- {role.name} (programs {role.first}..{role.last}{after}): "
                f"{role.what} ----"), 92, subsequent_indent="# ")
            if role.after is None:
                branches.append(([role], head + code))
            elif branches and any(role.after is r for r in branches[-1][0]):
                branches[-1][0].append(role)
                branches[-1][1].extend(head + code)
            else:  # (its own branch would test its lead's program ids again: never taken)
                raise AssertionError(f"{self.name}: the joined loop {role.name} does not follow "
                                     f"{role.after.name}, whose programs it runs on")
        chain = []
        for i, ([role, *_], lines) in enumerate(branches):
            if len(branches) == 1:
                test = "if pid >= 0:  # every program"
            elif i == 0:
                test = f"if pid < {role.last + 1}:"
            elif i == len(branches) - 1:
                test = "else:"
            else:
                test = f"elif pid < {role.last + 1}:"
            chain += [test] + indent(lines)
        pre = ["pid = tl.program_id(0)"]
        if self.mb.config.debug_reverse_roles:
            pre = ["# DEBUG (debug_reverse_roles=1): consumer roles run on the LOWEST program",
                   "# ids, so they wait on higher-id producers of their own rank. This breaks",
                   "# the program-order rule on purpose; it can hang (the emulated world must",
                   "# report it). Never run on a GPU.", "pid = tl.program_id(0)"]
        if not local:
            pre += protocol.epoch_begin()
        if self.index == 0 and mb.gates and not mb.gates_at_end:
            pre += protocol.open_gates(mb.flag_protocol)
        pre += list(self.buffers.values())
        post = []
        if self.index == len(mb.comp.kernels) - 1 and local:
            post += ["# Nothing of this call crosses ranks or agents (no signal, no buffer a peer",
                     "# or the copy engine writes): no epoch to count, no buffer to release"]
        elif self.index == len(mb.comp.kernels) - 1:
            for ptr, _slots in mb.flag_signals:
                self.param(ptr, "*i32", f"sym[{ptr[:-len('_ptr')]!r}]")
            post += protocol.release("NUM_PROGRAMS", mb.flag_signals)
            post += protocol.epoch_end()
        sig_params = [p for p in self.params]
        decorator = "@gluon.jit" if self.gluon else "@triton.jit"
        cty = "gl.constexpr" if self.gluon else "tl.constexpr"
        head = [decorator, f"def {self.name}("]
        head += wrap_items(sig_params, "    ")
        head += wrap_items([f"{c}: {cty}" for c in self.consts], "    ")
        head += ["):", f'    """{doc_text(self.docstring or _doc(self))}"""']
        self.lines = head + indent(pre + chain + post)


def _kernel_word(roles) -> str:
    kinds = [r.kind for r in roles]
    if "tiles" in kinds:
        return next(r for r in roles if r.kind == "tiles").op.result
    return kinds[0] if len(set(kinds)) == 1 else "_".join(dict.fromkeys(kinds))


def _doc(kb: KernelBuilder) -> str:
    return "; ".join(f"{r.name}: {r.what}" for r in kb.roles)
