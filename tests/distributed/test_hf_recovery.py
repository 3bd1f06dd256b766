"""Hugging Face models through a drain and a SIGKILL end bit-identical to their uninterrupted run.

The issue's own command: ``train.task=tmslurm.train.hf:CausalLMTask model.hf_config=examples/hf/llama-tiny/config.json``
at DP2 x PP2, a drain of rank 1 at step 5 and a SIGKILL of rank 2 at step 9. Two spare nodes are warm
before the first step (the universal standbys built the HF stages of every shape class), so both events
are switches, not restarts.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytestmark = pytest.mark.dist

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "hf"
LAYOUT = ("parallel.dp=2", "parallel.pp=2", "train.steps=14", "train.task=tmslurm.train.hf:CausalLMTask")


@pytest.mark.parametrize("model", ["llama-tiny", "gpt2-tiny"])
def test_a_drain_and_a_kill_end_exact(launch, baseline, model):
    source = f"model.hf_config={EXAMPLES / model / 'config.json'}"
    ref = baseline(*LAYOUT, source)
    s = launch(
        *LAYOUT,
        source,
        "standby.count=2",
        "standby.start_when_warm=true",
        "detect.heartbeat_timeout_s=2.0",
        "faults=[{step:5,kind:drain,rank:1},{step:9,kind:kill,rank:2}]",
    ).wait()
    assert [(e["kind"], e["ranks"]) for e in s["events"]] == [("planned", [1]), ("unexpected", [2])], s["events"]
    assert s["steps"] == 14 and s["replicas_equal"] is True
    assert s["final_state_sha256"] == ref["final_state_sha256"] is not None
    assert s["final_params_sha256"] == ref["final_params_sha256"]
    assert s["loss_last"] < s["loss_first"]
