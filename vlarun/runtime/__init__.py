"""Device-edge co-inference over a real network (EcoVLA runtime, shared/SEEDS.md section 1).

(the wire codec - msgpack header frame + one raw frame per tensor, bf16 / int8 / zlib / lz4
 payload reduction, every claim checked before allocating, no pickle - is vlarun/stages/wire.py,
 the one codec: the stage graph's serialised runs use it too)
transport.py  CurveZMQ keys (0600), the edge's ROUTER, a robot's DEALER; --insecure warns
segments.py   a plan as alternating robot / edge segments; the edge's request schema
queues.py     the edge's per-stage queues, EDF, batching within deadline slack
edge_core.py  the edge's one core, no socket, no wire bytes: admission, bookings, the
              seen-robots table, health; typed requests in, typed outcomes out; its backend
              runs the stages (one edge and a scale-out front hold it alike)
local_worker.py  the core's local backend: stage queues, streams, the worker thread that
              batches and runs stages, the committed schedule (reservations)
server.py     `vlarun serve-edge`: EdgeServer = EdgeCore + LocalWorker + its ROUTER socket and
              I/O thread (health and bookings at once, validation; the schedule in every reply
              and ledger push); in-process requests (submit / cancel)
worker_pool.py  the core's Ray backend: the front's view of each worker (flights, bookings,
              stage times), the dispatch order
scaleout.py   `serve-edge --workers N | --ray-address`: EdgeFront = EdgeCore + WorkerPool + the
              robot-facing socket and one socket per Ray worker (forwarding, re-dispatch on a
              worker's loss)
ray_workers.py  the workers: an EdgeServer per Ray actor, keys and endpoints over Ray; a local
              cluster on loopback only (checked at start)
reaper.py     stops a dead front's Ray processes and removes its folder (SIGKILL included)
proctree.py   a process's descendants and their listening TCP sockets (/proc)
client.py     a robot's requests with timeouts, bandwidth probes; `vlarun ping`
monitor.py    background health probes: link RTT and bandwidth, edge queue, reconnect
costview.py   the scheduler contract's robot side: build, prime, the edge's state, the
              Outcome, the one energy account (this host's times converted to the catalog
              devices the roles name)
planner.py    plan: a Plan for every request (the scheduler's, a fixed strategy's, robot-only)
executor.py   execute: local + remote segments, fallback, hand-off, the plan's accelerator
              setting on both sides (policy/setting.py)
learner.py    learn: link, local stage times, answers, the edge's schedule, energy, outcomes
request.py    one request's typed records: context, trace, RTC freeze, Inference
agent.py      `vlarun run-robot`'s RobotAgent: plan -> execute -> learn
chunks.py     asynchronous action-chunk queue (inference overlaps execution)
robot.py      your own robot loop: Robot.act(image, instruction, state) -> one action per
              control tick (agent + chunk queue; examples/own_robot.py)
episode.py    the one closed-loop episode loop (simulated time for eval, or a real control rate)
relay.py      user-space link shaping (bandwidth, delay, jitter, scheduled drops)
netns.py      kernel link shaping: network namespace + veth + tc tbf (root only)
procs.py      edge / relay child processes
overhead.py   runtime overhead per remote stage vs a raw ZeroMQ echo
openpi.py     openpi's WebSocket policy protocol (`vlarun serve-policy`)
(commands: vlarun/apps/runtime.py; `vlarun bench coinfer`: vlarun/bench/coinfer.py)
"""
