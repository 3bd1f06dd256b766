"""How an agent builds what it trains with: its stage runner, its group fabric, its device.

Contract: :func:`build_runner` builds the :class:`~tmslurm.train.schedule.StageRunner` of a rank (or,
for a standby's warm-up, of a stage as data-parallel rank 0, TP position 0) from the run config:
the Task's module and optimizer on the configured device, with ``train.threads`` intra-op threads.
:func:`make_fabric` makes the rank's :class:`~tmslurm.comm.fabric.Fabric` over the controller's
TCPStore. Both raise what the Task or torch raise (ConfigError for a Task that cannot be imported);
a worker or standby that cannot build its runner fails like any crash.
"""

from __future__ import annotations

import datetime
import os
import resource
from typing import Any

import torch
import torch.distributed as dist

from tmslurm.agent.link import Link
from tmslurm.comm.fabric import Fabric, FabricSettings
from tmslurm.core.config import RunConfig
from tmslurm.core.netaddr import local_address_towards
from tmslurm.core.topology import Layout, split_layers
from tmslurm.train.schedule import StageRunner
from tmslurm.train.task import StageSpec, load_task
from tmslurm.train.tp import TPGroup
from tmslurm.train.zero import ZeroStageRunner


def _status_mb(field: str) -> float | None:
    """A ``Vm*`` line of /proc/self/status in MiB, None where /proc is not available."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return None


def rss_mb() -> float:
    """Current resident set size of this process in MiB (0 where /proc is not available)."""
    return _status_mb("VmRSS") or 0.0


def peak_rss_mb() -> float:
    """Peak resident set size of this process in MiB: ``VmHWM`` (which :func:`reset_peak_rss` can
    reset), else ``getrusage``'s ``ru_maxrss`` where /proc is not available."""
    peak = _status_mb("VmHWM")
    return peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def reset_peak_rss() -> bool:
    """Reset this process's peak RSS to its current RSS (``/proc/self/clear_refs``, Linux >= 4.0).

    A standby that becomes a rank calls it: its peak while it warmed every shape class is reported in
    its ``ready`` messages, and the peaks it reports as a rank are then its peaks as a rank. Returns
    False (and the peak keeps counting from the start) where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def layout_of(cfg: RunConfig) -> Layout:
    return Layout.from_config(cfg)


def stage_spec(cfg: RunConfig, stage: int, tp_rank: int) -> StageSpec:
    """The StageSpec of (stage, tp position), with a fresh TP handle for the module to hold."""
    layout = layout_of(cfg)
    return StageSpec(
        stage,
        layout.pp,
        layout.role_of_stage(stage),
        split_layers(cfg.model.n_layer, layout.pp)[stage],
        tp_rank=tp_rank,
        tp_size=layout.tp,
        tp_group=TPGroup(tp_rank, layout.tp),
    )


def device_of(cfg: RunConfig) -> torch.device:
    if cfg.runtime.device == "cuda":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % max(torch.cuda.device_count(), 1))
    return torch.device("cpu")


def build_runner(cfg: RunConfig, rank: int, stage: int | None = None) -> StageRunner:
    """The StageRunner of ``rank`` (or of ``stage`` for a standby's warm-up, as dp rank 0, tp rank 0)."""
    torch.set_num_threads(cfg.train.threads)
    layout = layout_of(cfg)
    c = layout.coord(rank) if stage is None else None
    if c is not None:
        spec = stage_spec(cfg, c.stage, c.tp)
    else:
        assert stage is not None  # c is None only for a standby's stage
        spec = stage_spec(cfg, stage, 0)
    task = load_task(cfg)
    kind = ZeroStageRunner if cfg.parallel.zero else StageRunner
    return kind(task, spec, c.dp if c is not None else 0, layout.dp, cfg.train.micro_batches, device_of(cfg))


def make_fabric(cfg: RunConfig, rank: int, link: Link, addr: dict[str, Any]) -> Fabric:
    rt = cfg.runtime

    def store() -> Any:
        return dist.TCPStore(
            addr["host"],
            int(addr["store_port"]),
            is_master=False,
            timeout=_td(rt.connect_timeout_s),
            wait_for_workers=False,
        )

    settings = FabricSettings(
        rt.backend,
        rt.collective_timeout_s,
        rt.wait_slice_s,
        rt.connect_timeout_s,
        bind_addr=local_address_towards(addr["host"]),
    )
    return Fabric(rank, layout_of(cfg), store, settings, link.abort_event)


def _td(seconds: float) -> Any:
    return datetime.timedelta(seconds=seconds)
