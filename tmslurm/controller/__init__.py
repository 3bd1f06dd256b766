"""The run's controller as a package of collaborators (see :mod:`tmslurm.controller.loop`)."""

from tmslurm.controller.hooks import ClusterHooks, LocalHooks
from tmslurm.controller.loop import Controller
from tmslurm.controller.server import ControlServer

__all__ = ["ClusterHooks", "ControlServer", "Controller", "LocalHooks"]
