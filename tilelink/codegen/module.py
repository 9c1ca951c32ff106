"""Assemble a generated module from the schedule's kernels and its ops' lowerings.

The schedule says which lowering runs each op and how the lowerings' steps form kernels
(`tilelink.schedule.compose`). This module gives every tensor a home (a pattern input, a
pattern output, or a buffer of the symmetric heap), lets each lowering declare what it
needs at module level (constants, symmetric buffers, signal arrays, wait sites, the copy
engine's program), asks each step's lowering for its role's body, and lays the kernels out
with the shared call protocol (`protocol.py`) around their roles (`kernel.py`: one kernel;
`views.py`: the vocabulary the lowerings share with it).

Conventions every lowering relies on:
- every tensor is contiguous and row-major: a view is a base pointer and a shape;
- a kernel's runtime arguments are `<name>_ptr` pointers (tensors, heap buffers, signal
  arrays) plus `ctl_ptr, heap_bases, abort_ptr, diag_ptr, me, spin_limit`; its constexpr
  arguments carry kernel-local names (`M`, `BM`, `A_FULL_CB`, ...) bound to module
  constants at launch (`KERNEL_CONSTS`);
- in a role's body: `pid` (program id), `epoch`, `buf` (epoch parity) are defined; `tok`
  is a wait token.
"""

from __future__ import annotations

import json

from ..errors import NotSupportedError
from ..ir import spec
from ..lang.core import DIAG_WORDS  # noqa: F401  (documentation: diag_ptr's size)
from ..schedule.lowering import rows_gathered
from . import profile, protocol
from .escape import comment_text, doc_text
from .kernel import KernelBuilder
from .names import Names, check_module
# (the shared vocabulary, imported from here by the ops' lowerings)
from .views import (SIG_DTYPES, TL_DTYPES, Alias, RowsOf, TileOut, View, ident,  # noqa: F401
                    indent, numel, wrap_items)

#: test faults a module can be rendered with: what each injects
FAULTS = {"drop_notify": "every producer of data skips the signal that says the data arrived "
                         "(in kernels and in the copy engine's program): every consumer's wait "
                         "must give up and be reported"}


class ModuleBuilder:
    """One generated module under construction; see the module docstring."""

    def __init__(self, s, fault: str | None = None):
        if fault is not None and fault not in FAULTS:
            from ..errors import ConfigError

            raise ConfigError(f"unknown fault '{fault}'", hint="faults: " + ", ".join(FAULTS))
        self.fault = fault
        self.dropped = 0  # data signals the fault removed
        self.s = s
        self.bp = s.bound
        self.comp = s.composition
        self.target = s.target
        self.config = s.config
        self.plan = s.plan
        self.consts: dict[str, tuple[object, str]] = {}  # module constant -> (value, comment)
        self.symmetric: dict[str, tuple[tuple, str]] = {}
        self.homes: dict[str, tuple[str, int]] = {}  # tensor -> (kind, buffers)
        # every tensor a view can address: the pattern's and the lowerings' own buffers
        self.meta: dict[str, tuple[tuple, str]] = {
            k: (tuple(t.local_shape), t.dtype) for k, t in self.bp.tensors.items()}
        self.peer_written: set[str] = set()
        self.aliases: dict[str, tuple[str, str, str, int]] = {}  # tensor -> alias (see Alias)
        # tensor -> (its index buffer, the tensor whose rows it picks): see RowsOf
        self.row_index: dict[str, tuple[str, str]] = {}
        self.sites: dict[int, str] = {protocol.SITE_RELEASE: "a writer waits for the "
                                      "destination rank to release its buffer"}
        self.site_deps: dict[int, int] = {}
        self.site_roles: dict[int, tuple[int, str]] = {}
        self.init_lines: list[str] = []
        self.signals: list[tuple[str, int, str]] = []  # (heap name, slots, init: epoch|flag|zero)
        self.ce_lines: list[str] = []
        self.describe_lines: list[str] = []
        self.module_lines: list[str] = []  # extra module-level code of lowerings
        # module-level code after the composed kernels (a prepare step's kernel: the first
        # kernel stays the pattern's)
        self.after_kernels: list[str] = []
        self.imports: list[str] = []
        self.flags: dict[str, int] = {"TMA": 0, "CAPTURABLE": 0}
        self.copy_engine = False
        self.gates = False  # some copy engine waits on gates (open_gates in kernel 0)
        # the gates of the next call are opened at the end of this one, the first call's at
        # init (a lowering laying out its own kernels says so: gemm=library)
        self.gates_at_end = False
        # the copy engine's gates and signals are 0/1 flags, not epochs (a lowering that
        # switches its flag protocol on says so in `declare`)
        self.flag_protocol = False
        self.flag_signals: list[tuple[str, int]] = []  # (heap name, slots): cleared at release
        self.kernels: list[KernelBuilder] = []
        self.notes: list[str] = list(s.notes)
        self._next_site = 0
        self.names = Names(self.bp)  # the user's names, to blame a clash on
        # runtime argument -> (type, launch expression), across the module's kernels: one
        # name is one argument everywhere (SIGNATURE holds one type per name)
        self.arguments: dict[str, tuple[str, str]] = {}

    # ---- declarations (lowerings call these) ------------------------------------------

    def const(self, name: str, value, comment: str = "") -> str:
        """Declare module constant `name` (idempotent if the value agrees)."""
        old = self.consts.get(name)
        if old is not None and old[0] != value:
            raise self.names.clash(name, f"module constant {name} is declared as {old[0]!r} "
                                   f"and as {value!r}")
        self.consts[name] = (value, comment or (old[1] if old else ""))
        return name

    def buffer(self, name: str, shape: tuple, dtype: str, home_of: bool = False) -> str:
        """A buffer of the symmetric heap, on every rank (no view: signals, tables).
        Its name is new: not another buffer's, nor a pattern tensor's (the runtime hands
        the copy engine inputs and buffers in one dict) unless it is that tensor's home
        (`home_of`)."""
        if name in self.symmetric:
            raise self.names.clash(name, f"two symmetric buffers are named '{name}'")
        if name in self.bp.tensors and not home_of:
            raise self.names.clash(name, f"'{name}' names a tensor of the pattern and a "
                                   "buffer the generated code declares for its own use")
        self.symmetric[name] = (tuple(shape), dtype)
        return name

    def heap_tensor(self, name: str, shape: tuple, dtype: str, nbuf: int = 1,
                    peer_written: bool = False, home_of: bool = False) -> str:
        """A tensor in the symmetric heap that kernels address through views: `nbuf` copies
        (2: double-buffered by epoch parity); `peer_written`: other agents write it;
        `home_of`: it is the memory of the pattern's tensor `name` (else a lowering's own
        buffer, whose name no pattern tensor may have). One copy must stay under the kernels'
        int32 bound (`schedule.MAX_ELEMENTS`, as each tensor's per-rank part): a staging
        buffer of W partials is indexed as one (`s * (M * N) + ...`)."""
        from ..schedule.schedule import MAX_ELEMENTS, past_int32

        if past_int32(shape):
            from ..errors import ConfigError

            raise ConfigError(
                f"the kernel's symmetric buffer '{name}' holds {numel(shape)} elements a copy "
                f"({' x '.join(map(str, shape))}); the overlapped kernels index with int32 "
                f"offsets and take fewer than {MAX_ELEMENTS} (2**30)", self.bp.pattern.loc,
                hint="use --config comm=none (NCCL + cuBLAS) or split the problem")
        self.buffer(name, ((nbuf,) if nbuf > 1 else ()) + tuple(shape), dtype, home_of)
        self.meta[name] = (tuple(shape), dtype)
        self.homes[name] = ("heap", nbuf)
        if peer_written:
            self.peer_written.add(name)
        return name

    def signal(self, name: str, slots: int, init: str = "epoch") -> str:
        """An int32 signal array in the heap. `init`: "epoch" (every epoch before the first
        call completed), "flag" (0: flag signals, capturable=1) or "zero"."""
        self.buffer(name, (slots,), "int32")
        self.signals.append((name, slots, init))
        return name

    def site(self, words: str, dep=None, role: tuple[int, str] | None = None) -> int:
        """A new wait site: the number a stuck wait reports, described by `words`; `dep`: the
        plan dependency whose producer slots it waits on (the runtime decodes them)."""
        n = self._next_site
        while n == protocol.SITE_RELEASE or n in self.sites:
            n += 1
        self._next_site = n + 1
        self.sites[n] = words
        if dep is not None:
            self.site_deps[n] = self.plan.deps.index(dep)
        if role is not None:
            self.site_roles[n] = role
        return n

    def site_for(self, key, words: str, dep=None, role=None) -> int:
        """`site`, once per `key`: a wait rendered twice (a tile body in two loops) keeps one
        number."""
        cache = self.__dict__.setdefault("_site_cache", {})
        if key not in cache:
            cache[key] = self.site(words, dep, role)
        return cache[key]

    # ---- data signals (the one place the drop_notify fault acts) -------------------------

    def notify_data(self, line: str) -> str:
        """A kernel line that signals that data arrived (a notify of a data slot)."""
        if self.fault == "drop_notify":
            self.dropped += 1
            return "pass  # fault injected (drop_notify): " + line.strip()
        return line

    def put_signal(self, dst: str, src: str, count: str, sig: str, value: str, peer: str,
                   pad: str = "") -> list[str]:
        """`tld.put_signal(...)` (a put, then the data slot's notify), or under the
        drop_notify fault the bare put."""
        if self.fault == "drop_notify":
            self.dropped += 1
            return [f"{pad}tld.put({dst}, {src}, {count}, {peer}, me, heap_bases, COPY_BLOCK)"
                    "  # fault injected (drop_notify): no signal"]
        return [f"{pad}tld.put_signal({dst},", f"{pad}               {src}, {count},",
                f"{pad}               {sig}, {value}, {peer}, me, heap_bases, COPY_BLOCK)"]

    def ce_data_signal(self, line: str) -> str:
        """A copy-engine program line appending a data slot's signal op."""
        if self.fault == "drop_notify":
            self.dropped += 1
            return line[:len(line) - len(line.lstrip())] + "pass  # fault injected " \
                "(drop_notify): " + line.strip()
        return line

    def stays_local(self) -> bool:
        """Whether nothing of a call crosses ranks or agents: no signal, no buffer that a peer
        or the copy engine writes, no double buffer (GEMM-AllReduce at W = 1, say). Such a
        module's kernels skip the call protocol (the epoch read, the release and the epoch's
        completion: about 2.3 us per call at decode sizes on an H200, docs/perf.md)."""
        return not (self.signals or self.flag_signals or self.peer_written or self.copy_engine
                    or self.gates or any(nbuf > 1 for _, nbuf in self.homes.values()))

    def home(self, tensor: str) -> tuple[str, int]:
        return self.homes[tensor]

    def host_ref(self, tensor: str) -> str:
        """`tensor` as launch() names it: an input, an output, or this call's copy of a heap
        buffer (epoch parity where it is double-buffered)."""
        kind, nbuf = self.homes[tensor]
        if kind in ("input", "output"):
            return f"{kind}s[{tensor!r}]"
        return f"sym[{tensor!r}]" + ("[epoch & 1]" if nbuf > 1 else "")

    def view(self, tensor: str, kb: KernelBuilder) -> View:
        """`tensor` as kernel `kb` addresses it (declares its pointer argument; a tensor
        written as an index of rows: the index's and the source's)."""
        shape, dtype = self.meta[tensor]
        if tensor in self.row_index:
            index, src = self.row_index[tensor]
            rows = RowsOf(self.view(index, kb).base, self.view(src, kb).base)
            # no memory holds its rows: a reader addressing them from `base` would fail to
            # compile, naming why, rather than read another tensor's memory
            return View(tensor, f"{tensor}_rows_are_an_index_read_View_rows_of", shape, dtype,
                        rows_of=rows)
        kind, nbuf = self.homes[tensor]
        sig = f"*{SIG_DTYPES[dtype]}"
        if kind == "input":
            base = kb.param(f"{tensor}_ptr", sig, f"inputs[{tensor!r}]")
        elif kind == "output":
            base = kb.param(f"{tensor}_ptr", sig, f"outputs[{tensor!r}]")
        else:
            ptr = kb.param(f"{tensor}_ptr", sig, f"sym[{tensor!r}]")
            base = ptr if nbuf == 1 else kb.buffered(tensor, ptr, numel(shape))
        alias = None
        if tensor in self.aliases:
            lo, hi, src, rows = self.aliases[tensor]
            alias = Alias(lo, hi, self.view(src, kb).base, rows)
        return View(tensor, base, shape, dtype, tensor in self.peer_written, alias)

    def lowering(self, op_result: str):
        return self.comp.lowerings[op_result]

    def site_of(self, op_result: str):
        return self.comp.sites[op_result]

    def producer_lowering(self, tensor: str):
        """The lowering of the op producing `tensor` (None for a pattern input)."""
        return self.comp.lowerings.get(tensor)

    # ---- assembly -----------------------------------------------------------------------

    def build(self) -> str:
        self.buffer("ctl", (protocol.ctl_words(self.bp.world),), "int32")
        self._assign_homes()
        for op in self.bp.ops:
            self.lowering(op.result).declare(self, self.site_of(op.result))
        if self.config.profile:
            profile.declare(self)
        for i, roles in enumerate(self.comp.kernels):
            kb = KernelBuilder(self, i, roles)
            self.kernels.append(kb)
        for kb in self.kernels:
            kb.render()
            kb.host_before[:0] = self._prepare_lines(kb)
        if self.fault == "drop_notify" and not self.dropped:
            from ..errors import ConfigError

            raise ConfigError("fault drop_notify has nothing to drop: no data signal in this "
                              "module", hint="the fault needs a collective that signals data")
        text = self._text()
        check_module(text, self.names, {k: v[0] for k, v in self.arguments.items()},
                     {kb.name: list(kb.buffers) for kb in self.kernels})
        return text

    def prepares(self, kb: KernelBuilder) -> list[tuple[object, str]]:
        """(site, what) of the prepare steps launch() runs right before kernel `kb`: those of
        the ops with a role in it (`Lowering.prepare`)."""
        out = []
        for op in dict.fromkeys(r.op for r in kb.roles):
            prep = self.lowering(op.result).prepare(self.site_of(op.result))
            if prep is not None:
                out.append((self.site_of(op.result), prep.what))
        return out

    def _prepare_lines(self, kb: KernelBuilder) -> list[str]:
        lines = []
        for site, what in self.prepares(kb):
            lines += [f"    # prepare {site.op.result}: {comment_text(what)}"]
            lines += self.lowering(site.op.result).render_prepare(kb, site)
        return lines

    def _assign_homes(self) -> None:
        bp = self.bp
        for d in bp.pattern.inputs:
            self.homes[d.name] = ("input", 1)
        for op in bp.ops:
            site = self.site_of(op.result)
            t = bp.tensors[op.result]
            home = self.lowering(op.result).result_home(site)
            src = rows_gathered(site)
            if src is not None:  # written as an index of src's rows: no memory for the rows
                index = self.heap_tensor(f"{op.result}_index", (t.local_shape[0],), "int32")
                self.row_index[op.result] = (index, src)
            elif home is None:  # written locally by this rank: the output, or scratch
                if site.is_output:
                    self.homes[op.result] = ("output", 1)
                elif self._needs_home(op):
                    self.heap_tensor(op.result, t.local_shape, t.dtype, home_of=True)
            else:  # ("heap", buffers): peers write it
                self.heap_tensor(op.result, t.local_shape, t.dtype, home[1], peer_written=True,
                                 home_of=True)

    def _needs_home(self, op) -> bool:
        """A locally written result needs memory unless every consumer takes its tiles in the
        producer's epilogue (a reduce_scatter or all_reduce lowering's hook) and none reads
        it back from memory (`reads_back`)."""
        for c in self.site_of(op.result).consumers:
            lw = self.lowering(c.result)
            if not lw.takes_epilogue or lw.reads_back(self.site_of(c.result)):
                return True
        return False

    def hooks_of(self, op_result: str):
        """The lowerings (with sites) that take `op_result`'s tiles in their epilogue."""
        return [(self.lowering(c.result), self.site_of(c.result))
                for c in self.site_of(op_result).consumers
                if self.lowering(c.result).takes_epilogue]

    def _text(self) -> str:
        lines = ['"""', *self._header(), '"""', "", "import triton",
                 "import triton.language as tl", "", f"from tilelink.lang import "
                 f"{self.target.lang} as tld"]
        lines += self.imports
        lines += ["", f"WORLD = {self.bp.world}"]
        last_comment = None
        for name, (value, comment) in self.consts.items():
            if comment and comment != last_comment:
                lines.append(f"# {comment_text(comment)}")
                last_comment = comment
            lines.append(f"{name} = {value!r}")
        for flag, value in self.flags.items():
            lines.append(f"{flag} = {value}")
        lines += ["", "# Symmetric buffers allocated on every rank (name -> (shape, dtype)).",
                  "SYMMETRIC = {"]
        lines += [f"    {k!r}: ({list(v[0])}, {v[1]!r})," for k, v in self.symmetric.items()]
        lines += ["}", "# This rank's tensors (local shapes).", "INPUTS = {"]
        for d in self.bp.pattern.inputs:
            t = self.bp.tensors[d.name]
            lines.append(f"    {d.name!r}: ({list(t.local_shape)}, {t.dtype!r}),")
        lines += ["}", "OUTPUTS = {"]
        for name in dict.fromkeys(self.bp.pattern.outputs):
            t = self.bp.tensors[name]
            lines.append(f"    {name!r}: ({list(t.local_shape)}, {t.dtype!r}),")
        lines += ["}", "# What a stuck wait was waiting for, by the site number it reports.",
                  "WAIT_SITES = {"]
        lines += [f"    {k}: {json.dumps(v)}," for k, v in sorted(self.sites.items())]
        lines += ["}", "# sites whose slots are a plan dependency's producer tiles (its index "
                  "in the plan)", f"WAIT_SITE_DEPS = {dict(sorted(self.site_deps.items()))}",
                  "# sites by (kernel, role) that waits there",
                  f"WAIT_SITE_ROLES = {dict(sorted(self.site_roles.items()))}", "",
                  *(profile.role_table(self) + [""] if self.config.profile else []),
                  "# Argument types of the kernels, for compiling them ahead of time "
                  "(tilelink compile --emit ptx).", "SIGNATURE = {"]
        sig = {}
        devices = [kb for kb in self.kernels if kb.lines]  # (not the host-only ones)
        for kb in devices:
            sig.update(kb.sig)
        lines += [f"    {k!r}: {v!r}," for k, v in sig.items()]
        lines += ["}", "# Constexpr arguments of each kernel (kernel name -> name -> value).",
                  "KERNEL_CONSTS = {"]
        for kb in devices:
            for name in [kb.name] + kb.also:
                lines.append(f"    {name!r}: dict("
                             f"{', '.join(f'{k}={v}' for k, v in kb.consts.items())}),")
        lines += ["}", "# warps of each kernel (compile_module reads it)", "KERNEL_WARPS = {"]
        lines += [f"    {name!r}: {kb.warps}," for kb in devices for name in [kb.name] + kb.also]
        lines += ["}", f"NUM_WARPS = {(devices or self.kernels)[0].warps}"]
        lines += self.module_lines
        for kb in devices:
            lines += ["", ""] + kb.lines
        if self.after_kernels:
            lines += ["", ""] + self.after_kernels
        lines += ["", ""] + self._init_signals()
        lines += ["", ""] + self._copy_engine_ops()
        lines += ["", ""] + self._describe_slot()
        lines += ["", ""] + self._launch()
        return "\n".join(lines) + "\n"

    def _header(self) -> list[str]:
        s, bp = self.s, self.bp
        lines = [f"TileLink generated module for pattern '{bp.name}'"]
        if bp.pattern.loc:
            lines.append(f"source: {bp.pattern.loc.file}")
        lines += [f"sizes: {bp.sizes_str()}   (world size W = {bp.world})",
                  f"target: {self.target.name}", f"config: {s.config_text}", "ops:"]
        for op in bp.ops:
            lines.append(f"  {op}    [{self.lowering(op.result).name}]")
        lines.append("kernels, launched in this order on the caller's stream (program ids):")
        for kb in self.kernels:
            lines.append(f"  {kb.name}, {kb.programs} programs:" if kb.lines else
                         f"  {kb.name[:-len('_kernel')]}: host calls, no kernel:")
            for st in kb.roles:
                waits = f"; waits on {', '.join(st.waits_on)}" if st.waits_on else ""
                span = f"{st.first}..{st.last}" if st.count else "host"
                lines.append(f"    {st.name}: {span}  {st.what}{waits}")
            for site, what in self.prepares(kb):
                lines.append(f"    before it (device work launched from the host, no sync): "
                             f"prepare {site.op.result}: {what}")
        lines.append("derived mappings:")
        for d in self.plan.deps:
            lines.append(f"  {d.consumer.op} <- {d.producer.op} via {d.tensor}: {d.kind}")
            for w in d.closed or ():
                where = ("all" if w.dim is None else
                         f"read dim {w.dim}, f(x) = {w.tiling.closed_form('x')}")
                lines.append(f"    producer axis {w.axis}: {where}")
            lines.append(f"    channel: slot = linear("
                         f"{', '.join(a.name for a in d.producer.axes)}) in {d.signal}")
        lines += [f"note: {n}" for n in self.notes]
        return [doc_text(x) for x in lines]

    def _init_signals(self) -> list[str]:
        w = self.bp.world
        lines = ["def init_signals(symmetric, first_epoch):",
                 '    """Signal words before the first call: every epoch before `first_epoch` '
                 'is complete.', "",
                 "    (The runtime calls this once, right after allocating the heap.)",
                 '    """', "    before = _i32(first_epoch - 1)"]
        for name, slots, init in self.signals:
            if init == "epoch":
                lines.append(f"    symmetric[{name!r}].fill_(before)")
            else:
                lines.append(f"    symmetric[{name!r}].zero_()  # "
                             + ("flag signals (capturable=1): nothing delivered" if init == "flag"
                                else "counters start at 0"))
        lines += self.init_lines
        lines += ['    ctl = symmetric["ctl"]',
                  "    ctl.zero_()  # ctl[1]: the abort word (the runtime's abort flag), clear",
                  "    ctl[2] = before  # last completed call",
                  "    ctl[4:] = before  # ctl[4 + r]: rank r released its buffers up to "
                  "this epoch"]
        if self.gates and self.gates_at_end:
            lines.append(f"    # the first call's gates: open (later calls' are opened by the "
                         "call before them)")
            lines.append(f"    ctl[{4 + w}:] = " + ("1" if self.flag_protocol else "first_epoch"))
        elif self.gates and self.flag_protocol:
            lines.append(f"    ctl[{4 + w}:] = 0  # the gates are flags (capturable=1): "
                         "closed until a kernel opens them")
        return ["def _i32(x):", '    """`x` as the int32 a signal word holds (two\'s '
                'complement wrap-around)."""', "    return (x + 2**31) % 2**32 - 2**31", "",
                ""] + lines

    def _copy_engine_ops(self) -> list[str]:
        head = ["def copy_engine_ops(rank, epoch, tensors):",
                '    """The copy engine\'s work for one call on `rank`, in stream order (empty',
                "    when nothing is moved by it). `tensors`: this rank's inputs and symmetric",
                "    buffers by name; `epoch`: this call's epoch as an int32 (the kernels read",
                '    the same number from ctl[2])."""', "    ops = []"]
        return head + self.ce_lines + ["    return ops"]

    def _describe_slot(self) -> list[str]:
        return (["def describe_slot(site, slot):",
                 '    """Words for a stuck wait\'s slot at a site the plan does not describe '
                 "(None: the", '    runtime decodes it from the plan)."""']
                + self.describe_lines + ["    return None"])

    def _launch(self) -> list[str]:
        lines = ["def launch(rt, inputs, outputs, epoch):",
                 '    """Run one call on this rank: the copy engine\'s work on its side stream, '
                 "then", "    the kernels one after another on the caller's stream.", "",
                 "    `epoch` must be the epoch the kernels will read (the runtime counts calls "
                 "the same way).", '    """', "    sym = rt.symmetric"]
        if self.copy_engine and not any(kb.launch for kb in self.kernels):
            lines.append("    rt.copy_engine(copy_engine_ops(rt.rank, epoch, {**inputs, **sym}))")
        for kb in self.kernels:
            if kb.launch is not None:
                lines += kb.launch
                continue
            lines += kb.host_before
            args = ", ".join(kb.host.values())
            lines += [f"    rt.launch_kernel({kb.name}, ({kb.programs_const},), (",
                      f"        {args},", "    ), dict(",
                      f"        **KERNEL_CONSTS[{kb.name!r}], num_warps={kb.warps}, "
                      "**tld.launch_options(),", "    ))"]
        lines += self._copy_outputs()
        return lines

    def _copy_outputs(self) -> list[str]:
        return []


def require_category(op, category: str) -> None:
    if spec(op.kind).category != category:
        raise NotSupportedError(f"{op.kind} is not a {category} op", op.loc)
