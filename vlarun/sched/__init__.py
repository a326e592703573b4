"""Latency and energy model of every stage on every device, and the SLO-constrained
energy-priority scheduler (EcoVLA, shared/SEEDS.md section 1).

  catalog.py    devices.json (peaks, memory, power, each with its source); this-cpu measured
  cost.py       roofline stage time with efficiency priors; measured profiles override it
  energy.py     power between idle and busy by utilisation; control-cycle energy per inference
  link.py       bandwidth (max filter, drop detection, timeout bound) and RTT
  predictor.py  start/end times over the DAG: availability, queues, reservations, residual
  calibration.py  what measurements teach the predictor: stage factors, boundary overheads,
                residuals and on-time shares per placement, the energy part; P(on time)
  settings_table.py  the settings tables: each knob value and its measured accuracy cost
  plans.py      placements x accelerator settings (settings.json: measured accuracy costs),
                memory/dtype filter, accuracy floor
  contract.py   ExecutionPlan (what to run where, predicted) and Outcome (what happened)
  scheduler.py  Scheduler: the core rule stated once, and the one object callers hold,
                composed of the three parts below
  scoring.py    candidates and their modelled stage costs; the predictor's recursion
                vectorised over all of them (reservations, edge batching); on-time probability
  decision.py   the rule: miss budget, safety net, bounded exploration, fallback
  feedback.py   Scheduler.observe(plan, outcome), the only feedback path; warm-up priming;
                the mid-request handoff
  profile.py    `vlarun profile`: stage medians and every timed run on this machine
  meters.py     NVML, tegrastats, INA3221, RAPL readers
  bookings.py   edge work ahead, as the queue model takes it (Booking) and gives it (Slot);
                each to and from its wire map
  queue_model.py  the edge's one queue model (the worker's rule played forward): the edge's
                forecast and admission, the scale-out front's dispatch, the fleet's edge
  records.py    run records (one dict per request) and their one summariser
(the fleet simulator and the checks of this cost model against what it cannot see live in
vlarun/world/: fleet.py, truth.py, validate.py, published.py, predictor_check.py)

Energy is modelled everywhere (labelled "modelled") unless a meter was read.
"""
