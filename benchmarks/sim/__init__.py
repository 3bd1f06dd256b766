"""Back-of-the-envelope models of interruption cost at scale (no torch, no cluster needed).

:mod:`benchmarks.sim.projection` (the command line) projects wasted GPU-hours per week for checkpoint
restart, the TrainMover paper's downtimes and tmslurm, whose downtime is modelled part by part in
:mod:`benchmarks.sim.parts` (one law per part, fitted to docs/bench where measured). The rate and
strategy model is :mod:`benchmarks.sim.model`; the verdicts :mod:`benchmarks.sim.verdicts`; the text
tables :mod:`benchmarks.sim.render`. Nothing here touches a run.
"""
