"""The agent processes: training workers, standbys, node monitors and node relays.

Contract: ``python -m tmslurm.agent.main`` is the one entry point of every agent process. Code here
speaks to the controller only through :mod:`tmslurm.wire` messages and never imports
:mod:`tmslurm.controller`.
"""
