"""The scale-out room: `serve-edge --workers N | --ray-address`, the same edge core over Ray
workers.

front.py         EdgeFront = EdgeCore + WorkerPool + the robot-facing socket and one socket per
                 worker (forwarding, re-dispatch on a worker's loss)
worker_pool.py   the core's Ray backend: each worker's flights, bookings, stage times; dispatch
ray_workers.py   the workers: an EdgeServer per Ray actor; a local cluster on loopback only
reaper.py        stops a dead front's Ray processes and removes its folder (SIGKILL included)
proctree.py      a process's descendants and their listening TCP sockets (/proc)
"""
