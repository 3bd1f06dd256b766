"""An agent imports its code (torch, for a worker or standby) before its hello: the heartbeat thread
starts with the hello, and an import after it held the GIL long enough, on a loaded CI host, for the
controller to fence every rank at step 0 as silent. A monitor imports no torch at all."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PROBE = """
import json, sys
import tmslurm.agent.main as m
from tmslurm.core.errors import TmslurmError

def hello(*args, **kwargs):
    print(json.dumps({"torch": "torch" in sys.modules, "worker": "tmslurm.agent.worker" in sys.modules,
                      "standby": "tmslurm.agent.standby" in sys.modules}))
    raise TmslurmError("no controller here (test)")

m.hello = hello
sys.exit(m.main(sys.argv[1:]))
"""


@pytest.mark.parametrize(
    "who,loaded",
    [
        (["--rank", "1"], {"torch": True, "worker": True}),
        (["--standby", "0"], {"torch": True, "standby": True}),  # (a standby's code uses the worker's too)
        (["--monitor"], {"torch": False, "worker": False, "standby": False}),
    ],
)
def test_what_is_imported_before_the_hello(tmp_path, who, loaded):
    out = subprocess.run(
        [sys.executable, "-c", PROBE, "--run-dir", str(tmp_path), *who], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 2, out.stderr  # the hello's error ends the agent with status 2
    seen = json.loads(out.stdout.splitlines()[0])
    assert {k: seen[k] for k in loaded} == loaded, out.stderr
