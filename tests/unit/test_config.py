"""compose_config: every bad override is a ConfigError whose message names what to change."""

from __future__ import annotations

from pathlib import Path

import pytest

import tmslurm
from tmslurm.core.config import (
    CONF_DIR,
    MODEL_PRESETS,
    SLURM_CHECKPOINT_EVERY,
    FaultConfig,
    ModelConfig,
    RunConfig,
    compose_config,
    fault_amount,
    fault_ranks,
    from_dict,
    group_options,
    to_dict,
)
from tmslurm.core.errors import ConfigError

# (overrides, substrings the message must contain: the override or the key to change, and valid values)
BAD = [
    pytest.param(["parallel.foo=1"], ["unknown key parallel.foo"], id="unknown-key"),
    pytest.param(["foo=1"], ["unknown key foo", "docs/config-reference.md"], id="unknown-top-level-key"),
    pytest.param(["+foo=1"], ["unknown key foo"], id="appended-unknown-key"),
    pytest.param(["parallel.dp=abc"], ["parallel.dp=abc"], id="wrong-type-int"),
    pytest.param(["parallel.dp=1.5"], ["parallel.dp=1.5"], id="wrong-type-float-for-int"),
    pytest.param(["train.steps=abc"], ["train.steps=abc"], id="wrong-type-steps"),
    pytest.param(["parallel.dp=-1"], ["parallel.dp=-1", ">= 1"], id="negative-dp"),
    pytest.param(["parallel.pp=0"], ["parallel.pp=0", ">= 1"], id="zero-pp"),
    pytest.param(["standby.count=-1"], ["standby.count=-1", ">= 0"], id="negative-standby-count"),
    pytest.param(["train.steps=0"], ["train.steps=0", ">= 1"], id="zero-steps"),
    pytest.param(["train.micro_batches=0"], ["train.micro_batches=0"], id="zero-micro-batches"),
    pytest.param(["train.checkpoint_every=-1"], ["train.checkpoint_every=-1", ">= 0"], id="negative-checkpoint-every"),
    pytest.param(["train.checkpoint_async=maybe"], ["train.checkpoint_async=maybe"], id="checkpoint-async-not-a-bool"),
    pytest.param(["standby.warmup_iters=0"], ["standby.warmup_iters=0"], id="zero-warmup-iters"),
    pytest.param(["parallel.nodes=3"], ["parallel.nodes", "4"], id="nodes-do-not-match-world"),
    pytest.param(["parallel.nodes=0"], ["parallel.nodes=0"], id="zero-nodes"),
    pytest.param(
        ["parallel.ranks_per_node=3"], ["parallel.ranks_per_node=3", "divide"], id="ranks-per-node-does-not-divide"
    ),
    pytest.param(["parallel.tp=3"], ["model.n_head=2", "parallel.tp=3"], id="tp-does-not-divide-heads"),
    pytest.param(
        ["parallel.tp=2", "train.task=examples.mlp_task:MlpTask"],
        ["parallel.tp=2", "supports_tp"],
        id="task-without-tp",
    ),
    pytest.param(["standby.max_classes=0"], ["standby.max_classes=0"], id="zero-max-classes"),
    pytest.param(["parallel.pp=5"], ["parallel.pp=5", "model.n_layer=4"], id="pp-beyond-layers"),
    pytest.param(["model.n_head=3"], ["model.n_head=3", "model.d_model"], id="heads-do-not-divide-width"),
    pytest.param(["train.lr=0"], ["train.lr"], id="zero-lr"),
    pytest.param(["train.optimizer=lamb"], ["train.optimizer='lamb'", "adamw, sgd"], id="unknown-optimizer"),
    pytest.param(
        ["faults=[{step:1,kind:explode,rank:0}]"],
        ["faults[0].kind='explode'", "drain, kill, stop, hang, hiccup, slow, node_down"],
        id="unknown-fault-kind",
    ),
    pytest.param(["faults=[{step:1,kind:kill,rank:4}]"], ["faults[0].rank=4", "0..3"], id="fault-rank-out-of-range"),
    pytest.param(["faults=[{step:1,kind:kill,rank:-1}]"], ["faults[0].rank=-1"], id="fault-rank-negative"),
    pytest.param(
        ["faults=[{step:1,kind:kill,ranks:[1,5]}]"],
        ["faults[0].ranks=[1, 5] names 5", "0..3"],
        id="fault-ranks-out-of-range",
    ),
    pytest.param(
        ["faults=[{step:1,kind:kill,ranks:[1,1]}]"], ["faults[0].ranks=[1, 1]", "twice"], id="fault-ranks-twice"
    ),
    pytest.param(
        ["faults=[{step:1,kind:corrupt_shadow,ranks:[1,2]}]"],
        ["corrupt_shadow", "faults[0].rank"],
        id="corrupt-shadow-ranks",
    ),
    pytest.param(
        ["cluster=slurm", "faults=[{step:1,kind:throttle,rank:1,amount:'0'}]"],
        ["faults[0].amount='0'", "1..1000"],
        id="throttle-amount-zero",
    ),
    pytest.param(
        ["cluster=slurm", "faults=[{step:1,kind:slowlink,rank:1,amount:fast}]"],
        ["faults[0].amount='fast'", "20mbit"],
        id="slowlink-amount-bad",
    ),
    pytest.param(
        ["faults=[{step:1,kind:kill,rank:1,amount:'30'}]"],
        ["faults[0].amount='30'", "only throttle, slowlink, hiccup, slow"],
        id="amount-on-kill",
    ),
    pytest.param(
        ["faults=[{step:1,kind:throttle,rank:1}]"],
        ["faults[0].kind=throttle", "cluster=slurm"],
        id="throttle-needs-slurm",
    ),
    pytest.param(
        ["train.steps=20", "faults=[{step:20,kind:kill,rank:0}]"],
        ["faults[0].step=20", "0..19"],
        id="fault-step-out-of-range",
    ),
    pytest.param(["faults=[{step:-1,kind:kill,rank:0}]"], ["faults[0].step=-1"], id="fault-step-negative"),
    pytest.param(
        ["faults=[{step:1,kind:drain,rank:0},{step:2,kind:kill,rank:9}]"],
        ["faults[1].rank=9"],
        id="second-fault-is-named",
    ),
    pytest.param(
        ["faults=[{step:1,kind:node_down,rank:0}]"],
        ["faults[0].kind=node_down", "cluster=slurm"],
        id="node-down-needs-slurm",
    ),
    pytest.param(
        ["faults=[{step:1,kind:kill,rank:0,when:later}]"],
        ["faults[0].when='later'", "midstep, recover, transfer, join"],
        id="bad-fault-when",
    ),
    pytest.param(
        ["faults=[{step:1,kind:kill,foo:1}]"], ["unknown key faults[i].foo", "when"], id="unknown-fault-field"
    ),
    pytest.param(["faults={step:1}"], ["faults={step:1}"], id="faults-not-a-list"),
    pytest.param(["runtime.backend=mpi"], ["runtime.backend='mpi'", "gloo, nccl"], id="bad-backend"),
    pytest.param(["runtime.device=tpu"], ["runtime.device='tpu'", "cpu, cuda"], id="bad-device"),
    pytest.param(["cluster=k8s"], ["cluster=k8s", "local, slurm"], id="bad-cluster"),
    pytest.param(
        ["bench.restart_mode=pray"],
        ["bench.restart_mode='pray'", "tmslurm, injob_restart, requeue_restart"],
        id="bad-restart-mode",
    ),
    pytest.param(["bench.switch_mode=half"], ["bench.switch_mode='half'", "delta, full"], id="bad-switch-mode"),
    pytest.param(["slurm.backend=rest"], ["slurm.backend='rest'", "auto, cli, pyslurm"], id="bad-slurm-backend"),
    pytest.param(["slurm.on_limit=pray"], ["slurm.on_limit='pray'", "requeue, resubmit, stop"], id="bad-on-limit"),
    pytest.param(["slurm.signal_lead_s=5"], ["slurm.signal_lead_s=5", "10..65535"], id="signal-lead-too-short"),
    pytest.param(["slurm.signal_lead_s=70000"], ["slurm.signal_lead_s=70000"], id="signal-lead-too-long"),
    pytest.param(["runtime.backend=nccl"], ["runtime.backend=nccl", "runtime.device=cuda"], id="nccl-with-cpu"),
    pytest.param(["detect.heartbeat_timeout_s=0.3"], ["detect.heartbeat_timeout_s"], id="heartbeat-timeout-too-short"),
    pytest.param(["runtime.wait_slice_s=0"], ["runtime.wait_slice_s"], id="zero-wait-slice"),
    pytest.param(["model=huge"], ["model=huge", "small", "tiny"], id="unknown-model-preset"),
    pytest.param(
        ["train.task=no_such_module_xyz:Task"],
        ["train.task='no_such_module_xyz:Task'", "No module named"],
        id="task-module-missing",
    ),
    pytest.param(["train.task=tmslurm.train.model:NoSuchTask"], ["train.task=", "NoSuchTask"], id="task-class-missing"),
    pytest.param(["train.task=tmslurm.train.model"], ["train.task='tmslurm.train.model'"], id="task-without-class"),
    pytest.param(
        ["train.resume_from=no/such/run"],
        ["train.resume_from='no/such/run'", "checkpoints"],
        id="resume-without-checkpoints",
    ),
    pytest.param(["train.data_path=no/such/file.txt"], ["train.data_path='no/such/file.txt'"], id="missing-data-file"),
    pytest.param(["parallel.dp"], ["parallel.dp"], id="override-without-value"),
]


@pytest.mark.parametrize("overrides, named", BAD)
def test_bad_override_is_a_config_error_naming_it(overrides, named):
    with pytest.raises(ConfigError) as info:
        compose_config(overrides)
    message = str(info.value)
    for text in named:
        assert text in message, f"{text!r} not in {message!r}"


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param(["faults=[{kind:kill}]"], id="fault-without-step"),
        pytest.param(["train.task=:Task"], id="task-with-empty-module"),
        pytest.param(["train.task=os:path"], id="task-not-a-class"),
        pytest.param(["bench.commit_vote=false", "standby.count=1"], id="no-vote-with-standbys"),
    ],
)
def test_malformed_values_are_config_errors_too(overrides):
    with pytest.raises(ConfigError):
        compose_config(overrides)


def test_defaults_compose():
    cfg = compose_config([])
    assert isinstance(cfg, RunConfig)
    assert (cfg.parallel.dp, cfg.parallel.pp, cfg.parallel.tp) == (2, 2, 1)
    assert cfg.cluster == "local" and cfg.runtime.backend == "gloo" and cfg.runtime.device == "cpu"
    assert cfg.model == MODEL_PRESETS["tiny"]
    assert cfg.train.task == "tmslurm.train.model:ReferenceTask"
    assert cfg.faults == [] and cfg.standby.count == 0


def test_model_small_gives_the_small_preset():
    cfg = compose_config(["model=small"])
    assert isinstance(cfg.model, ModelConfig)
    assert cfg.model == MODEL_PRESETS["small"]
    assert (cfg.model.size, cfg.model.n_layer, cfg.model.d_model) == ("small", 6, 128)


def test_a_field_overrides_the_preset():
    cfg = compose_config(["model=small", "model.n_layer=8", "parallel.pp=4", "parallel.dp=1"])
    assert cfg.model.n_layer == 8 and cfg.model.d_model == 128


def test_experiment_demo_preset():
    cfg = compose_config(["+experiment=demo"])
    assert (cfg.parallel.dp, cfg.parallel.pp) == (2, 2)
    assert cfg.standby.count == 2
    assert cfg.train.steps == 60 and cfg.train.checkpoint_every == 20


def test_checkpoints_are_asynchronous_by_default():
    assert compose_config([]).train.checkpoint_async is True
    assert compose_config(["train.checkpoint_async=false"]).train.checkpoint_async is False


@pytest.mark.parametrize(
    ("overrides", "every"),
    [
        (["cluster=slurm"], SLURM_CHECKPOINT_EVERY),
        (["cluster=slurm", "train.checkpoint_every=0"], 0),
        (["cluster=slurm", "train.checkpoint_every=7"], 7),
        (["cluster=slurm", "+experiment=demo"], 20),
        (["cluster=local"], 0),
        ([], 0),
    ],
    ids=["slurm-default", "slurm-explicit-0", "slurm-explicit-7", "slurm-preset", "local", "default-local"],
)
def test_slurm_runs_checkpoint_periodically_unless_told_otherwise(overrides, every):
    assert compose_config(overrides).train.checkpoint_every == every


def test_faults_parse_into_fault_configs():
    cfg = compose_config(
        ["faults=[{step:10,kind:drain,rank:1},{step:20,kind:kill,rank:2,when:recover},{step:5,kind:stop}]"]
    )
    assert cfg.faults == [
        FaultConfig(step=10, kind="drain", rank=1),
        FaultConfig(step=20, kind="kill", rank=2, when="recover"),
        FaultConfig(step=5, kind="stop", rank=0, when="midstep"),
    ]
    assert all(type(f) is FaultConfig for f in cfg.faults)


def test_one_fault_may_hit_several_ranks_and_carry_an_amount():
    cfg = compose_config(
        [
            "cluster=slurm",
            "faults=[{step:4,kind:power_off,ranks:[0,3]},{step:6,kind:throttle,rank:1},"
            "{step:7,kind:slowlink,ranks:[2],amount:500kbit},{step:8,kind:kill,rank:2}]",
        ]
    )
    assert [fault_ranks(f) for f in cfg.faults] == [[0, 3], [1], [2], [2]]
    assert [fault_amount(f) for f in cfg.faults] == ["", "30", "500kbit", ""]


def test_nodes_and_ranks_per_node_that_match():
    cfg = compose_config(["parallel.nodes=2", "parallel.ranks_per_node=2"])
    assert cfg.parallel.nodes == 2


def test_dict_round_trip_is_what_workers_receive():
    cfg = compose_config(["faults=[{step:3,kind:kill,rank:1}]", "standby.count=1"])
    back = from_dict(to_dict(cfg))
    assert back == cfg


def test_from_dict_rejects_unknown_keys():
    with pytest.raises(ConfigError, match="unknown config key 'bogus'"):
        from_dict({"bogus": 1})


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("parallel.dpp=2", "unknown key parallel.dpp; did you mean parallel.dp?"),
        ("+parallel.dpp=2", "unknown key parallel.dpp; did you mean parallel.dp?"),
        ("train.stesp=3", "unknown key train.stesp; did you mean train.steps?"),
        (
            "runtime.heartbeat_timeout=3",
            "unknown key runtime.heartbeat_timeout; did you mean detect.heartbeat_timeout_s? "
            "(runtime.heartbeat_timeout_s moved to detect.heartbeat_timeout_s)",
        ),
        (
            "runtime.gray_evict=true",
            "unknown key runtime.gray_evict; did you mean gray.evict? (runtime.gray_evict moved to gray.evict)",
        ),
        (
            "train.step_delay_s=0.1",
            "unknown key train.step_delay_s; did you mean bench.step_delay_s? "
            "(train.step_delay_s moved to bench.step_delay_s)",
        ),
        (
            "runtime.metrics_port=9400",
            "unknown key runtime.metrics_port; did you mean metrics.port? (runtime.metrics_port moved to metrics.port)",
        ),
        ("modle=small", "unknown key modle; did you mean model?"),
        ("faults=[{step:1,kind:kill,rnak:1}]", "unknown key faults[i].rnak; did you mean faults[i].rank?"),
    ],
)
def test_an_unknown_key_gets_the_closest_key_and_nothing_else(override, message):
    with pytest.raises(ConfigError) as info:
        compose_config([override])
    assert str(info.value) == message


def test_hydra_run_dir_is_the_run_directory(tmp_path):
    assert compose_config([f"hydra.run.dir={tmp_path}/r"]).run_dir == f"{tmp_path}/r"


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (["hydra.job.name=x"], ["hydra.job.name is not used", "Fix: remove hydra.job.name"]),
        (["hydra.run.dir=a", "run_dir=b"], ["both name the run directory", "run_dir=DIR"]),
        (["experiment=demo"], ["Fix: pass +experiment=demo"]),
        (["+experiment=nope"], ["experiment=nope", "demo"]),
    ],
)
def test_hydra_settings_and_groups_fail_naming_the_fix(overrides, named):
    with pytest.raises(ConfigError) as info:
        compose_config(overrides)
    for text in named:
        assert text in str(info.value)


def test_the_config_groups_ship_inside_the_package():
    assert CONF_DIR == Path(tmslurm.__file__).parent / "conf"
    assert group_options("cluster") == ["local", "slurm"]
    assert group_options("model") == ["tiny", "small", "medium", "base", "large"]
    assert "demo" in group_options("experiment")
    pyproject = (Path(tmslurm.__file__).parents[1] / "pyproject.toml").read_text()
    assert 'tmslurm = ["conf/*/*.yaml"]' in pyproject  # package data: the wheel has every file below
    assert sorted(CONF_DIR.rglob("*.yaml")) == sorted(CONF_DIR.glob("*/*.yaml"))


@pytest.mark.parametrize("name", ["tiny", "small", "medium", "base", "large"])
def test_each_model_preset_composes_to_its_model_presets_entry(name):
    cfg = compose_config([f"model={name}", "parallel.pp=1", "parallel.dp=1"])
    assert cfg.model == MODEL_PRESETS[name] and cfg.model.size == name


@pytest.mark.parametrize("cluster", ["local", "slurm"])
def test_cluster_is_a_config_group(cluster):
    assert compose_config([f"cluster={cluster}"]).cluster == cluster
