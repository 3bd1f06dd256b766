"""Structured configuration of a tmslurm run, registered in Hydra's ConfigStore.

Contract: every component owns one kw-only dataclass whose fields carry docstrings; the root is
:class:`RunConfig`. :func:`compose_config` turns Hydra command-line overrides into a validated
``RunConfig`` and :func:`validate` checks the cross-field rules. Any invalid input (unknown key, wrong
type, a layout that does not match the nodes, a negative count, an unknown fault kind) raises
:class:`~tmslurm.core.errors.ConfigError` with one message that names the override to change and, where
there are some, the valid values. Nothing here starts processes or touches the file system.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tmslurm.core.errors import ConfigError
from tmslurm.core.hfconfig import apply_hf_config

FAULT_KINDS = (
    "drain",
    "kill",
    "stop",
    "hang",
    "hiccup",
    "slow",
    "node_down",
    "power_off",
    "partition",
    "throttle",
    "slowlink",
    "corrupt_shadow",
)
CLUSTER_FAULTS = (
    "node_down",
    "power_off",
    "partition",
    "throttle",
    "slowlink",
)  # driven through Slurm / the failure lab
FAULT_AMOUNTS = {"throttle": "30", "slowlink": "20mbit", "hiccup": "2", "slow": "0.2"}
"""The default ``amount`` of the fault kinds that take one (a CPU percent, a link rate)."""
BACKENDS = ("gloo", "nccl")
DEVICES = ("cpu", "cuda")
CLUSTERS = ("local", "slurm")
MODEL_SIZES = ("tiny", "small", "base", "large")
RESTART_MODES = ("tmslurm", "injob_restart", "requeue_restart")
ON_LIMIT = ("requeue", "resubmit", "stop")
SLURM_CHECKPOINT_EVERY = 50
"""Default train.checkpoint_every of a cluster=slurm run that does not set it."""


@dataclass(kw_only=True)
class ParallelConfig:
    dp: int = 2
    """Data-parallel degree: number of model replicas."""
    pp: int = 2
    """Pipeline-parallel degree: number of stages each replica is split into."""
    tp: int = 1
    """Tensor-parallel degree: heads and MLP hidden units of each block are split over this many ranks
    (the Task must declare supports_tp = True; model.n_head must be a multiple of it)."""
    ranks_per_node: int = 1
    """Training ranks started on each node."""
    nodes: int | None = None
    """Training nodes; None means dp*pp*tp / ranks_per_node."""
    zero: int = 0
    """Sharded optimizer (ZeRO-1): 0 keeps the whole optimizer state on every data-parallel rank; 1
    reduce-scatters gradients, keeps and steps 1/dp of the optimizer state per rank, all-gathers the
    parameters before each forward, and keeps an exact buddy copy of each slice on the data-parallel
    partner (dp rank XOR 1). Needs an even parallel.dp."""


@dataclass(kw_only=True)
class ModelConfig:
    size: str = "tiny"
    """Preset name this config came from (tiny | small | medium | base | large;
    hf when model.hf_config sets the sizes)."""
    n_layer: int = 4
    """Transformer blocks, split over the pipeline stages."""
    d_model: int = 32
    """Width of the residual stream."""
    n_head: int = 2
    """Attention heads."""
    seq_len: int = 32
    """Bytes per training sequence."""
    vocab: int = 256
    """Vocabulary size (byte-level: 256)."""
    compile: bool = False
    """Wrap each stage module in torch.compile (makes warm-up real on CPU)."""
    hf_config: str | None = None
    """A Hugging Face config.json (or its folder, or a preset: llama-tiny, gpt2-tiny) for
    train.task=tmslurm.train.hf:CausalLMTask; its sizes replace n_layer, d_model, n_head and vocab."""
    hf_tokenizer: str | None = None
    """A tokenizers ``tokenizer.json`` (or its folder) for the HF task's text; None feeds bytes as token ids."""


@dataclass(kw_only=True)
class TrainConfig:
    steps: int = 50
    """Optimizer steps to run."""
    micro_batches: int = 2
    """Micro-batches per step and data-parallel rank (pipeline depth of the schedule)."""
    micro_batch_size: int = 4
    """Sequences per micro-batch."""
    lr: float = 3e-3
    """AdamW learning rate."""
    task: str = "tmslurm.train.model:ReferenceTask"
    """The Task to train, as module:Class; it is built as Class(model_config, train_config)."""
    optimizer: str = "adamw"
    """adamw | sgd (sgd makes layouts comparable parameter by parameter in tests)."""
    weight_decay: float = 0.01
    """AdamW weight decay."""
    seed: int = 1234
    """Seed of parameter init and of the data order."""
    checkpoint_every: int = 0
    """Save a torch.distributed.checkpoint every K steps; 0 disables periodic checkpoints. With
    cluster=slurm and no explicit train.checkpoint_every override, compose_config sets it to
    SLURM_CHECKPOINT_EVERY (a lost batch host then has a checkpoint to resume from)."""
    checkpoint_async: bool = True
    """Write periodic checkpoints in the background: the step only waits for a CPU copy of the state
    (at most one save in flight per rank). A checkpoint the controller asks for is always complete
    before the rank goes on."""
    data_path: str | None = None
    """Text file to train on; None uses the Python standard library's sources (sorted)."""
    threads: int = 1
    """torch intra-op threads per rank; standbys use the same value (bitwise equality)."""
    step_delay_s: float = 0.0
    """Extra sleep per step (demo pacing only; 0 in tests and benchmarks)."""
    resume_from: str | None = None
    """Run directory whose latest complete checkpoint this run starts from (None: start at step 0)."""


@dataclass(kw_only=True)
class StandbyConfig:
    count: int = 0
    """Spare nodes: each holds parallel.ranks_per_node warm standby processes (a spare allocation on Slurm)."""
    warmup_iters: int = 2
    """Shadow iterations a standby runs per shape class in its sandbox."""
    max_classes: int = 8
    """Most shape classes (first, last, each distinct middle size) a standby keeps a warm runner for;
    a join into a class beyond the cap builds its runner in the pause (joiner_warm: false)."""
    shared_arena: bool = True
    """Back every warm class's parameters and optimizer moments with one host buffer sized to the
    largest class (tmslurm.train.arena), so a standby holds the state storage of one rank, not one
    per class. false: each class keeps its own (only to measure what the arena saves)."""
    start_when_warm: bool = False
    """Hold the commit of the first step until every standby is warm for every role (at most
    runtime.connect_timeout_s), so faults early in short runs always find a warm standby. While it
    holds, the spare jobs are looked at every 5 s: a standby whose allocation is gone is not waited
    for (with standby.replenish, its replacement is)."""
    replenish: bool | None = None
    """Start a new standby (a new spare job on Slurm) for each one consumed or lost. Unset: true on
    cluster=slurm (a run of days meets more failures than it has standbys), false on cluster=local."""


@dataclass(kw_only=True)
class SlurmConfig:
    partition: str = "debug"
    """Partition for the main job and the spares."""
    time: str = "00:30:00"
    """Time limit (sbatch --time) of the main job and the spares."""
    account: str | None = None
    """sbatch --account, if the cluster needs one."""
    extra_args: list[str] = field(default_factory=list)
    """Extra sbatch arguments of every job of the run, e.g. ['--qos=high']."""
    spare_args: list[str] = field(default_factory=list)
    """Extra sbatch arguments of the spare jobs only, after what they inherit from the main job
    (partition, account, QOS, constraint, GRES), e.g. ['--qos=standby']."""
    poll_interval_s: float = 1.0
    """How often the watcher polls node states and reservations."""
    backend: str = "auto"
    """Slurm client backend: auto | cli | pyslurm."""
    watch: bool = True
    """Poll node states and reservations (off only to measure the watcher's cost)."""
    spare_time: str | None = None
    """Time limit of each spare job (sbatch --time); None: slurm.time. A standby that takes a rank
    keeps running in its spare job: a spare_time shorter than slurm.time ends such a rank before the
    main job (an unexpected failure, recovered like any other)."""
    spare_renew_s: int | None = None
    """Renew a spare this many seconds before its time limit: a fresh spare is submitted and warmed,
    then the old one is cancelled (the warm count does not fall). Given: 60 to half the spare's limit.
    None: 600 s for a spare whose limit is at least 20 minutes, no renewal for a shorter one."""
    signal_lead_s: int = 120
    """The main job asks Slurm for SIGUSR1 this many seconds before its time limit (sbatch
    --signal=USR1@N; Slurm may send it up to 60 s earlier): the run checkpoints at the next step
    boundary and then does slurm.on_limit. Must leave time for a step and a checkpoint."""
    on_limit: str = "requeue"
    """What the main job does at its time limit, after the checkpoint: requeue (scontrol requeue,
    same job id) | resubmit (a new job, --dependency=afterany:<this job>, same run directory) | stop (end the
    run; resume it by hand with train.resume_from=<run_dir>)."""
    lab_command: str = ""
    """Command that injects the failure lab's faults (power_off, partition): run as
    ``<lab_command> power-off NODE``; empty = scripts/local-slurm of this checkout."""


@dataclass(kw_only=True)
class RuntimeConfig:
    shadow: bool = True
    """Planned switches move no state in their pause: each standby takes its leaver's state in the
    background, then applies the leaver's reduced gradient at every committed step (comm/shadow.py)."""
    shadow_min_notice_s: float = 10.0
    """A notice whose deadline is nearer than this switches at once, the state in the pause."""
    shadow_catchup_timeout_s: float = 120.0
    """Longest wait for shadows to catch up before the switch goes ahead anyway (what is left of the
    leaver's state then travels in the pause)."""
    backend: str = "gloo"
    """torch.distributed backend of the training groups: gloo | nccl."""
    device: str = "cpu"
    """Device of the stage modules: cpu | cuda."""
    heartbeat_interval_s: float = 0.2
    """Agent -> controller heartbeat period."""
    heartbeat_timeout_s: float = 3.0
    """A rank silent this long is declared hung and fenced (runtime.connect_timeout_s while it is still
    starting: before its started, or a standby's first ready)."""
    collective_timeout_s: float = 60.0
    """Upper bound of any single collective before it fails on its own."""
    wait_slice_s: float = 0.05
    """Pending collectives are waited on in slices this long, checking for aborts between."""
    connect_timeout_s: float = 120.0
    """How long agents wait for the controller and groups for their members."""
    redo_overlap: bool = False
    """After a failure, may the ranks that send no state redo the step while the state travels to
    the joiners? false: they wait for the transfers to end, which then run alone (on ranks that
    share CPUs, as here, a redone step beside a transfer slowed it 2.5x); true: their first
    forward overlaps the transfer (nodes of their own). docs/recovery.md section 3."""
    restart_mode: str = "tmslurm"
    """Recovery strategy: tmslurm (standby switch) | injob_restart | requeue_restart (baselines)."""
    switch_mode: str = "delta"
    """delta (rebuild only affected groups, in the background) | full (rebuild every group inside
    the pause, what a naive re-initialisation does; for the scaling benchmark)."""
    hang_factor: float = 10.0
    """A rank whose vote is the only one missing for longer than hang_factor x the median step time
    (at least runtime.hang_floor_s) is declared hung, fenced and replaced, even if it heartbeats.
    Before a step time is known (the first two commits) the limit is runtime.connect_timeout_s."""
    hang_floor_s: float = 2.0
    """The least time a rank may lag behind all the others' votes before it is declared hung."""
    monitors: bool = True
    """Run one node monitor per node (a tiny process that trains nothing): it heartbeats every
    runtime.monitor_interval_s and reports the exit of the node's tmslurm processes at once (pidfd)."""
    monitor_interval_s: float = 0.1
    """Node monitor -> controller heartbeat period."""
    relay: bool = False
    """Each node's agents reach the controller through their node monitor's relay: one connection,
    one vote frame per step and one heartbeat line per node instead of per rank (needs
    runtime.monitors=true and runtime.heartbeats=true; for runs of hundreds of nodes and more)."""
    node_timeout_s: float = 0.8
    """A node whose monitor and processes were all silent this long, while other nodes were heard,
    is declared lost (a power-off or a cut link sends nothing)."""
    switch_timeout_s: float = 60.0
    """A switch or recovery whose plan was applied (groups being rebuilt, state in flight) must
    finish within this; whoever has not reported by then is fenced and the step is recovered again."""
    controller_lost_s: float = 15.0
    """An agent that hears nothing from its controller (no decision, no beat) for this long, or
    whose connection closed, exits by itself (status 3); the controller beats every
    controller_lost_s / 5, so a live but idle controller is never mistaken for a lost one."""
    controller_restarts: int = 3
    """How many times the supervisor (the launcher locally, the batch step on Slurm) restarts a
    controller that died (kill -9, crash); the new one re-adopts the live agents, which reconnect
    within runtime.controller_lost_s. 0: a dead controller ends the run (its agents exit)."""
    metrics_port: int = 0
    """Serve Prometheus metrics from the controller on this port (0 = off; needs prometheus-client,
    ``pip install tmslurm[metrics]``). Read-only: every request gets the text exposition format."""
    monitor_metrics_port: int = 0
    """Each node monitor serves its node's Prometheus metrics on this port (0 = off; one monitor per
    host on a real cluster; with cluster=local every node is this host and only the first binds)."""
    metrics_addr: str = "127.0.0.1"
    """Address the metrics endpoints (the controller's, the monitors') bind to (``0.0.0.0`` to let a
    Prometheus server on another host scrape them)."""
    fork_agents: bool = True
    """cluster=local: fork ranks and standbys from one process that imported torch once (a restart
    of N ranks does not pay N imports); false: each is a fresh ``python -m tmslurm.agent.main``."""
    heartbeats: bool = True
    """Agents send heartbeats (off only to measure their cost; hangs are then not detected)."""
    commit_vote: bool = True
    """Vote on every step commit (off only to measure its cost)."""
    admin_public_key_file: str | None = None
    """The cluster admin's Ed25519 public key (PEM): notices signed with its private key are
    accepted (they can only notify); none: only the run token is accepted."""
    notice_max_age_s: float = 120.0
    """A signed notice older (or newer) than this by its timestamp is refused as stale."""
    verify_replicas: bool = False
    """Workers send a parameter digest with every vote; the controller checks DP replicas are equal."""
    gray_evict: bool = False
    """Gray failures: move a node off with a planned switch to a warm standby when one of its ranks
    stays slower than its data-parallel peers (its busy time, step time less communication waits;
    see runtime.gray_*). Needs parallel.dp >= 2: a rank is judged against its peers."""
    gray_factor: float = 1.5
    """A rank is slow when its busy time is at least this many times its peers' (median over the window)."""
    gray_window: int = 8
    """Steps judged together: a rank must be slow in more than half of them (a single hiccup moves nothing)."""
    gray_min_excess_s: float = 0.05
    """And slower than its peers by at least this many seconds a step (tiny steps are noise)."""
    gray_budget_per_hour: int = 2
    """At most this many gray evictions in any hour (a guard against evicting node after node)."""
    link_probe_s: float = 2.0
    """With runtime.gray_evict and node monitors: every this many seconds each monitor sends
    runtime.link_probe_bytes to another node's monitor, so that a slow link is found (a slow link
    slows every rank alike, so busy times cannot). 0 turns link probes off."""
    link_probe_bytes: int = 2097152
    """Bytes per link probe. Several times a token bucket's burst, or the burst hides the rate (the
    failure lab's slowlink passes 256 KiB at full speed); on fast fabrics use tens of MiB."""
    link_probe_timeout_s: float = 10.0
    """A probe not acknowledged within this counts as a sample of at most bytes/timeout."""
    link_slow_factor: float = 10.0
    """A node's link is slow when even its best probe over runtime.link_window is this many times
    below the median of every node's best (on the 2-core lab a healthy node's best was once 8.7x
    below; a 20 mbit/s link is ~900x)."""
    link_window: int = 6
    """Probes per node judged together (each round a node sends one and receives one, each with
    another partner): its best must be slow, so one slow partner or one hiccup moves nothing."""


@dataclass(kw_only=True)
class FaultConfig:
    step: int
    """Step at which the fault fires."""
    kind: str
    """One of FAULT_KINDS:

    - ``drain``: a maintenance notice for the rank's node (a planned move);
    - ``kill``: SIGKILL of the rank's process (see ``when``);
    - ``stop``: SIGSTOP of the rank's process, a hung process that holds its sockets open;
    - ``hang``: the rank's training thread stops just before voting while its heartbeats go on;
    - ``hiccup``: the rank's training thread stalls ``amount`` seconds (default 2) in the middle of
      ``step``, once, then goes on;
    - ``slow``: from ``step`` on, every step of the rank stalls ``amount`` seconds (default 0.2) in
      its middle: a slow rank in one process (the lab's ``throttle`` slows a whole node);
    - ``node_down``: ``scontrol update state=down`` of the rank's node (cluster=slurm);
    - ``power_off``: the failure lab powers the rank's node off, silent: no FIN, no RST
      (cluster=slurm with ``slurm.lab_command``);
    - ``partition``: the failure lab cuts the rank's node off the network, its processes live on
      (cluster=slurm with ``slurm.lab_command``);
    - ``throttle``: the failure lab caps the node's CPU at ``amount`` percent of one CPU (a gray,
      slow node that stays up);
    - ``slowlink``: the failure lab limits both directions of the node's link to ``amount`` (tc tbf);
    - ``corrupt_shadow``: a test of the shadow's check: the standby that shadows the rank in a
      planned switch flips one bit of its copy before the switch, which must fall back to a full
      transfer (``step`` is not used)."""
    rank: int = 0
    """Training rank hit by the fault (its node for drain, node_down and the lab's faults)."""
    ranks: list[int] = field(default_factory=list)
    """Several training ranks hit by this one fault (overrides ``rank``): the lab's faults act on
    all their nodes at the same instant (one command), kill/stop hit each rank at the same point of
    the same step, drain/node_down notice each node."""
    amount: str = ""
    """throttle: percent of one CPU, 1..1000 (empty: 30); slowlink: a rate as tc writes it, such as
    20mbit or 500kbit (empty: 20mbit); hiccup and slow: seconds (empty: 2 and 0.2). Other kinds take none."""
    when: str = "midstep"
    """kill/stop/hiccup: midstep (between forward and backward of ``step``), recover (when the rank
    is told to take part in a recovery at or after ``step``: a second failure during a switch),
    transfer (in the middle of a state transfer the rank sends at or after ``step``: a recovery's
    source or a planned move's leaver) or join (the standby joining as the rank is hit in the middle
    of receiving its state, at or after ``step``)."""


@dataclass(kw_only=True)
class RunConfig:
    defaults: list[Any] = field(default_factory=lambda: ["_self_", {"model": "tiny"}])
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    standby: StandbyConfig = field(default_factory=StandbyConfig)
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    cluster: str = "local"
    """Where ranks run: local (processes on this host) | slurm (submit jobs)."""
    run_dir: str = ""
    """Run directory; empty means runs/<timestamp> under the current directory."""
    faults: list[FaultConfig] = field(default_factory=list)
    """Injected faults [{step, kind, rank}] for tests, benchmarks and the demo."""


MODEL_PRESETS = {
    "tiny": ModelConfig(size="tiny", n_layer=4, d_model=32, n_head=2, seq_len=32),
    "small": ModelConfig(size="small", n_layer=6, d_model=128, n_head=4, seq_len=64),
    # sized by state per rank (parameters + AdamW moments, 12 bytes a parameter) at DP2 x PP2:
    "medium": ModelConfig(size="medium", n_layer=8, d_model=320, n_head=8, seq_len=64),  # ~60 MB per rank
    "base": ModelConfig(size="base", n_layer=12, d_model=768, n_head=12, seq_len=64),  # ~0.5 GB per rank
    "large": ModelConfig(size="large", n_layer=18, d_model=1024, n_head=16, seq_len=64),  # ~1.4 GB per rank
}


def register_configs() -> None:
    """Register the schema and the model presets in Hydra's ConfigStore (idempotent)."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="tmslurm", node=RunConfig)
    for name, preset in MODEL_PRESETS.items():
        cs.store(group="model", name=name, node=preset)


def world_size(p: ParallelConfig) -> int:
    return p.dp * p.pp * p.tp


def wants_monitors(cfg: RunConfig) -> bool:
    """Node monitors run when enabled and heartbeats are on (a silent monitor would look dead)."""
    return cfg.runtime.monitors and cfg.runtime.heartbeats


def num_nodes(p: ParallelConfig) -> int:
    return p.nodes if p.nodes is not None else world_size(p) // p.ranks_per_node


def _positive(value: int, override: str, minimum: int = 1) -> None:
    if value < minimum:
        raise ConfigError(
            f"{override}={value} is invalid: it must be >= {minimum}. Fix: pass {override}=<n> with n >= {minimum}."
        )


def _one_of(value: str, valid: tuple[str, ...], override: str) -> None:
    if value not in valid:
        raise ConfigError(
            f"{override}={value!r} is invalid; valid values: {', '.join(valid)}. Fix: pass {override}=<one of them>."
        )


def _validate_parallel(p: ParallelConfig) -> None:
    for name in ("dp", "pp", "tp", "ranks_per_node"):
        _positive(getattr(p, name), f"parallel.{name}")
    world = world_size(p)
    if p.nodes is not None:
        _positive(p.nodes, "parallel.nodes")
        if p.nodes * p.ranks_per_node != world:
            raise ConfigError(
                f"parallel.dp*pp*tp = {world} ranks does not match parallel.nodes*ranks_per_node = "
                f"{p.nodes}*{p.ranks_per_node} = {p.nodes * p.ranks_per_node}. Fix: change parallel.nodes "
                f"(or parallel.ranks_per_node) so that nodes*ranks_per_node = {world}."
            )
    elif world % p.ranks_per_node:
        raise ConfigError(
            f"parallel.ranks_per_node={p.ranks_per_node} does not divide dp*pp*tp = {world} ranks. "
            f"Fix: pass a parallel.ranks_per_node that divides {world}."
        )
    if p.zero not in (0, 1):
        raise ConfigError(f"parallel.zero={p.zero!r} is invalid; valid values: 0, 1. Fix: pass parallel.zero=0 or 1.")
    if p.zero and (p.dp < 2 or p.dp % 2):
        raise ConfigError(
            f"parallel.zero=1 shards the optimizer over data-parallel pairs (each slice's buddy is its "
            f"partner), so parallel.dp must be even and >= 2; got parallel.dp={p.dp}. Fix: pass an even "
            f"parallel.dp, or parallel.zero=0."
        )


def _validate_model(m: ModelConfig, p: ParallelConfig) -> None:
    for name in ("n_layer", "d_model", "n_head", "seq_len", "vocab"):
        _positive(getattr(m, name), f"model.{name}")
    if m.d_model % m.n_head:
        raise ConfigError(
            f"model.d_model={m.d_model} is not a multiple of model.n_head={m.n_head}. Fix: change model.n_head."
        )
    if m.n_head % p.tp:
        raise ConfigError(
            f"model.n_head={m.n_head} is not a multiple of parallel.tp={p.tp}: heads are split over the "
            f"tensor-parallel group. Fix: pass a parallel.tp that divides {m.n_head} (or change model.n_head)."
        )
    if p.pp > m.n_layer:
        raise ConfigError(
            f"parallel.pp={p.pp} is greater than model.n_layer={m.n_layer}: every stage needs at least one "
            f"block. Fix: pass parallel.pp<={m.n_layer} or a larger model.n_layer."
        )


def _validate_train(t: TrainConfig) -> None:
    for name in ("steps", "micro_batches", "micro_batch_size", "threads"):
        _positive(getattr(t, name), f"train.{name}")
    _positive(t.checkpoint_every, "train.checkpoint_every", 0)
    _one_of(t.optimizer, ("adamw", "sgd"), "train.optimizer")
    _check_task(t.task)
    if t.lr <= 0:
        raise ConfigError(f"train.lr={t.lr} must be > 0. Fix: pass train.lr=<positive float>.")
    if t.resume_from is not None and not Path(t.resume_from, "checkpoints").is_dir():
        raise ConfigError(
            f"train.resume_from={t.resume_from!r} holds no checkpoints/ directory. "
            "Fix: point it at a run directory that saved checkpoints (train.checkpoint_every>0)."
        )
    if t.data_path is not None and not Path(t.data_path).is_file():
        raise ConfigError(
            f"train.data_path={t.data_path!r} is not a readable file. "
            "Fix: point train.data_path at a text file or leave it unset."
        )


def _check_task(spec: str) -> None:
    import importlib

    module_name, _, cls_name = spec.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), cls_name, None) if cls_name else None
        if not isinstance(cls, type):
            raise ImportError(f"no class {cls_name or '(missing)'!r} in {module_name}")
    except (ImportError, ValueError) as exc:
        raise ConfigError(
            f"train.task={spec!r} cannot be imported ({exc}). Fix: pass train.task=package.module:ClassName"
        ) from None


def _check_task_tp(spec: str, tp: int) -> None:
    import importlib

    module_name, _, cls_name = spec.partition(":")
    if not getattr(getattr(importlib.import_module(module_name), cls_name), "supports_tp", False):
        raise ConfigError(
            f"train.task={spec!r} does not support tensor parallelism (no supports_tp = True); "
            f"parallel.tp={tp}. Fix: pass parallel.tp=1 or make the Task tensor-parallel."
        )


def fault_ranks(f: FaultConfig) -> list[int]:
    """The ranks one fault entry hits: ``ranks`` when given, else ``[rank]``."""
    return list(f.ranks) if f.ranks else [f.rank]


def fault_amount(f: FaultConfig) -> str:
    """The entry's ``amount``, or its kind's default (empty for kinds that take none)."""
    return f.amount or FAULT_AMOUNTS.get(f.kind, "")


_RATE = re.compile(r"[1-9][0-9]*(kbit|mbit|gbit)")
_SECONDS = re.compile(r"[0-9]+(\.[0-9]+)?")


def _validate_amount(i: int, f: FaultConfig) -> None:
    if f.kind not in FAULT_AMOUNTS:
        if f.amount:
            raise ConfigError(
                f"faults[{i}].amount={f.amount!r}: only {', '.join(FAULT_AMOUNTS)} take an amount. "
                f"Fix: remove faults[{i}].amount."
            )
        return
    a = fault_amount(f)
    if f.kind == "throttle":
        ok, want = a.isdigit() and 1 <= int(a) <= 1000, "a percent of one CPU, 1..1000"
    elif f.kind == "slowlink":
        ok, want = bool(_RATE.fullmatch(a)), "a rate such as 20mbit, 500kbit or 1gbit"
    else:
        ok, want = bool(_SECONDS.fullmatch(a)) and 0 < float(a) <= 600, "seconds, more than 0 and at most 600"
    if not ok:
        raise ConfigError(f"faults[{i}].amount={a!r} is not {want}. Fix: change faults[{i}].amount.")


def _validate_faults(cfg: RunConfig) -> None:
    world = world_size(cfg.parallel)
    for i, f in enumerate(cfg.faults):
        _one_of(f.kind, FAULT_KINDS, f"faults[{i}].kind")
        for r in fault_ranks(f):
            if not 0 <= r < world:
                what = f"faults[{i}].ranks={list(f.ranks)} names {r}," if f.ranks else f"faults[{i}].rank={r} is"
                which = "ranks" if f.ranks else "rank"
                raise ConfigError(
                    f"{what} not a training rank; valid: 0..{world - 1}. Fix: change faults[{i}].{which}."
                )
        if len(set(f.ranks)) != len(f.ranks):
            raise ConfigError(
                f"faults[{i}].ranks={list(f.ranks)} names a rank twice. Fix: list each rank once in faults[{i}].ranks."
            )
        if f.ranks and f.kind == "corrupt_shadow":
            raise ConfigError(
                f"faults[{i}]: corrupt_shadow hits one rank. Fix: use faults[{i}].rank, not faults[{i}].ranks."
            )
        _validate_amount(i, f)
        if not 0 <= f.step < cfg.train.steps:
            raise ConfigError(
                f"faults[{i}].step={f.step} is outside the run; valid: 0..{cfg.train.steps - 1}. "
                f"Fix: change faults[{i}].step."
            )
        _one_of(f.when, ("midstep", "recover", "transfer", "join"), f"faults[{i}].when")
        if f.when in ("transfer", "join") and f.kind not in ("kill", "stop", "hiccup"):
            raise ConfigError(
                f"faults[{i}].when={f.when} fits only kind=kill, stop or hiccup. "
                f"Fix: change faults[{i}].kind or faults[{i}].when."
            )
        if f.kind in CLUSTER_FAULTS and cfg.cluster != "slurm":
            raise ConfigError(
                f"faults[{i}].kind={f.kind} needs cluster=slurm (the failure lab of scripts/local-slurm). "
                "Fix: use kind=kill or kind=stop with cluster=local."
            )


def _validate_gray(cfg: RunConfig) -> None:
    rt = cfg.runtime
    _positive(rt.gray_window, "runtime.gray_window")
    _positive(rt.gray_budget_per_hour, "runtime.gray_budget_per_hour", minimum=0)
    if rt.gray_factor <= 1.0:
        raise ConfigError(
            f"runtime.gray_factor={rt.gray_factor} must be > 1 (a rank is slow when this many times its peers). "
            "Fix: pass runtime.gray_factor=<x> with x > 1."
        )
    if rt.gray_min_excess_s < 0:
        raise ConfigError("runtime.gray_min_excess_s must be >= 0. Fix: pass runtime.gray_min_excess_s=<seconds>.")
    if rt.link_probe_s < 0 or 0 < rt.link_probe_s < 0.1:
        raise ConfigError(
            f"runtime.link_probe_s={rt.link_probe_s} must be 0 (off) or at least 0.1. "
            "Fix: pass runtime.link_probe_s=<seconds>."
        )
    if not 1 << 16 <= rt.link_probe_bytes <= 64 << 20:
        raise ConfigError(
            f"runtime.link_probe_bytes={rt.link_probe_bytes} must be 64 KiB..64 MiB (65536..67108864). "
            "Fix: pass runtime.link_probe_bytes=<bytes>."
        )
    if rt.link_probe_timeout_s <= 0:
        raise ConfigError("runtime.link_probe_timeout_s must be > 0. Fix: pass runtime.link_probe_timeout_s=<seconds>.")
    if rt.link_slow_factor <= 1.0:
        raise ConfigError(
            f"runtime.link_slow_factor={rt.link_slow_factor} must be > 1. "
            "Fix: pass runtime.link_slow_factor=<x> with x > 1."
        )
    _positive(rt.link_window, "runtime.link_window", minimum=2)
    if rt.gray_evict and cfg.parallel.dp < 2:
        raise ConfigError(
            f"runtime.gray_evict=true judges a rank against its data-parallel peers, and parallel.dp={cfg.parallel.dp} "
            "has none. Fix: pass parallel.dp >= 2 or runtime.gray_evict=false."
        )


def _validate_metrics(rt: RuntimeConfig) -> None:
    for name in ("metrics_port", "monitor_metrics_port"):
        port = getattr(rt, name)
        if not 0 <= port <= 65535:
            raise ConfigError(f"runtime.{name}={port} is not a port. Fix: pass runtime.{name}=<1..65535> (0 = off).")
        if port and importlib.util.find_spec("prometheus_client") is None:
            raise ConfigError(
                f"runtime.{name} needs prometheus-client. Fix: pip install 'tmslurm[metrics]', "
                f"or pass runtime.{name}=0."
            )
    if rt.monitor_metrics_port and rt.monitor_metrics_port == rt.metrics_port:
        raise ConfigError(
            f"runtime.monitor_metrics_port={rt.monitor_metrics_port} equals runtime.metrics_port: the batch "
            "host runs a controller and a monitor. Fix: pass another runtime.monitor_metrics_port."
        )
    if rt.monitor_metrics_port and not rt.monitors:
        raise ConfigError(
            "runtime.monitor_metrics_port needs the node monitors. Fix: pass runtime.monitors=true "
            "or runtime.monitor_metrics_port=0."
        )


def validate(cfg: RunConfig) -> RunConfig:
    """Check every field and cross-field rule; raise ConfigError naming the override to change."""
    _validate_parallel(cfg.parallel)
    _validate_model(cfg.model, cfg.parallel)
    _validate_train(cfg.train)
    _positive(cfg.standby.max_classes, "standby.max_classes")
    if cfg.parallel.tp > 1:
        _check_task_tp(cfg.train.task, cfg.parallel.tp)
    _positive(cfg.standby.count, "standby.count", 0)
    _positive(cfg.standby.warmup_iters, "standby.warmup_iters")
    _one_of(cfg.cluster, CLUSTERS, "cluster")
    _one_of(cfg.runtime.backend, BACKENDS, "runtime.backend")
    _one_of(cfg.runtime.device, DEVICES, "runtime.device")
    _one_of(cfg.runtime.restart_mode, RESTART_MODES, "runtime.restart_mode")
    _one_of(cfg.runtime.switch_mode, ("delta", "full"), "runtime.switch_mode")
    _one_of(cfg.slurm.backend, ("auto", "cli", "pyslurm"), "slurm.backend")
    _one_of(cfg.slurm.on_limit, ON_LIMIT, "slurm.on_limit")
    if not 10 <= cfg.slurm.signal_lead_s <= 65535:
        raise ConfigError(
            f"slurm.signal_lead_s={cfg.slurm.signal_lead_s} is outside 10..65535 (sbatch --signal's range, "
            "with room for a step and a checkpoint). Fix: pass slurm.signal_lead_s=120."
        )
    if cfg.runtime.backend == "nccl" and cfg.runtime.device != "cuda":
        raise ConfigError(
            "runtime.backend=nccl needs runtime.device=cuda. Fix: pass runtime.device=cuda or runtime.backend=gloo."
        )
    for name in (
        "heartbeat_interval_s",
        "heartbeat_timeout_s",
        "collective_timeout_s",
        "wait_slice_s",
        "connect_timeout_s",
        "hang_factor",
        "hang_floor_s",
        "switch_timeout_s",
        "controller_lost_s",
        "monitor_interval_s",
        "node_timeout_s",
    ):
        if getattr(cfg.runtime, name) <= 0:
            raise ConfigError(f"runtime.{name} must be > 0. Fix: pass runtime.{name}=<seconds>.")
    _positive(cfg.runtime.controller_restarts, "runtime.controller_restarts", minimum=0)
    _validate_metrics(cfg.runtime)
    _validate_gray(cfg)
    if cfg.runtime.heartbeat_timeout_s <= 2 * cfg.runtime.heartbeat_interval_s:
        raise ConfigError(
            "runtime.heartbeat_timeout_s must exceed 2 x runtime.heartbeat_interval_s. "
            "Fix: raise runtime.heartbeat_timeout_s."
        )
    if cfg.runtime.node_timeout_s <= 2 * max(cfg.runtime.monitor_interval_s, cfg.runtime.heartbeat_interval_s):
        raise ConfigError(
            "runtime.node_timeout_s must exceed 2 x runtime.monitor_interval_s and 2 x "
            "runtime.heartbeat_interval_s. Fix: raise runtime.node_timeout_s."
        )
    if cfg.runtime.relay and not (cfg.runtime.monitors and cfg.runtime.heartbeats):
        raise ConfigError(
            "runtime.relay=true needs the node monitors, which run the relays. Fix: set "
            "runtime.monitors=true runtime.heartbeats=true, or runtime.relay=false."
        )
    _validate_faults(cfg)
    if not cfg.runtime.commit_vote and (cfg.faults or cfg.standby.count):
        raise ConfigError(
            "runtime.commit_vote=false only measures the vote's cost: it cannot abort or switch. "
            "Fix: use it with standby.count=0 and no faults."
        )
    return cfg


def to_dataclass(node: Any) -> RunConfig:
    """Convert a composed OmegaConf node into a plain RunConfig (lists of dicts become FaultConfig)."""
    from omegaconf import OmegaConf

    data = OmegaConf.to_container(node, resolve=True, throw_on_missing=True)
    if not isinstance(data, dict):
        raise ConfigError(f"a run config is a mapping, got a {type(data).__name__}. Fix: pass the composed DictConfig")
    data.pop("defaults", None)
    return from_dict(data)


def from_dict(data: dict) -> RunConfig:
    """Build a RunConfig from a plain dict (as written to run_dir/config.json)."""
    data = dict(data)
    data.pop("defaults", None)
    sub = {f.name: f.type for f in dataclasses.fields(RunConfig)}
    kwargs: dict[str, Any] = {}
    classes = {
        "parallel": ParallelConfig,
        "model": ModelConfig,
        "train": TrainConfig,
        "standby": StandbyConfig,
        "slurm": SlurmConfig,
        "runtime": RuntimeConfig,
    }
    for key, value in data.items():
        if key not in sub:
            raise ConfigError(
                f"unknown config key {key!r}; valid keys: {', '.join(k for k in sub if k != 'defaults')}."
            )
        if key in classes:
            kwargs[key] = classes[key](**value)
        elif key == "faults":
            kwargs[key] = [FaultConfig(**f) for f in value]
        else:
            kwargs[key] = value
    return RunConfig(**kwargs)


def to_dict(cfg: RunConfig) -> dict:
    data = dataclasses.asdict(cfg)
    data.pop("defaults", None)
    return data


def presets_dir() -> Path:
    """The repository's conf/ (experiment presets) when present, else an empty package folder."""
    repo_conf = Path(__file__).resolve().parents[2] / "conf"
    return repo_conf if repo_conf.is_dir() else Path(__file__).resolve().parent


def compose_config(overrides: list[str]) -> RunConfig:
    """Compose the config from Hydra overrides and validate it; every failure is a ConfigError."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(presets_dir()), version_base=None):
            node = compose(config_name="tmslurm", overrides=list(overrides))
    except Exception as exc:  # Hydra raises several unrelated types for bad overrides
        raise ConfigError(_hydra_message(exc, overrides)) from None
    try:
        cfg = to_dataclass(node)
    except Exception as exc:  # OmegaConf's MissingMandatoryValue, TypeError from a dataclass
        raise ConfigError(
            f"invalid override ({' '.join(overrides)}): {str(exc).splitlines()[0]}. "
            "Fix: faults need step, kind and rank, e.g. faults='[{step:10,kind:drain,rank:1}]'"
        ) from None
    apply_cluster_defaults(cfg, overrides)
    apply_hf_config(cfg)
    return validate(cfg)


def apply_cluster_defaults(cfg: RunConfig, overrides: list[str]) -> None:
    """cluster=slurm: periodic checkpoints every SLURM_CHECKPOINT_EVERY steps unless train.checkpoint_every
    is given on the command line (a preset's value other than 0 is kept too)."""
    given = any(o.lstrip("+~").split("=", 1)[0] == "train.checkpoint_every" for o in overrides)
    if cfg.cluster == "slurm" and cfg.train.checkpoint_every == 0 and not given:
        cfg.train.checkpoint_every = SLURM_CHECKPOINT_EVERY


def _hydra_message(exc: Exception, overrides: list[str]) -> str:
    text = str(exc).strip()
    cause = exc.__cause__ or exc.__context__
    if cause is not None and str(cause).strip() and str(cause).strip() not in text:
        text = f"{text}\n{str(cause).strip()}"
    noise = ("full_key", "reference_type", "object_type", "Config search path", "provider=")
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.strip().startswith(noise)]
    body = "; ".join(ln.strip() for ln in lines[:8])
    return f"invalid override ({' '.join(overrides) or 'none'}): {body}"
