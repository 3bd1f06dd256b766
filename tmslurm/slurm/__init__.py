"""Slurm access for tmslurm: pure parsers of classic command output, a client interface with a CLI
and an optional pyslurm backend, and a node-state watcher that turns Slurm states into notices.

Nothing here imports torch. Every deliberate failure is a :class:`tmslurm.errors.SlurmError` (or
its subclass :class:`tmslurm.errors.SlurmParseError` when Slurm printed something unparseable).
"""
