"""One flat host buffer that holds the parameters and optimizer moments of a standby's warm runners.

Contract: a universal standby keeps one warm :class:`~tmslurm.train.schedule.StageRunner` per shape
class (module, optimizer and compiled graphs), but only one class is ever joined, and a join replaces
every parameter and moment (``load_state``). So the classes need not hold storage of their own:
:meth:`Arena.bind` re-binds a runner's parameters (``p.data``) and its optimizer's tensor state
(AdamW's ``exp_avg``, ``exp_avg_sq``; 0-dim step counts stay where they are; the runner lists them,
``host_slots``: a sharded runner gives its flat parameter buffer, whose views it re-derives, and the
moments of its slice and its buddy's) to non-overlapping,
64-byte-aligned views of one buffer, copying their values. Every bound runner's views start at offset
0 of the same buffer, so the runners alias each other: what one writes, the others see. That is
allowed because a warm runner's values mean nothing until its class is joined and its state loaded.
The buffer is sized to the largest bound class: binding a larger runner allocates a bigger buffer and
re-binds the runners bound before (their values are not kept). The standby then holds the storage of
one class, not one per class. While the next class warms up with storage of its own, :meth:`release`
frees the buffer's memory (its storage is resized to 0 bytes; every bound view keeps its shape, and
must not be read until the next :meth:`bind` gives the storage back). :meth:`bind` copies one tensor
at a time, drops the runner's own tensor as it goes and trims the heap every :data:`TRIM_BYTES`, so
binding holds the buffer plus at most that much, not two copies of the class: a standby's peak is one
class plus one warm-up step, as a rank's is.

Compiled graphs survive a re-bind: shapes, strides and dtypes are unchanged (dynamo guards on those,
not on addresses), which ``tests/unit/test_arena.py`` checks by counting graphs. Gradients are not
bound (they are dropped between steps). Tensors on a device other than the host are not bound (the
arena is host memory; on CUDA the runner keeps its own storage). :meth:`bind` raises ValueError on a
runner with no parameters; it never loses a value a caller could read afterwards except by the
aliasing described above.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
from collections.abc import Iterator
from typing import Any

import torch

log = logging.getLogger(__name__)

ALIGN = 64
TRIM_BYTES = 64 << 20
"""While binding, the heap is trimmed after each this many bytes of the runner's own tensors are
freed. glibc serves tensors under its mmap threshold (which rises to 32 MiB once a large chunk was
freed) from the heap, and a freed heap chunk stays in RSS until ``malloc_trim``. Trimmed only at the
end, a bind held the whole class twice: a standby's peak at model=large was its warm-up RSS plus the
1.3 GB arena (4.4 GB, 1.25x the largest rank's)."""


class Arena:
    def __init__(self) -> None:
        self.buffer = torch.empty(0, dtype=torch.uint8)
        self.bound: list[Any] = []

    @property
    def nbytes(self) -> int:
        return self.buffer.numel()

    def bind(self, runner: Any) -> int:
        """Re-bind ``runner``'s host parameters and moments into the arena; returns the bytes they take."""
        slots: list[Slot | None] = list(_slots(runner))
        if not slots:
            raise ValueError("a runner with no host parameters cannot be bound to an arena")
        need = _layout_bytes(s[1] for s in slots if s is not None)
        if need > self.nbytes:
            self.buffer = torch.empty(need, dtype=torch.uint8)
            for earlier in self.bound:
                _rebind(list(_slots(earlier)), self.buffer, copy=False)
        elif self.released:
            self.buffer.untyped_storage().resize_(self.nbytes)
        _rebind(slots, self.buffer, copy=True)
        self.bound.append(runner)
        release_free_memory()
        return need

    @property
    def released(self) -> bool:
        """The buffer's memory is freed (:meth:`release`) and not yet given back by :meth:`bind`."""
        return self.buffer.untyped_storage().nbytes() < self.nbytes

    def release(self) -> None:
        """Free the buffer's memory; the bound runners keep their views (shapes, strides, graphs)."""
        self.buffer.untyped_storage().resize_(0)
        release_free_memory()


Slot = tuple[Any, torch.Tensor]
"""(where the tensor lives: a Parameter, an (optimizer state dict, key) pair, or a callable that
takes the new view, the tensor)."""


def _slots(runner: Any) -> Iterator[Slot]:
    """The runner's host tensors the arena may re-bind (``StageRunner.host_slots``)."""
    return runner.host_slots()


def _layout_bytes(tensors: Iterator[torch.Tensor]) -> int:
    return sum(_aligned(t.numel() * t.element_size()) for t in tensors)


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _rebind(slots: list[Slot | None], buffer: torch.Tensor, copy: bool) -> None:
    """Point every slot at its view of ``buffer`` (copying its values with ``copy``). Each slot's entry
    is cleared as it is done, so the caller's list does not keep the old tensors alive."""
    offset = freed = 0
    for i, slot in enumerate(slots):
        assert slot is not None
        where, t = slot
        slots[i] = None
        n = t.numel() * t.element_size()
        view = buffer[offset : offset + n].view(t.dtype).view(t.shape)
        if copy:
            view.copy_(t)
        if isinstance(where, torch.nn.Parameter):
            where.data = view
        elif callable(where):
            where(view)
        else:
            state, key = where
            state[key] = view
        del t, slot  # the runner's own tensor goes now, not at the end of the loop
        offset += _aligned(n)
        freed += n
        if freed >= TRIM_BYTES:  # freed heap chunks count in RSS until trimmed (see TRIM_BYTES)
            release_free_memory()
            freed = 0


def release_free_memory() -> None:
    """Give freed heap memory back to the system (glibc ``malloc_trim``), so RSS shows what is held."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.lru_cache(maxsize=1)
def _malloc_trim() -> Any:
    """libc's ``malloc_trim``, or None where there is none (looked up once: ``find_library`` may run ldconfig)."""
    name = ctypes.util.find_library("c")
    try:
        return None if name is None else ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        log.debug("malloc_trim is not available here")
        return None
