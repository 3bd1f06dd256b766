"""Back-of-the-envelope models of interruption cost at scale (no torch, no cluster needed).

:mod:`tmslurm.sim.projection` projects wasted GPU-hours per week for checkpoint restart, the
TrainMover paper's downtimes and tmslurm's measured downtimes. Nothing here touches a run.
"""
