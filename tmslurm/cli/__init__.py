"""The user's and the admin's commands: ``tmslurm`` (status, notify, report) and ``tmslurm-launch``.

Contract: every module here is an entry point or what one prints; each catches
:class:`~tmslurm.core.errors.TmslurmError` at its top (:func:`~tmslurm.cli.guard.guarded`) and exits
with its message (status 2), so a
user never sees a traceback for a mistake of theirs. The library code they call lives elsewhere.
"""
