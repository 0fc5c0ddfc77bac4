"""Host-synchronisation audit of the runner's hot path, on any machine (a CPU-only one included).

On a GPU the host synchronises with the device (waits for every queued kernel) when it
- reads a value of a device tensor: ``.item()``, ``int()`` / ``float()`` / ``bool()`` /
  ``__index__``, ``.tolist()``, ``.numpy()``, ``torch.equal``, a device scalar handed to
  an argument that wants a number (``torch.arange(t)``, ``masked_fill(mask, t)``);
- runs an op whose output size depends on device data: ``nonzero`` / ``argwhere`` /
  one-argument ``where``, boolean-mask indexing (``t[mask]``, ``t[mask] = values``,
  ``index_put_``; ``t[mask] = scalar`` is the exception: it becomes ``masked_fill_``),
  ``masked_select``, ``unique`` and friends, ``bincount``, ``repeat_interleave`` with
  tensor repeats and no ``output_size``;
- copies between host and device without ``non_blocking=True``: ``.cpu()``,
  ``torch.tensor(data, device=dev)``, ``.to(dev)``, ``dev_tensor[i] = 5`` (PyTorch
  follows a blocking copy with a stream synchronisation).

On the CPU every tensor is host memory and none of this is visible, so the audit tracks
which tensors *would* be on the device (taint) and reports those ops when a tainted
tensor takes part, with the Python location of the call.

Taint (``SyncAudit.is_device``):
- seeded: the persistent device state (``runner_device_tensors``): request and sampling
  tables (the ``.gpu`` side of every ``StagedWriteTensor``), the input buffers' device
  outputs, KV caches, ModelState row buffers, model and draft-model parameters, buffers
  and tensor attributes;
- created: a call with an explicit ``device=`` (any device but one spelled ``"cpu"``:
  host tensors are made without one, or with the string), ``.to(device)`` of a host tensor
  (an H2D copy; ``non_blocking=True`` makes it sync-free) and ``torch.tensor(data,
  device=...)``. ``.to(device)`` returns its input on the CPU: the audit returns a view of
  it instead, so that the device copy is tainted while the host original is not;
- propagated: a torch call or aten op with a tainted input taints its outputs, and an
  in-place op, ``out=`` or ``copy_`` taints what it writes; an allocation made inside a
  torch call that has device inputs (a composite op's temporary) is on the device.
- moved back: a blocking D2H copy (``.cpu()``, ``.to("cpu")``, ``host.copy_(dev)``) is
  reported and its result is host data; a non-blocking one is not reported, but the host
  memory it writes counts as device memory (its storage is tainted, so every view of it
  is) until an event says the copy finished, which the audit never sees: reading it is
  reported. The engine reads step results in ``AsyncOutput.get`` outside the step, which
  ``count_host_syncs`` does not audit.

UvaBackedTensor (a host table snapshotted to the device each step): its ``.cpu`` is host
memory the host writes from host values (rows, offsets), and reads of it are host reads;
its ``.gpu`` is the device copy. On a GPU they are two tensors and ``.gpu`` is seeded. On
the CPU ``.gpu is .cpu``: seeding it would report every read of the host mirror, which on
a GPU is none, so the audit leaves the shared tensor host and taints what ``snapshot()``
returns (the view the runner uses as the device copy) instead. The host mirror becomes
device memory only if the step writes device data into it (by the rules above), which on
a GPU would be a D2H copy into it.

Not modelled: code that skips a copy on the CPU by branching on the device type (as
``host_to_device`` does) leaves its result host, so ops mixing it with device tensors look
like host work (indexing a device tensor with a host index tensor or list, a blocking H2D
copy on a GPU, is therefore not reported); syncs inside Triton or CUDA-only paths, which
the CPU never runs; ``torch.device("cpu")`` objects are taken for the runner's device.
"""
from __future__ import annotations

import sys
import sysconfig
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import torch
from torch.overrides import TorchFunctionMode, resolve_name
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakIdKeyDictionary

from core_runner.step_data.buffers import StagedWriteTensor, UvaBackedTensor

ROOT = Path(__file__).resolve().parents[2]
# where a sync's location is looked for: the innermost frame in one of these (repo-relative)
DEFAULT_ROOTS = ("core_runner/", "model_states/", "plugins/")
_SELF = Path(__file__).resolve()
_SKIP_DIRS = (Path(torch.__file__).resolve().parent, Path(sysconfig.get_paths()["stdlib"]).resolve())

# torch calls (Python level) that hand a device value to Python
_READS = frozenset({
    "Tensor.item", "Tensor.tolist", "Tensor.__bool__", "Tensor.__int__", "Tensor.__float__", "Tensor.__index__",
    "Tensor.__complex__", "Tensor.numpy", "Tensor.__array__", "Tensor.__format__", "Tensor.__repr__",
    "Tensor.__contains__", "Tensor.equal", "torch.equal", "Tensor.allclose", "torch.allclose",
    "Tensor.is_nonzero", "torch.is_nonzero",
})
# torch calls that build a tensor from data (a copy onto the tensor's device)
_FROM_DATA = frozenset({"torch.tensor", "torch.as_tensor", "torch.asarray", "Tensor.new_tensor"})
# aten ops whose output size is the count of something in their (device) input
_SHAPE_OPS = frozenset({
    "nonzero", "nonzero_numpy", "argwhere", "masked_select", "_unique", "_unique2", "unique_dim",
    "unique_consecutive", "unique_dim_consecutive", "bincount",
})
# aten ops that read a device scalar on the host (the first three: what ``.item()`` and the
# number conversions become; ``masked_fill`` with a tensor value calls ``value.item()``)
_SCALAR_OPS = frozenset({"_local_scalar_dense", "item", "is_nonzero", "equal", "allclose"})
_INDEX_OPS = frozenset({"index", "index_put", "index_put_", "_index_put_impl_", "_unsafe_index"})


@dataclass(frozen=True)
class Sync:
    """One host synchronisation: what synced and where."""

    op: str  # "<the torch call>: <why it syncs>", e.g. "Tensor.__getitem__: boolean mask"
    kind: str  # "read" (a device value reaches Python), "shape" (data-dependent size), "copy" (blocking copy)
    path: str  # repo-relative file of the innermost frame under the audit's roots (else the caller)
    line: int
    func: str
    stack: tuple[str, ...]  # "path:line in func" of the frames under the roots, innermost first

    @property
    def site(self) -> tuple[str, str, str]:
        """(path, function, op): a location that survives edits elsewhere in the file."""
        return self.path, self.func, self.op

    def __str__(self) -> str:
        return f"{self.path}:{self.line} in {self.func}: {self.op}"


def _tensors(obj: Any) -> Iterator[torch.Tensor]:
    """Every tensor in obj (nested lists, tuples, dicts)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            yield from _tensors(x)
    elif isinstance(obj, dict):
        for x in obj.values():
            yield from _tensors(x)


def _target(device: Any) -> str | None:
    """Where a ``device=`` argument puts a tensor: "device", "host", or None when not given
    (see the module docstring)."""
    if device is None:
        return None
    if isinstance(device, str):
        return "host" if device.split(":")[0] == "cpu" else "device"
    return "device"


class _Call:
    """The torch call running at the Python level (calls made inside it are not seen by
    the function mode, only their aten ops by the dispatch mode)."""

    __slots__ = ("name", "device", "flagged")

    def __init__(self, name: str, device: bool) -> None:
        self.name, self.device, self.flagged = name, device, False


class _FunctionMode(TorchFunctionMode):
    def __init__(self, audit: "SyncAudit") -> None:
        super().__init__()
        self.audit = audit

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return self.audit._on_call(func, args, kwargs or {})


class _DispatchMode(TorchDispatchMode):
    def __init__(self, audit: "SyncAudit") -> None:
        super().__init__()
        self.audit = audit

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        # the audit's own tensor calls must not re-enter the function mode
        with torch._C.DisableTorchFunction():
            return self.audit._on_op(func, args, kwargs or {})


class SyncAudit:
    """Taint tracking plus the record of syncs (see the module docstring).

    ``tracking()`` audits every torch call made inside it; ``count_host_syncs(runner)``
    wraps ``runner.execute_model`` so that only steps are audited."""

    def __init__(self, roots: Iterable[str] = DEFAULT_ROOTS, depth: int = 6) -> None:
        self.roots = tuple(roots)
        self.depth = depth
        self.events: list[Sync] = []
        self.steps = 0  # execute_model calls audited (count_host_syncs)
        self._device = WeakIdKeyDictionary()
        # host storages written by a non-blocking D2H copy (held, so their address is not reused)
        self._written: dict[int, torch.UntypedStorage] = {}
        self._calls: list[_Call] = []
        self._paths: dict[str, str | None] = {}
        self._names: dict[Any, str] = {}
        self._writes: dict[Any, tuple[tuple[int, str], ...]] = {}

    # ---- taint --------------------------------------------------------------------------
    def mark(self, *objs: Any) -> None:
        """Taint every tensor in objs (device memory from now on)."""
        for t in _tensors(objs):
            self._device[t] = True

    def is_device(self, t: torch.Tensor) -> bool:
        if t in self._device:
            return True
        if not self._written:
            return False
        storage = t.untyped_storage()
        return storage.nbytes() > 0 and storage.data_ptr() in self._written

    def _any_device(self, tensors: list[torch.Tensor]) -> bool:
        return any(self.is_device(t) for t in tensors)

    def _written_by_device(self, t: torch.Tensor) -> None:
        """Device data landed in t: t is device memory, and so is every view of a host buffer."""
        if self.is_device(t):
            return
        self._device[t] = True
        storage = t.untyped_storage()
        if storage.nbytes() > 0:
            self._written[storage.data_ptr()] = storage

    # ---- recording ------------------------------------------------------------------------
    def _rel(self, filename: str) -> str | None:
        """Repo-relative path of a frame's file; None for torch, the stdlib and this module."""
        if filename not in self._paths:
            rel = None
            if not filename.startswith("<"):
                p = Path(filename).resolve()
                if p != _SELF and not any(p.is_relative_to(d) for d in _SKIP_DIRS):
                    rel = p.relative_to(ROOT).as_posix() if p.is_relative_to(ROOT) else str(p)
            self._paths[filename] = rel
        return self._paths[filename]

    def _record(self, detail: str, kind: str) -> None:
        call = self._calls[-1] if self._calls else None
        if call is not None and call.flagged:
            return  # one sync per torch call: its aten ops would report the same line again
        frames = []
        f = sys._getframe(1)
        while f is not None:
            rel = self._rel(f.f_code.co_filename)
            if rel is not None:
                frames.append((rel, f.f_lineno, f.f_code.co_name))
            f = f.f_back
        mine = [fr for fr in frames if fr[0].startswith(self.roots)] or frames or [("?", 0, "?")]
        stack = tuple(f"{p}:{n} in {fn}" for p, n, fn in mine[: self.depth])
        name = call.name if call is not None else "aten"
        self.events.append(Sync(f"{name}: {detail}", kind, *mine[0], stack))
        if call is not None:
            call.flagged = True

    # ---- the Python level (torch function mode) --------------------------------------------
    def _name(self, func: Callable) -> str:
        if func not in self._names:
            name = resolve_name(func) or getattr(func, "__qualname__", repr(func))
            name = name.removesuffix(".__get__")  # properties: Tensor.data
            if name.startswith("torch.functional."):  # torch.unique is torch.functional.unique
                name = "torch." + name.removeprefix("torch.functional.")
            self._names[func] = name.removeprefix("torch.") if name.startswith("torch.Tensor.") else name
        return self._names[func]

    def _on_call(self, func: Callable, args: tuple, kwargs: dict) -> Any:
        name = self._name(func)
        inputs = list(_tensors((args, kwargs)))
        call = _Call(name, self._any_device(inputs))
        self._calls.append(call)
        try:
            if name in _READS:
                if call.device:
                    self._record("device value read", "read")
                return func(*args, **kwargs)
            if name in ("Tensor.to", "Tensor.cpu"):
                return self._move(func, name, args, kwargs, call.device)
            if name in _FROM_DATA:
                return self._from_data(func, name, args, kwargs)
            out = func(*args, **kwargs)
            where = "host" if kwargs.get("pin_memory") else _target(kwargs.get("device"))
            if where == "device" or (where is None and call.device):
                # new tensors only: an in-place op returns its target, whose taint the
                # dispatch level decides (a blocking copy into host memory leaves it host)
                seen = {id(t) for t in inputs}
                self.mark(*(t for t in _tensors(out) if id(t) not in seen))
            return out
        finally:
            self._calls.pop()

    def _move(self, func: Callable, name: str, args: tuple, kwargs: dict, src_device: bool) -> Any:
        """``.to(...)`` / ``.cpu()``: H2D, D2H, or no move at all (a dtype change)."""
        src = args[0]
        non_blocking = bool(kwargs.get("non_blocking", False))
        where = "host" if name == "Tensor.cpu" else _target(kwargs.get("device"))
        for a in args[1:]:
            if isinstance(a, bool):
                non_blocking = a
            elif isinstance(a, torch.Tensor):  # .to(other): other's device
                where = "device" if self.is_device(a) else "host"
            elif isinstance(a, (torch.device, str, int)):
                where = _target(a)
        out = func(*args, **kwargs)
        if where is None or (where == "device") == src_device:
            if src_device and out is not src:
                self.mark(out)
            return out
        if where == "host":
            if non_blocking:  # D2H in flight: the result is device memory until an event says otherwise
                self.mark(out)
                return out
            self._record("blocking D2H copy", "copy")
            if out is src:  # the CPU returns the input itself: hand back a host view of it
                out = out.view_as(out)
            self._device.pop(out, None)
            return out
        if not non_blocking:
            self._record("blocking H2D copy", "copy")
        if out is src:  # the CPU returns the input itself: the device copy is a view of it
            out = out.view_as(out)
        self.mark(out)
        return out

    def _from_data(self, func: Callable, name: str, args: tuple, kwargs: dict) -> Any:
        """``torch.tensor(data, device=...)`` and friends: a copy of data onto a device."""
        method = name.startswith("Tensor.")
        data = (args[1] if len(args) > 1 else kwargs.get("data")) if method else (args[0] if args else None)
        data_device = self._any_device(list(_tensors(data)))
        where = _target(kwargs.get("device"))
        if where is None:
            if method:
                where = "device" if self.is_device(args[0]) else "host"
            else:  # a tensor's copy stays on its device; Python data is built on the host
                where = "device" if isinstance(data, torch.Tensor) and data_device else "host"
        if where == "device" and not data_device:
            self._record("blocking H2D copy", "copy")
        elif where == "host" and isinstance(data, torch.Tensor) and data_device:
            self._record("blocking D2H copy", "copy")
        out = func(*args, **kwargs)
        if where == "device":
            self.mark(out)
        else:
            self._device.pop(out, None)
        return out

    # ---- the aten level (dispatch mode) -----------------------------------------------------
    def _written_args(self, func: Any) -> tuple[tuple[int, str], ...]:
        """(position, name) of the arguments the op writes (in-place target, out=)."""
        if func not in self._writes:
            self._writes[func] = tuple((i, a.name) for i, a in enumerate(func._schema.arguments)
                                       if a.alias_info is not None and a.alias_info.is_write)
        return self._writes[func]

    def _on_op(self, func: Any, args: tuple, kwargs: dict) -> Any:
        op = func._schema.name.split("::")[-1]
        inputs = list(_tensors((args, kwargs)))
        device_in = self._any_device(inputs)
        if op == "copy_":
            return self._copy(func, args, kwargs)
        if device_in:
            why = self._op_sync(op, func._overloadname, args, kwargs)
            if why is not None:
                self._record(*why)
        out = func(*args, **kwargs)
        call = self._calls[-1] if self._calls else None
        if device_in:  # outputs of an op on device data are device data, and so is what it writes
            self.mark(out)
            for i, name in self._written_args(func):
                for t in _tensors(args[i] if i < len(args) else kwargs.get(name)):
                    self._written_by_device(t)
        elif not inputs and call is not None and call.device:
            # an allocation made by a torch call over device inputs is a composite op's
            # temporary, made with their options; a 0-dim one is a Python number ATen
            # wraps, which it keeps on the host
            self.mark(*(t for t in _tensors(out) if t.dim() > 0))
        return out

    def _op_sync(self, op: str, overload: str, args: tuple, kwargs: dict) -> tuple[str, str] | None:
        """(why, kind) when this aten op, with a device input, syncs the host."""
        if op in _SCALAR_OPS:
            return "device scalar read", "read"
        if op in _SHAPE_OPS or (op == "where" and len(args) == 1):
            return f"data-dependent shape (aten.{op})", "shape"
        if op == "repeat_interleave" and overload in ("Tensor", "self_Tensor") and kwargs.get("output_size") is None:
            repeats = args[0] if overload == "Tensor" else (args[1] if len(args) > 1 else kwargs.get("repeats"))
            if isinstance(repeats, torch.Tensor) and self.is_device(repeats):
                return "data-dependent shape (repeat_interleave without output_size)", "shape"
        if op in _INDEX_OPS:
            indices = [i for i in args[1] if i is not None]
            masks = [i for i in indices if i.dtype in (torch.bool, torch.uint8)]
            if any(self.is_device(m) for m in masks) and not self._is_masked_fill(op, args, kwargs, indices):
                return "boolean mask", "shape"
        if op in ("masked_fill", "masked_fill_") and overload == "Tensor" and self.is_device(args[2]):
            return "device scalar value", "read"
        return None

    def _is_masked_fill(self, op: str, args: tuple, kwargs: dict, indices: list[torch.Tensor]) -> bool:
        """``t[mask] = scalar``: index_put_ with one mask and a one-element host value and no
        accumulation runs as masked_fill_ (no sync)."""
        if op not in ("index_put", "index_put_", "_index_put_impl_"):
            return False
        value = args[2]
        accumulate = args[3] if len(args) > 3 else kwargs.get("accumulate", False)
        return len(indices) == 1 and value.numel() == 1 and not self.is_device(value) and not accumulate

    def _copy(self, func: Any, args: tuple, kwargs: dict) -> Any:
        dst, src = args[0], args[1]
        non_blocking = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
        dst_device, src_device = self.is_device(dst), self.is_device(src)
        if src_device and not dst_device:
            if non_blocking:
                self._written_by_device(dst)
            else:
                self._record("blocking D2H copy", "copy")
        elif dst_device and not src_device and not non_blocking:
            self._record("blocking H2D copy", "copy")
        return func(*args, **kwargs)

    # ---- running ----------------------------------------------------------------------------
    @contextmanager
    def tracking(self) -> Iterator["SyncAudit"]:
        """Audit every torch call made inside (this thread)."""
        snapshot = UvaBackedTensor.snapshot
        audit = self

        def tainted_snapshot(uva: UvaBackedTensor, n: int | None = None) -> torch.Tensor:
            view = snapshot(uva, n)
            audit.mark(view)  # the device copy; on the CPU a view of the host mirror
            return view

        UvaBackedTensor.snapshot = tainted_snapshot
        try:
            with _FunctionMode(self), _DispatchMode(self):
                yield self
        finally:
            UvaBackedTensor.snapshot = snapshot

    def sites(self) -> set[tuple[str, str, str]]:
        return {e.site for e in self.events}

    def report(self) -> str:
        """One line per distinct sync (with its count), then each one's stack."""
        if not self.events:
            return f"no host syncs in {self.steps} audited step(s)"
        counts = Counter(str(e) for e in self.events)
        first = {}
        for e in self.events:
            first.setdefault(str(e), e)
        lines = [f"{sum(counts.values())} host sync(s) in {self.steps} audited step(s):"]
        for key, n in counts.items():
            lines.append(f"  {n:4d} x {key}")
            lines.extend(f"           {s}" for s in first[key].stack[1:])
        return "\n".join(lines)


def _module_tensors(model: torch.nn.Module) -> Iterator[torch.Tensor]:
    """Parameters, buffers and tensor attributes (a bound kv_cache, a rotary table) of every submodule."""
    for m in model.modules():
        yield from m.parameters(recurse=False)
        yield from m.buffers(recurse=False)
        for v in vars(m).values():
            if isinstance(v, (torch.Tensor, list, tuple)):
                yield from _tensors(v)


def _device_side(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, StagedWriteTensor):
        yield obj.gpu
    elif isinstance(obj, UvaBackedTensor) and obj.gpu is not obj.cpu:  # see the module docstring
        yield obj.gpu


def runner_device_tensors(runner: Any) -> list[torch.Tensor]:
    """The persistent device state of a ModelRunner (what the audit seeds at each step)."""
    out = [*runner.req_state.tables().values(), *runner.sampling.tables().values(), *runner.inputs.out.values()]
    out += _tensors(runner.kv_caches)
    out += runner.model_state.row_buffers().values()
    out += _device_side(runner.inputs.host)
    for v in vars(runner.model_state).values():  # a ModelState's own staged or UVA tables
        out += _device_side(v)
    out += _module_tensors(runner.model)
    if runner.drafter is not None:
        out += _module_tensors(runner.drafter.model)
    return out


@contextmanager
def count_host_syncs(runner: Any, roots: Iterable[str] = DEFAULT_ROOTS) -> Iterator[SyncAudit]:
    """Audit every ``runner.execute_model`` call made inside the block (engine steps, dummy
    runs); ``.events`` lists the syncs. Work outside a step (the scheduler, the engine's
    ``AsyncOutput.get`` that reads the previous step's results) is not audited. Taint
    carries from step to step: host memory a step leaves device data in stays device."""
    audit = SyncAudit(roots)
    patched = "execute_model" in vars(runner)
    inner = runner.execute_model

    def execute_model(*args: Any, **kwargs: Any) -> Any:
        audit.steps += 1
        audit.mark(runner_device_tensors(runner))
        with audit.tracking():
            return inner(*args, **kwargs)

    runner.execute_model = execute_model
    try:
        yield audit
    finally:
        if patched:
            runner.execute_model = inner
        else:
            del runner.execute_model
