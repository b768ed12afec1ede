"""tokenwire's scheduler: the one door between the gateway and the engine (docs/scheduler.md).

    door.py       Scheduler: admit or refuse a request, then dispatch it to the engine
    models.py     ModelSlot: a served model, its engine's lifecycle, text <-> token ids
    registry.py   ModelRegistry: the served models by name, loads on demand, unloads
    admission.py  AdmissionController: tickets, the bounded priority queue, slot accounting
    policy.py     the admission rules: state in, a small decision out (no torch)
    signals.py    NVML GPU utilization and memory, RSS, the engine's drain rate
    ticket.py     a request's place at the door, and the two ways the door says no
    metrics.py    what only the scheduler knows, for /metrics
    config.py     SchedulerConfig
"""
