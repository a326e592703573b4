"""One module per group of commands: each defines ``OPTIONS``, ``RUN`` and ``SHOW`` tables keyed
by command name, which ``vlarun.cli`` imports only for the command that runs.

model.py     info, act, check-parity, convert
train.py     demos, train, distill
evaluate.py  eval, fidelity, calibrate-drift
sched.py     predict, profile, plan, fleet
runtime.py   keys, serve-edge, ping, run-robot
Every `vlarun bench NAME` registers in its own module, the one that does the work (one module
per benchmark command): vlarun/bench/<name>.py, or for the checks of the cost model against
what it cannot see, vlarun/world/validate.py | published.py | predictor_check.py.
"""
