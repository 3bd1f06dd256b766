"""Abort points between a stage's layers: a survivor of a failure stops its step within one layer.

Contract: :class:`AbortPoints` registers hooks once, on a stage module's *layers*: the children of
every ``nn.ModuleList`` in the module (transformer blocks, for the reference model and Hugging Face
models alike), or the module's own children where it has none. While the step loop runs
``with points.armed(stop):``, ``stop()`` is called before each layer's forward and, in the backward,
when the gradient of each layer's output is ready (just before that layer's backward). ``stop`` raises
to abandon the step (the worker's raises :class:`~tmslurm.core.errors.CommAborted` once the controller has
said ``abort``); the exception leaves the forward or the backward and reaches the caller, which drops
the gradients. Nothing is applied in a forward or backward, so stopping there loses only that step's
work, which an aborted step loses anyway. Disarmed (outside ``armed``, or ``stop=None``), every hook
returns at once. The hooks never change a value.

Why: before, a survivor noticed an abort only at its next communication call, so one that was
computing its own pipeline's backward (unaffected by the dead rank until the data-parallel reduction)
finished a whole micro-batch's backward first: 0.28-0.55 s at 1.4 GB per rank, all on the SIGKILL
pause's critical path (benchmarks.md section 12).

Under ``torch.compile`` the hooks of layers inside the compiled region are traced as no-ops
(``torch.compiler.is_compiling()``), so a compiled stage keeps its graphs and stops only at
communication calls, as before. On CUDA a check runs when the layer's kernels are *launched*, which
is still before the kernels that follow it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

Stop = Callable[[], None]


def layers_of(module: nn.Module) -> list[nn.Module]:
    """The children of every ModuleList in ``module``, or ``module``'s children where it has none."""
    found = [child for m in module.modules() if isinstance(m, nn.ModuleList) for child in m.children()]
    return found or list(module.children())


class AbortPoints:
    def __init__(self, module: nn.Module) -> None:
        self._stop: Stop | None = None
        """The armed check; None between steps."""
        self.layers = layers_of(module)
        for layer in self.layers:
            layer.register_forward_pre_hook(self._before_forward)
            layer.register_forward_hook(self._after_forward)

    @contextmanager
    def armed(self, stop: Stop | None) -> Iterator[None]:
        self._stop = stop
        try:
            yield
        finally:
            self._stop = None

    def _check(self) -> None:
        if self._stop is not None:
            self._stop()

    def _before_forward(self, module: nn.Module, args: Any) -> None:
        if not torch.compiler.is_compiling():
            self._check()

    def _after_forward(self, module: nn.Module, args: Any, output: Any) -> None:
        if torch.compiler.is_compiling() or self._stop is None:
            return
        out = _first_tensor(output)
        if out is not None and out.requires_grad:
            out.register_hook(self._on_grad)

    def _on_grad(self, grad: torch.Tensor) -> None:
        self._check()


def _first_tensor(output: Any) -> torch.Tensor | None:
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    return None
