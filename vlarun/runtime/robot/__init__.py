"""The robot's room: one request is plan -> execute -> learn, and the loops that call it.

agent.py      `vlarun run-robot`'s RobotAgent: plan -> execute -> learn, and the record
agent_config.py  AgentConfig: deadline, strategy, each side's stand-in, setting, floor
planner.py    plan: a Plan for every request (the scheduler's, a fixed strategy's, robot-only)
executor.py   execute: robot and edge segments, where the robot gives up on the edge
              (``sched/execution.py`` ``give_up_at``), hand-off, the plan's setting on both sides
learner.py    learn: link, local stage times, answers, the edge's schedule, energy, outcomes
costview.py   the scheduler contract's robot side: build, prime, the edge's state, the Outcome,
              the one energy account
request.py    one request's typed records: context, trace, RTC freeze, Inference
client.py     the robot's connection to the edge: requests with timeouts, probes; `vlarun ping`
monitor.py    background health probes: link RTT and bandwidth, edge queue, reconnect
chunks.py     the asynchronous action-chunk queue (inference overlaps execution)
episode.py    the one closed-loop episode loop (simulated time for eval, or a real control rate)
control.py    your own robot: Robot.act(image, instruction, state) -> one action per control
              tick (examples/own_robot.py)
"""
