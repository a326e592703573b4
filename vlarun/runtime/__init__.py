"""Device-edge co-inference over a real network (EcoVLA runtime, shared/SEEDS.md section 1).

Rooms (each package's docstring lists its modules; tests/test_layers.py keeps them apart):
  robot/      one request: plan -> execute -> learn; the robot's client, link monitor, chunk
              queue, the closed-loop episode and your own robot's loop
  edge/       one edge core (admission, bookings, seen robots, health), its local worker and
              the ZeroMQ server around them; the handshake authorizer; the dashboard
  scaleout/   the same core over Ray workers behind one front
  openpi/     openpi's WebSocket policy protocol (`vlarun serve-policy`)
  testbed/    child processes, link shaping, background load, overhead measurement
robot/ and edge/ never import each other: what they share is here, below both:
  transport.py  CurveZMQ keys (0600), the edge's ROUTER, a robot's DEALER; --insecure warns
  protocol.py   the typed records of the edge protocol's metadata (stage timings, the schedule)
  segments.py   a plan as alternating robot / edge segments; the edge's request schema
  emulate.py    emulated devices: this machine's stages take a named device's time

(the wire codec - msgpack header frame + one raw frame per tensor, bf16 / int8 / zlib / lz4
 payload reduction, every claim checked before allocating, no pickle - is vlarun/stages/wire.py,
 the one codec: the stage graph's serialised runs use it too)
(commands: vlarun/apps/runtime.py; `vlarun bench coinfer`: vlarun/bench/coinfer.py)
"""
