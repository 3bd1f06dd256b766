"""Checking tools: the demo, the chaos soak's invariant checker, and a handle on a Slurm-submitted run.

Contract: these drive or inspect runs from outside (they submit, wait, read a finished run's files);
no process of a run imports them. The benchmarks and the tests use them too.
"""
