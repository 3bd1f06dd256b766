"""The figures measured on this repository's 2-core machine that the projection's laws are fitted to.

Contract: plain constants, each with the ``docs/bench`` file it was copied from;
``tests/unit/test_projection_parts.py`` checks every one against that file, so a re-measured file
and a stale constant cannot both land. Nothing here computes or raises.
"""

from __future__ import annotations

#: docs/bench/scaling.json: one planned switch at 4/8/16 ranks (DP(N/2) x PP2, tiny model, gloo on
#: loopback, up to 17 processes on 2 shared cores), 10 repeats (commit 39c4022, 2026-12-03):
#: (ranks, mode) -> (phase1_s, phase2_s) per repeat, in repeat order.
SCALING_SAMPLES = {
    (4, "delta"): (
        (0.023282883, 3.66239983e-05),
        (0.020490439, 4.80890012e-05),
        (0.031881001, 5.76940001e-05),
        (0.031376277, 3.57870013e-05),
        (0.032160593, 3.95009993e-05),
        (0.010870505, 4.04800012e-05),
        (0.020642407, 3.83509978e-05),
        (0.021108936, 3.7758e-05),
        (0.023611419, 4.4417e-05),
        (0.030849095, 4.79919981e-05),
    ),
    (4, "full"): (
        (0.012736875, 0.010468368),
        (0.014112318, 0.009349024),
        (0.02064677, 0.010847936),
        (0.011696257, 0.008548776),
        (0.013132741, 0.006761596),
        (0.020856038, 0.012474011),
        (0.012966664, 0.009526602),
        (0.012497197, 0.007091695),
        (0.012481653, 0.004461464),
        (0.013106341, 0.01160114),
    ),
    (8, "delta"): (
        (0.022320543, 4.47709972e-05),
        (0.046195662, 4.45300029e-05),
        (0.021285659, 6.9994996e-05),
        (0.015431357, 5.15189968e-05),
        (0.031388131, 5.00040042e-05),
        (0.053583705, 6.58240024e-05),
        (0.016356536, 8.48540003e-05),
        (0.022624995, 0.002478727),
        (0.039897086, 3.59439946e-05),
        (0.034888988, 0.002979286),
    ),
    (8, "full"): (
        (0.02783347, 0.018000545),
        (0.021780972, 0.016541988),
        (0.022834783, 0.021189515),
        (0.026776732, 0.020942357),
        (0.02389349, 0.01929027),
        (0.020593869, 0.016797056),
        (0.021189213, 0.015795641),
        (0.02328724, 0.017040977),
        (0.020770635, 0.016096448),
        (0.024949274, 0.023366227),
    ),
    (16, "delta"): (
        (0.109021652, 4.54569963e-05),
        (0.08949019, 9.93520007e-05),
        (0.056954234, 7.22320037e-05),
        (0.081669248, 5.03039992e-05),
        (0.056126449, 5.98210027e-05),
        (0.094694776, 0.000102525999),
        (0.118647701, 0.004991066),
        (0.094191948, 0.000116683004),
        (0.0985368, 6.52029994e-05),
        (0.04119485, 4.78210059e-05),
    ),
    (16, "full"): (
        (0.047937445, 0.047581896),
        (0.053051297, 0.046279451),
        (0.052801876, 0.044307449),
        (0.055209313, 0.043763604),
        (0.068043129, 0.05800317),
        (0.057886789, 0.052717484),
        (0.050151614, 0.044134073),
        (0.048106992, 0.037875243),
        (0.045212598, 0.04019487),
        (0.052518278, 0.038637338),
    ),
}
SCALING_PP = 2
#: docs/bench/control_scale.json, rows labelled 'selector gate (one reader thread)' (recorded in
#: commit 5ef6c74; the controller of fe82be1, whose gate reads every connection from one selector
#: thread, 57ad738, instead of a thread per connection): one controller process (5 threads at
#: every N) and N simulated agents on 2 shared cores, quiet machine, 50 ms steps, 50 measured
#: steps, default liveness.
CONTROL_RANKS = (64, 256, 1024)
COMMIT_P50_MS = (1.5, 4.54, 10.72)
RECOVERY_ABORT_MS = (3.06, 12.37, 33.13)
RECOVERY_PLAN_MS = (6.48, 14.44, 40.16)
CONTROLLER_CPU_MS_PER_STEP = (1.96, 6.39, 24.13)
#: The same series at 4,096 ranks (default liveness, steady state of 50 steps): the out-of-sample
#: check printed next to the extrapolation, never fitted. Its recovery did not complete within
#: 62 s, so there is no abort/plan point at 4,096.
COMMIT_P50_MS_4096 = 73.71
#: Issue 13's targets for the commit p50 (ms at ranks): what a scalable control plane must reach.
COMMIT_TARGET_MS = {1024: 5.0, 4096: 20.0}
#: docs/bench/liveness.json: 10 silent power-offs on the failure lab, node_timeout_s 0.8.
DETECT_P50_S_MEASURED = 0.83144211769104
CONTROLLER_TICK_S = 0.05
"""The controller checks its deadlines at most every 50 ms (docs/benchmarks.md section 7)."""
