"""The Slurm side of tmslurm's processes: the batch step's entry point (``job``), the controller's
Slurm entry point (``ctlmain``), a node's monitor entry point on Slurm (``orphan``), and the Slurm
implementations of the controller's interfaces (``spawner``: :class:`Spawner` with ``srun`` steps and
spare jobs; ``hooks``: :class:`ClusterHooks` with ``scontrol``).

Contract: these modules may import the controller and the agent packages; the adapter library one
level up (:mod:`tmslurm.slurm`) never imports them.
"""
