"""Benchmarks: scripts that measure and print figures (``python -m benchmarks ...``).

Each sub-command runs real jobs (local processes or the local Slurm cluster), prints a table with
ratios side by side, and writes its figures to ``docs/bench/<name>.json``. They are not tests: a
smoke test runs each at its smallest size only.
"""
