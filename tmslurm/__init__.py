"""tmslurm: keep distributed PyTorch training alive through node loss and maintenance on Slurm.

Importing the package is cheap and side-effect free: no logging configuration, no torch import.
"""

__version__ = "0.1.0"
