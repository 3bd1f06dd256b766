"""The schema of a tmslurm run: one kw-only dataclass per concern, registered in Hydra's ConfigStore.

Contract: every field carries a docstring (the configuration reference, docs/config-reference.md, and
``tmslurm-launch --help`` are generated from them); the root is :class:`RunConfig`, with one top-level
section per concern (``runtime`` keeps the protocol core; ``detect``, ``shadow``, ``gray``, ``metrics``
and ``security`` each serve one collaborator; ``bench`` holds the benchmark-only switches, see
:data:`BENCH_SECTIONS`). This module only
declares: the rules that tie fields together are in :mod:`.validation`, composition from overrides in
:mod:`.compose`. Nothing here reads files, imports user code or raises on a value.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tmslurm.core.config.faults import FaultConfig

BACKENDS = ("gloo", "nccl")
DEVICES = ("cpu", "cuda")
CLUSTERS = ("local", "slurm")
RESTART_MODES = ("tmslurm", "injob_restart", "requeue_restart")
ON_LIMIT = ("requeue", "resubmit", "stop")
SLURM_CHECKPOINT_EVERY = 50
"""Default train.checkpoint_every of a cluster=slurm run that does not set it."""
BENCH_SECTIONS = ("bench",)
"""Sections of benchmark-only switches: ``tmslurm-launch --cfg job`` and ``--help`` leave them out, the
reference lists them under a heading of their own."""


@dataclass(kw_only=True)
class ParallelConfig:
    """The layout: how the ranks split the model and the data, and how they sit on nodes."""

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
    """The reference transformer's sizes (a preset, ``model=<name>``, sets them together)."""

    size: str = "tiny"
    """Preset name this config came from (tiny | small | medium | base | large; hf when model.hf_config
    sets the sizes)."""
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
    """What is trained and how: steps, batches, optimizer, Task, data and checkpoints."""

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
    resume_from: str | None = None
    """Run directory whose latest complete checkpoint this run starts from (None: start at step 0)."""


@dataclass(kw_only=True)
class StandbyConfig:
    """Warm standbys: spare processes that take over a rank without a restart."""

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
    """Jobs on Slurm (cluster=slurm): partition, time limits, spares, what happens at the limit."""

    partition: str | None = None
    """Partition (sbatch --partition) of the main job and the spares; None: the cluster's default
    partition (no --partition). The local lab's is debug."""
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
    """The controller's and agents' protocol core: backend, device, timeouts, relays, controller restarts."""

    backend: str = "gloo"
    """torch.distributed backend of the training groups: gloo | nccl."""
    device: str = "cpu"
    """Device of the stage modules: cpu | cuda."""
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
    relay: bool = False
    """Each node's agents reach the controller through their node monitor's relay: one connection,
    one vote frame per step and one heartbeat line per node instead of per rank (needs
    detect.monitors=true; for runs of hundreds of nodes and more)."""
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
    fork_agents: bool = True
    """cluster=local: fork ranks and standbys from one process that imported torch once (a restart
    of N ranks does not pay N imports); false: each is a fresh ``python -m tmslurm.agent.main``."""


@dataclass(kw_only=True)
class DetectConfig:
    """Failure detection: heartbeats, hangs by progress, node monitors, lost nodes, replica checks."""

    heartbeat_interval_s: float = 0.2
    """Agent -> controller heartbeat period."""
    heartbeat_timeout_s: float = 3.0
    """A rank silent this long is declared hung and fenced (runtime.connect_timeout_s while it is still
    starting: before its started, or a standby's first ready)."""
    hang_factor: float = 10.0
    """A rank whose vote is the only one missing for longer than hang_factor x the median step time
    (at least detect.hang_floor_s) is declared hung, fenced and replaced, even if it heartbeats.
    Before a step time is known (the first two commits) the limit is runtime.connect_timeout_s."""
    hang_floor_s: float = 2.0
    """The least time a rank may lag behind all the others' votes before it is declared hung."""
    monitors: bool = True
    """Run one node monitor per node (a tiny process that trains nothing): it heartbeats every
    detect.monitor_interval_s and reports the exit of the node's tmslurm processes at once (pidfd)."""
    monitor_interval_s: float = 0.1
    """Node monitor -> controller heartbeat period."""
    node_timeout_s: float = 0.8
    """A node whose monitor and processes were all silent this long, while other nodes were heard,
    is declared lost (a power-off or a cut link sends nothing)."""
    verify_replicas: bool = False
    """Workers send a parameter digest with every vote; the controller checks DP replicas are equal."""


@dataclass(kw_only=True)
class ShadowConfig:
    """Live shadowing: planned switches that move no state in their pause."""

    enabled: bool = True
    """Planned switches move no state in their pause: each standby takes its leaver's state in the
    background, then applies the leaver's reduced gradient at every committed step (comm/shadow.py)."""
    min_notice_s: float = 10.0
    """A notice whose deadline is nearer than this switches at once, the state in the pause."""
    catchup_timeout_s: float = 120.0
    """Longest wait for shadows to catch up before the switch goes ahead anyway (what is left of the
    leaver's state then travels in the pause)."""


@dataclass(kw_only=True)
class GrayConfig:
    """Gray failures: a slow node (compute or link) moved off to a warm standby with a planned switch."""

    evict: bool = False
    """Move a node off with a planned switch to a warm standby when one of its ranks stays slower
    than its data-parallel peers (its busy time, step time less communication waits; see gray.*).
    Needs parallel.dp >= 2: a rank is judged against its peers."""
    factor: float = 1.5
    """A rank is slow when its busy time is at least this many times its peers' (median over the window)."""
    window: int = 8
    """Steps judged together: a rank must be slow in more than half of them (a single hiccup moves nothing)."""
    min_excess_s: float = 0.05
    """And slower than its peers by at least this many seconds a step (tiny steps are noise)."""
    budget_per_hour: int = 2
    """At most this many gray evictions in any hour (a guard against evicting node after node)."""
    link_probe_s: float = 2.0
    """With gray.evict and node monitors: every this many seconds each monitor sends
    gray.link_probe_bytes to another node's monitor, so that a slow link is found (a slow link
    slows every rank alike, so busy times cannot). 0 turns link probes off."""
    link_probe_bytes: int = 2097152
    """Bytes per link probe. Several times a token bucket's burst, or the burst hides the rate (the
    failure lab's slowlink passes 256 KiB at full speed); on fast fabrics use tens of MiB."""
    link_probe_timeout_s: float = 10.0
    """A probe not acknowledged within this counts as a sample of at most bytes/timeout."""
    link_slow_factor: float = 10.0
    """A node's link is slow when even its best probe over gray.link_window is this many times
    below the median of every node's best (on the 2-core lab a healthy node's best was once 8.7x
    below; a 20 mbit/s link is ~900x)."""
    link_window: int = 6
    """Probes per node judged together (each round a node sends one and receives one, each with
    another partner): its best must be slow, so one slow partner or one hiccup moves nothing."""


@dataclass(kw_only=True)
class MetricsConfig:
    """Prometheus endpoints of the controller and the node monitors."""

    port: int = 0
    """Serve Prometheus metrics from the controller on this port (0 = off; needs prometheus-client,
    ``pip install tmslurm[metrics]``). Read-only: every request gets the text exposition format."""
    monitor_port: int = 0
    """Each node monitor serves its node's Prometheus metrics on this port (0 = off; one monitor per
    host on a real cluster; with cluster=local every node is this host and only the first binds)."""
    addr: str = "127.0.0.1"
    """Address the metrics endpoints (the controller's, the monitors') bind to (``0.0.0.0`` to let a
    Prometheus server on another host scrape them)."""


@dataclass(kw_only=True)
class SecurityConfig:
    """Who may send notices to the gate besides the run's own token."""

    admin_public_key_file: str | None = None
    """The cluster admin's Ed25519 public key (PEM): notices signed with its private key are
    accepted (they can only notify); none: only the run token is accepted."""
    notice_max_age_s: float = 120.0
    """A signed notice older (or newer) than this by its timestamp is refused as stale."""


@dataclass(kw_only=True)
class BenchConfig:
    """Benchmark-only switches: the baselines, the costs the benchmarks measure and step pacing. Not for
    production runs: ``tmslurm-launch --help`` leaves this section out, ``--cfg job`` unless one was changed."""

    restart_mode: str = "tmslurm"
    """Recovery strategy: tmslurm (standby switch) | injob_restart | requeue_restart (baselines)."""
    switch_mode: str = "delta"
    """delta (rebuild only affected groups, in the background) | full (rebuild every group inside
    the pause, what a naive re-initialisation does; for the scaling benchmark)."""
    commit_vote: bool = True
    """Vote on every step commit (off only to measure its cost)."""
    heartbeats: bool = True
    """Agents send heartbeats (off only to measure their cost; hangs are then not detected)."""
    step_delay_s: float = 0.0
    """Extra sleep per step: pacing for the demo and for tests and benchmarks that need a step to last (0: none)."""


@dataclass(kw_only=True)
class RunConfig:
    """The root: one section per concern, where ranks run, the run directory and injected faults."""

    defaults: list[Any] = field(default_factory=lambda: ["_self_", {"model": "tiny"}, {"cluster": "local"}])
    """Hydra's defaults list (the presets chosen by default); not a setting."""
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    """The layout."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The model's sizes."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """Training."""
    standby: StandbyConfig = field(default_factory=StandbyConfig)
    """Warm standbys."""
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    """Slurm jobs."""
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    """The runtime protocol."""
    detect: DetectConfig = field(default_factory=DetectConfig)
    """Failure detection."""
    shadow: ShadowConfig = field(default_factory=ShadowConfig)
    """Live shadowing."""
    gray: GrayConfig = field(default_factory=GrayConfig)
    """Gray failures."""
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    """Metrics endpoints."""
    security: SecurityConfig = field(default_factory=SecurityConfig)
    """Signed notices."""
    bench: BenchConfig = field(default_factory=BenchConfig)
    """Benchmark-only switches."""
    cluster: str = "local"
    """Where ranks run: local (processes on this host) | slurm (submit jobs)."""
    run_dir: str = ""
    """Run directory; empty means runs/<timestamp> under the current directory."""
    faults: list[FaultConfig] = field(default_factory=list)
    """Injected faults [{step, kind, rank}] for tests, benchmarks and the demo."""


def register_configs() -> None:
    """Register the schema in Hydra's ConfigStore as the primary config ``tmslurm`` (idempotent); the
    presets of the config groups are files in tmslurm/conf/ (:mod:`.presets`)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="tmslurm", node=RunConfig)


def world_size(p: ParallelConfig) -> int:
    return p.dp * p.pp * p.tp


def wants_monitors(cfg: RunConfig) -> bool:
    """Node monitors run when enabled and heartbeats are on (a silent monitor would look dead)."""
    return cfg.detect.monitors and cfg.bench.heartbeats


def num_nodes(p: ParallelConfig) -> int:
    return p.nodes if p.nodes is not None else world_size(p) // p.ranks_per_node
