"""The testbed: what benchmarks, tests and demos put around a robot and an edge, never what a
deployment runs.

procs.py      edge servers and link relays as child processes
relay.py      user-space link shaping: bandwidth, one-way delay, jitter, scheduled drops
netns.py      kernel link shaping: a network namespace, a veth pair and tc tbf (root only)
loadgen.py    open-loop background load: the other robots of a loaded edge, in a process
overhead.py   runtime overhead per remote stage against a raw ZeroMQ echo of the same bytes
"""
