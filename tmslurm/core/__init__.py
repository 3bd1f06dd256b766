"""Core: the types and libraries every tmslurm process shares, with no process of its own.

Contract: configuration (schema, composition, validation), the layout (:mod:`.topology`), the run
directory's file names (:mod:`.rundir`), errors, log format, notices and their signatures, JSON
files, local addresses, Hugging Face config reading and progress lines. Nothing here imports a
process folder (wire, agent, controller, slurm, run, cli, tools); importing it starts nothing.
"""
