"""Starting and keeping a run: preparing its directory and the supervisor that restarts a controller.

Contract: the one place that owns a run's processes above the controller (the supervisor holds the
control socket and the rendezvous store, restarts a dead controller) and that writes a new run
directory. Used by the launcher and by Slurm's batch step; imports neither the CLI nor the tools.
"""
