"""The edge's room: one core behind every front, its local backend and its I/O.

core.py          EdgeCore: admission, bookings, the seen-robots table and health, over typed
                 requests and outcomes; no socket, no wire bytes. Where the edge decides to
                 refuse a request: ``EdgeCore.admit`` / ``place``
local_worker.py  the core's local backend: stage queues, streams, the worker thread
queues.py        the per-stage queues, EDF, batching within deadline slack, the stage estimates
server.py        `vlarun serve-edge`: EdgeServer = EdgeCore + LocalWorker + its ROUTER socket and
                 I/O thread (schema and limits checked before the core sees a request)
zap.py           the CURVE handshake's authorizer, off the edge's Python threads
refusal_log.py   one rate-limited log line per refused request (the openpi server's too)
dashboard.py     `serve-edge --dashboard PORT`: the edge live in a browser and for Prometheus
"""
