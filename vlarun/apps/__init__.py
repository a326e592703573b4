"""One module per group of commands: each defines ``OPTIONS``, ``RUN`` and ``SHOW`` tables keyed
by command name, which ``vlarun.cli`` imports only for the command that runs.

model.py     info, act, check-parity, bench engine
train.py     demos, train, distill
evaluate.py  eval, fidelity, calibrate-drift
bench.py     bench accel, bench decode
sched.py     predict, profile, plan, fleet, bench sched | validate | predictor
runtime.py   keys, serve-edge, ping, run-robot
(bench coinfer, serve, scaleout, gpu-check, compile, load, cpu, floor, paired and
 side-by-side register in their own vlarun/bench modules)
"""
