"""A model's joint choices (tilelink.model.tune's measured picks, or the joint decision's) kept
in a JSON file, for later processes: one file per (GPU, world size, model), named by the user.

    tkm.tune(layer, forward, [2048, 4096], save="llama8b-tp4-h200.json")   # once
    tkm.prepare(layer, tokens=[2048, 4096], choices="llama8b-tp4-h200.json")  # every run

A file records the GPU's name, the world size, the torch / triton / tilelink versions and,
per op shape (kind, N, K, dtype) and row count, the schedule overrides eager calls run. A
file of another GPU or world size is refused with a warning and changes nothing (its picks
were measured elsewhere); one of other versions is used with a warning (the picks may no
longer be the fastest). Entries whose overrides no longer parse are skipped with a warning.
Writes are atomic (a temporary file, then a rename).
"""

from __future__ import annotations

import json
import os
import tempfile
import warnings
from pathlib import Path

import torch

from . import plans

FORMAT = 1


class ChoicesWarning(UserWarning):
    """A saved-choices file, or one of its entries, was not used."""


def device_name(shape) -> str:
    """The GPU's name for a CUDA shape ("cpu" for the CPU)."""
    if shape.device.type == "cuda":
        return torch.cuda.get_device_name(shape.device)
    return shape.device.type


def _key(shape) -> list:
    return [shape.kind, shape.n, shape.k, str(shape.dtype).replace("torch.", "")]


def save(path, shapes: list, rows=None) -> int:
    """Write the current scope's choices for `shapes` (the model's op shapes; `rows`: only
    these row counts, None every one) to `path`; returns how many entries it wrote. A file
    already there for this GPU and world size keeps its entries for other (op, rows): one
    file gathers a model's token counts tuned one call at a time."""
    from ..schedule.tuned import versions

    order = list(dict.fromkeys(shapes))
    if not order:
        raise ValueError("no op shapes to save choices for")
    keep = None if rows is None else {int(r) for r in rows}
    entries = []
    for (s, r, scope), (override, note) in sorted(plans.CHOICES.items(),
                                                  key=lambda kv: str(kv[0])):
        if scope == plans.OVERRIDE and s in order and (keep is None or r in keep):
            entries.append({"op": _key(s), "rows": r, "override": dict(override),
                            "note": note})
    record = {"format": FORMAT, "device": device_name(order[0]),
              "world": plans.world_size(order[0].group_name), "versions": versions(),
              "entries": entries}
    path = Path(path)
    try:
        old = _read(path)
    except (OSError, ValueError):
        old = None  # (none yet, or not one to keep: replaced)
    if old is not None and (old.get("device"), old.get("world")) == (record["device"],
                                                                    record["world"]):
        mine = {(tuple(e["op"]), e["rows"]) for e in entries}
        kept = [e for e in old["entries"] if isinstance(e, dict) and
                (tuple(e.get("op", ())), e.get("rows")) not in mine]
        record["entries"] = kept + entries
    fd, tmp = tempfile.mkstemp(dir=path.parent or ".", prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(record, f, indent=1)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return len(entries)


def _read(path) -> dict:
    record = json.loads(Path(path).read_text())
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise ValueError(f"not a format-{FORMAT} choices file")
    if not isinstance(record.get("entries"), list):
        raise ValueError("'entries' is not a list")
    return record


def _read_on_rank0(path, shape):
    """(the file's record, or the error reading it) as rank 0 of the shape's group read it,
    on every rank: the ranks must record the same choices or they build different ops."""
    import torch.distributed as dist

    def read():
        try:
            return _read(path), None
        except (OSError, ValueError) as e:
            return None, str(e)

    if not dist.is_initialized():
        return read()
    group = plans.resolve_group(shape.group_name)
    box = [read() if dist.get_rank(group) == 0 else None]
    dist.broadcast_object_list(box, src=dist.get_global_rank(group, 0), group=group,
                               device=shape.device if shape.device.type == "cuda" else None)
    return box[0]


def load(path, shapes: list, rows=None) -> int:
    """Record the choices `path` holds for `shapes` (the model's op shapes; `rows`: only these
    row counts, None every one) in the current scope; returns how many it recorded (0, with
    a ChoicesWarning, where the file is not usable here). Collective where torch.distributed
    is initialised: rank 0 of the group reads the file for every rank."""
    from ..schedule.config import Config
    from ..schedule.tuned import versions

    order = list(dict.fromkeys(shapes))
    if not order:
        return 0
    record, error = _read_on_rank0(path, order[0])
    if record is None:
        warnings.warn(f"saved choices {path}: not used ({error})", ChoicesWarning,
                      stacklevel=3)
        return 0
    entries = record["entries"]
    keep = None if rows is None else {int(r) for r in rows}
    here = {"device": device_name(order[0]), "world": plans.world_size(order[0].group_name)}
    for what, value in here.items():
        if record.get(what) != value:
            warnings.warn(f"saved choices {path}: measured on {what} {record.get(what)!r}, "
                          f"this run has {value!r}: not used", ChoicesWarning, stacklevel=3)
            return 0
    if record.get("versions") != versions():
        warnings.warn(f"saved choices {path}: saved with {record.get('versions')}, this run "
                      f"has {versions()}: used, but they may no longer be the fastest "
                      "(tilelink.model.tune measures again)", ChoicesWarning, stacklevel=3)
    by_key = {tuple(_key(s)): s for s in order}
    n = 0
    for e in entries:
        try:
            s = by_key.get(tuple(e["op"]))
            rows, override = int(e["rows"]), dict(e["override"])
            Config().with_values({k: str(v) for k, v in override.items()})
        except Exception as err:  # noqa: BLE001  (a bad entry is skipped, with why)
            warnings.warn(f"saved choices {path}: entry {e!r} skipped ({err})",
                          ChoicesWarning, stacklevel=3)
            continue
        if s is None or (keep is not None and rows not in keep):
            continue  # an op this model does not have, or rows not being prepared
        plans.record(s, rows, tuple(sorted((k, str(v)) for k, v in override.items())),
                     f"{e.get('note', '')} (from {path})".strip())
        n += 1
    return n
