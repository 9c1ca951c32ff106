"""The user's names in a generated module: a clash with the module's own names is refused.

A generated module spells the user's names into its identifiers (`a_full_ptr`,
`sig_a_full`, `A_FULL_SEG`, `ag_gemm_kernel`) next to names of its own (`abort_ptr`, the
`ctl` buffer, `pid`, `tl`). A tensor named `abort` would make its pointer argument the abort
word's, and the kernel would silently compute garbage. Nothing here lists reserved words,
which would drift from what the lowerings write: the module builder reports every name it
declares twice with two meanings (kernel arguments, symmetric buffers, module constants),
and `check_module` reads the rendered module for the rest (a module-level name bound twice,
a builtin shadowed, a kernel argument or a called global rebound inside a function). A
clash is blamed on the user's name it contains, with that name's source location.
"""

from __future__ import annotations

import ast
import builtins

from ..errors import PatternError, SourceLoc, TileLinkError


class Names:
    """The user's names of one bound pattern (tensors, the pattern, tile functions), with
    where each is declared, for blaming a clash on one of them."""

    def __init__(self, bp):
        self.where: dict[str, tuple[str, SourceLoc | None]] = {}
        for t in bp.pattern.inputs:
            self.where.setdefault(t.name, ("tensor", t.loc))
        for op in bp.ops:
            self.where.setdefault(op.result, ("tensor", op.loc))
        for op in bp.ops:
            if op.fn is not None:
                self.where.setdefault(op.fn, ("tile function", op.loc))
        self.where.setdefault(bp.name, ("pattern", bp.pattern.loc))

    def within(self, name: str) -> list[str]:
        """The user's names `name` is spelled from (whole, or joined by '_' to other
        words, in either case: `a_full` in `sig_a_full_ptr` and `A_FULL_SEG`), longest
        first."""
        found = []
        for user in self.where:
            for form in dict.fromkeys((user, user.upper())):
                if name == form or name.startswith(form + "_") or name.endswith("_" + form) \
                        or f"_{form}_" in name:
                    found.append(user)
                    break
        return sorted(found, key=lambda u: (-len(u), u))

    def clash(self, name: str, what: str) -> TileLinkError:
        """The error for generated name `name` meaning two things (`what` says which): a
        located PatternError on the user's name it is spelled from, or (none: a fault of
        the code generator) a TileLinkError saying so."""
        users = self.within(name)
        if not users:
            return TileLinkError(f"internal error in the code generator: {what}",
                                 hint="please report it with the pattern and the command")
        user = users[0]
        kind, loc = self.where[user]
        return PatternError(f"the {kind} name '{user}' clashes with a name of the generated "
                            f"code: {what}", _at_word(loc, user),
                            f"rename {user}: the generated code uses '{name}' for a purpose "
                            "of its own")


def check_module(text: str, names: Names, signature: dict, buffers: dict[str, list[str]]) -> None:
    """Refuse a rendered module in which a name means two things.

    `signature`: the kernels' runtime arguments (name -> type); `buffers`: kernel name ->
    the locals holding this call's copy of a double-buffered tensor (bound once each).
    Checked: every module-level name is bound once and shadows no builtin; names ending in
    `_kernel` are the kernels (the runtime finds them so); no function rebinds a runtime
    argument, or binds a name that the module binds at its level to a function, a module
    or a tile function (the function would call its own local instead)."""
    try:
        tree = ast.parse(text)
    except SyntaxError as e:
        line = text.splitlines()[e.lineno - 1] if e.lineno else ""
        raise _blame_line(names, line, f"the generated module does not parse ({e.msg}: "
                          f"{line.strip()})") from None
    bound: dict[str, tuple[int, str]] = {}  # name -> (line, how: an import's statement)
    called: set[str] = set()  # module-level functions, modules, tile functions
    kernels = set()
    for st in tree.body:
        how = ast.dump(st) if isinstance(st, (ast.Import, ast.ImportFrom)) else None
        for name in _binds(st):
            # (two lowerings importing one module is the same binding twice: fine)
            if name in bound and (how is None or bound[name][1] != how):
                raise names.clash(name, f"{name} is bound twice at module level (lines "
                                  f"{bound[name][0]} and {st.lineno})")
            if name in _BUILTINS:
                raise names.clash(name, f"{name} at module level shadows Python's builtin "
                                  f"{name}")
            bound[name] = (st.lineno, how)
            if not isinstance(st, ast.Assign) or isinstance(st.value, ast.Call):
                called.add(name)
        if isinstance(st, ast.FunctionDef) and st.decorator_list:
            kernels.add(st.name)
    for name in bound:
        if name.endswith("_kernel") and name not in kernels:
            raise names.clash(name, f"{name} ends in _kernel, the runtime's mark of a kernel, "
                              "but is not one")
    for fn in _functions(tree.body):
        _check_function(fn, names, signature, called, buffers.get(fn.name, []))


def _check_function(fn, names: Names, signature: dict, called: set[str], once: list[str]):
    params = [a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs]
    stores = list(_stores(fn.body))
    for name in params:
        if name in called:
            raise names.clash(name, f"{fn.name}'s argument {name} hides the module's {name}")
    for name, line in stores:
        if name in signature and name in params:
            raise names.clash(name, f"{fn.name} assigns its runtime argument {name} (line "
                              f"{line})")
        if name in called:
            raise names.clash(name, f"{fn.name} assigns {name} (line {line}), which hides the "
                              f"module's {name}")
    for name in once:
        lines = [line for n, line in stores if n == name]
        if len(lines) != 1:
            raise names.clash(name, f"{fn.name} assigns {name} on lines "
                              f"{', '.join(map(str, lines))}, the local of one tensor's buffer")


_BUILTINS = frozenset(dir(builtins))


def _binds(st) -> list[str]:
    """The names a module-level statement binds."""
    if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [st.name]
    if isinstance(st, (ast.Import, ast.ImportFrom)):
        return [(a.asname or a.name).split(".")[0] for a in st.names]
    if isinstance(st, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        targets = st.targets if isinstance(st, ast.Assign) else [st.target]
        return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
    return []


def _functions(body):
    """Every function defined in statements `body`, nested ones too."""
    for st in body:
        if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield st
        for block in _blocks(st):
            yield from _functions(block)
        for h in _handlers(st):
            yield from _functions(h.body)


# statement fields that hold statements (a walk over statements alone is ten times faster
# than over every node, and generated code binds names in statements only: no walrus)
_BLOCKS = ("body", "orelse", "finalbody")


def _blocks(st: ast.stmt):
    """The statement lists statement `st` holds (its body, else and finally blocks)."""
    fields_ = vars(st)  # (an AST node keeps its fields there)
    return [fields_[f] for f in _BLOCKS if isinstance(fields_.get(f), list)]


def _handlers(st: ast.stmt) -> list:
    """The except handlers of a try statement (none for other statements)."""
    return vars(st).get("handlers", [])


def _stores(body):
    """(name, line) of every name the statements `body` bind in their own scope: targets
    of assignments and loops, imports, `with ... as`, `except ... as`, nested definitions."""
    for st in body:
        if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield st.name, st.lineno
            continue
        if isinstance(st, (ast.Import, ast.ImportFrom)):
            for a in st.names:
                yield (a.asname or a.name).split(".")[0], st.lineno
            continue
        targets = st.targets if isinstance(st, ast.Assign) else \
            [st.target] if isinstance(st, (ast.AugAssign, ast.AnnAssign, ast.For,
                                           ast.AsyncFor)) else \
            [i.optional_vars for i in st.items if i.optional_vars is not None] \
            if isinstance(st, (ast.With, ast.AsyncWith)) else []
        for t in targets:
            for n in _target_names(t):
                yield n, st.lineno
        for block in _blocks(st):
            yield from _stores(block)
        for h in _handlers(st):
            if h.name:
                yield h.name, h.lineno
            yield from _stores(h.body)


def _target_names(t):
    if isinstance(t, ast.Name):
        yield t.id
    elif isinstance(t, (ast.Tuple, ast.List)):
        for e in t.elts:
            yield from _target_names(e)
    elif isinstance(t, ast.Starred):
        yield from _target_names(t.value)


def _at_word(loc: SourceLoc | None, word: str) -> SourceLoc | None:
    """`loc` moved to where its line spells `word` (an op's location is its call; the
    result's name is left of it), if it does."""
    line = loc.source_line() if loc else None
    if not line:
        return loc
    at = next((i for i in range(len(line)) if line.startswith(word, i)
               and not _word_char(line[i - 1:i]) and not _word_char(line[i + len(word):][:1])),
              None)
    if at is None:
        return loc
    return SourceLoc(loc.file, loc.line, at + 1, loc.text)


def _word_char(ch: str) -> bool:
    return bool(ch) and (ch.isalnum() or ch == "_")


def _blame_line(names: Names, line: str, what: str) -> TileLinkError:
    """A clash on a line that does not parse: blamed on a user name it spells, if any."""
    for word in sorted(set(_words(line)), key=len, reverse=True):
        if names.within(word):
            return names.clash(word, what)
    return names.clash("", what)


def _words(line: str) -> list[str]:
    word, out = "", []
    for ch in line + " ":
        if ch.isidentifier() or (word and ch.isalnum()):
            word += ch
        else:
            if word:
                out.append(word)
            word = ""
    return out
