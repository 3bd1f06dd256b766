"""Slurm access for tmslurm: pure parsers of classic command output, a client interface with a CLI
and an optional pyslurm backend, a node-state watcher that turns Slurm states into notices, spare
submission, the spawn record, and the failure lab's fault injector. It is a library: the process
entry points and the implementations of the controller's interfaces are in :mod:`tmslurm.slurm.proc`,
and nothing here imports them, the agent or the controller.

Nothing here imports torch. Every deliberate failure is a :class:`tmslurm.core.errors.SlurmError` (or
its subclass :class:`tmslurm.core.errors.SlurmParseError` when Slurm printed something unparseable).
"""
