"""Back-of-the-envelope models of interruption cost at scale (no torch, no cluster needed).

:mod:`tmslurm.sim.projection` (the command line) projects wasted GPU-hours per week for checkpoint
restart, the TrainMover paper's downtimes and tmslurm, whose downtime is modelled part by part in
:mod:`tmslurm.sim.parts` (one law per part, fitted to docs/bench where measured). The rate and
strategy model is :mod:`tmslurm.sim.model`; the verdicts :mod:`tmslurm.sim.verdicts`; the text
tables :mod:`tmslurm.sim.render`. Nothing here touches a run.
"""
