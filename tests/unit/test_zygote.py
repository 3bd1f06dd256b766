"""The agent zygote (runtime.fork_agents): a forked agent is the spawner's own child, reads as a fresh
agent on /proc, and is killed and reaped through its handle; a bad request forks nothing; a dead
zygote makes the spawner start agents afresh.

Each case runs in a child Python process: the spawner's side makes its process a child subreaper,
which pytest's own process must not become.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

FORK_AND_KILL = """
import json, os, signal, sys, time
from pathlib import Path
from tmslurm.agent.monitor import is_agent_of, is_stopped
from tmslurm.controller.zygote_client import Zygote
run = Path(sys.argv[1])  # no controller.json: the agent waits for one (60 s), alive meanwhile
z = Zygote(dict(os.environ), run / "zygote.log")
h = z.spawn(["--run-dir", str(run), "--rank", "3", "--node", "local1"], {**os.environ, "MARK": "m1"}, run / "rank3.log")
ppid = int(Path(f"/proc/{h.pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
out = {"pid": h.pid, "ppid_is_us": ppid == os.getpid(), "is_agent": is_agent_of(h.pid, run),
       "rank_flag": b"--rank" in Path(f"/proc/{h.pid}/cmdline").read_bytes().split(b"\\0"),
       "sid_is_own": os.getsid(h.pid) == h.pid, "alive": h.poll() is None}
os.kill(h.pid, signal.SIGSTOP)
while not is_stopped(h.pid):
    time.sleep(0.01)
h.kill()  # also ends a stopped process
out["rc"] = h.wait(timeout=10)
h.kill()  # reaped: nothing is signalled any more
out["bad"] = None
z.proc.stdin.write(b'{"argv": "not a list", "env": {}, "log": "x"}\\n'); z.proc.stdin.flush()
out["bad"] = json.loads(z.proc.stdout.readline())
z.proc.kill(); z.proc.wait()  # the zygote dies: the next spawn says so, and gives it up
out["after_death"] = z.spawn(["--run-dir", str(run), "--rank", "0"], dict(os.environ), run / "rank0.log")
out["given_up"] = z.given_up
print(json.dumps(out))
"""


def test_a_forked_agent_is_our_child_reads_as_an_agent_and_dies_by_its_handle(tmp_path):
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(FORK_AND_KILL), str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.splitlines()[-1])
    assert out["ppid_is_us"] and out["is_agent"] and out["rank_flag"] and out["sid_is_own"] and out["alive"], out
    assert out["rc"] == -9, out
    assert "error" in out["bad"] and "pid" not in out["bad"], out
    assert out["after_death"] is None and out["given_up"] is True, out
    assert (tmp_path / "rank3.log").exists()  # its standard streams went to its own log
