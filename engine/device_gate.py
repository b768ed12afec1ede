"""DeviceGate: one forward step on the shared device at a time, in fair turns.

Several models served by one process each step their engine on its own thread. Stepping
at once, they oversubscribe the CPU (each step's intra-op threads over the same cores) or
interleave their kernels on a GPU. Every engine takes a turn at the gate around its
forward step (`with party.turn(): runner.execute(batch)`), and the gate gives the device
to the busy engine that has used the least device time: start-time fair queueing over
the seconds each turn held the gate,

    start  = max(the party's last finish, the start of the turn granted last)
    finish = start + the seconds its turn held the gate

smallest start first (ties: first come). Two busy engines get equal device time whatever
their steps cost: one with 1 ms steps takes ~10 turns for each 10 ms turn of the other,
where taking turns in arrival order would give the costly one 10/11 of the device. An
engine back from idle starts level with the busy ones instead of spending the time it did
not use.

Between two steps an engine books its outputs without the gate. When the engine next in
line is that one (it is busy, just not asking yet), the device is held for it up to
`reserve_s`, so the others cannot take its turn: without this, two engines would only
ever alternate. The time held for it is charged to it like a step. An engine that does
not come back in time (waiting for work, loading KV blocks from disk) loses the
reservation and counts as idle until its next turn.

    engine A (1 ms steps)           gate                       engine B (10 ms steps)
    turn, start 0 ───── granted at once
    end of turn; A's finish 1          ─ B waits (start 0)
    books outputs                      ── B is behind: ───────>  turn, 10 ms
    turn, start 1: waits ...                                    end; B's finish 10
                        <─ A is behind (1 < 10) ──              books outputs; asks
    turn, start 1 ... start 9 (B waits; held for A while A books its outputs)
    turn, start 10 waits               ── tie: B came first ──>  turn ...

A party alone at the gate pays one uncontended lock and a few dict operations per step.
Plain Python (no torch): the scheduler builds the gate and hands a party to each model.
"""
from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

# Seconds the device waits for the engine next in line while it books its outputs.
DEFAULT_RESERVE_S = 0.005


class DeviceGate:
    """Grants turns on one device to its parties (`party()`), one at a time, fairly."""

    def __init__(self, reserve_s: float = DEFAULT_RESERVE_S):
        if not reserve_s >= 0:
            raise ValueError("reserve_s must be at least 0")
        self.reserve_s = reserve_s
        self._cond = threading.Condition()
        self._holder: GateParty | None = None
        self._waiting: dict[GateParty, int] = {}  # party -> its arrival number
        self._arrivals = itertools.count()
        self._busy: set[GateParty] = set()  # stepping: waiting, holding or between turns
        self._reserved: GateParty | None = None
        self._reserved_since = self._reserved_until = 0.0
        self._clock = 0.0  # virtual start of the turn granted last

    def party(self) -> GateParty:
        """A new party (one engine) taking turns at this gate."""
        return GateParty(self)

    # -- under self._cond ------------------------------------------------------------------
    def _acquire(self, party: GateParty) -> bool:
        """Block until `party` holds the gate; whether it had to wait."""
        with self._cond:
            party.start = max(party.finish, self._clock)
            self._busy.add(party)
            self._waiting[party] = next(self._arrivals)
            self._pass_on()
            if self._holder is party:
                return False
            while self._holder is not party:
                self._cond.wait(self._reservation_left())
                self._pass_on()
            return True

    def _release(self, party: GateParty, held_s: float) -> None:
        with self._cond:
            party.finish = party.start + held_s
            self._holder = None
            self._pass_on()

    def _idle(self, party: GateParty) -> None:
        with self._cond:
            self._busy.discard(party)
            if self._reserved is party:
                self._reserved = None
            self._pass_on()

    def _pass_on(self) -> None:
        """Grant the turn if the device is free: to the reserved party once it asks, else
        to the waiting party with the smallest start, unless a busy party between its
        turns would start earlier (then the device is reserved for it)."""
        if self._holder is not None:
            return
        if self._reserved is not None:
            party, now = self._reserved, time.monotonic()
            if party in self._waiting:  # charged for the time the device waited for it
                party.start += now - self._reserved_since
                self._grant(party)
                return
            if now < self._reserved_until:
                return
            party.finish += self.reserve_s
            self._busy.discard(party)  # not back in time: idle until it asks
            self._reserved = None
        if not self._waiting:
            return
        best = min(self._waiting, key=lambda p: (p.start, self._waiting[p]))
        behind = min((p for p in self._busy if p not in self._waiting),
                     key=self._next_start, default=None)
        if behind is not None and self._next_start(behind) < best.start:
            self._reserved, self._reserved_since = behind, time.monotonic()
            self._reserved_until = self._reserved_since + self.reserve_s
            self._cond.notify_all()  # the waiters wait out the reservation
            return
        self._grant(best)

    def _grant(self, party: GateParty) -> None:
        del self._waiting[party]
        self._holder, self._reserved, self._clock = party, None, party.start
        self._cond.notify_all()

    def _next_start(self, party: GateParty) -> float:
        return max(party.finish, self._clock)

    def _reservation_left(self) -> float | None:
        if self._reserved is None:
            return None
        return max(0.0, self._reserved_until - time.monotonic())


class GateParty:
    """One engine's place at a DeviceGate and what it has used there: `turns` taken,
    `wait_s` spent waiting for them, `device_s` held. Used by one thread at a time (the
    engine's step loop); the counters only grow, across the model's loads. `wait_s` counts
    only turns that found the device taken, so it stays 0 for an engine alone."""

    def __init__(self, gate: DeviceGate):
        self.gate = gate
        self.turns = 0
        self.wait_s = 0.0
        self.device_s = 0.0
        self.start = 0.0  # virtual time at the start of its current (or last) turn
        self.finish = 0.0  # virtual time at the end of its last turn

    @contextmanager
    def turn(self) -> Iterator[None]:
        """Hold the device for the body (one forward step); charged for the time held."""
        asked = time.perf_counter()
        waited = self.gate._acquire(self)
        began = time.perf_counter()
        try:
            yield
        finally:
            held = time.perf_counter() - began
            self.gate._release(self, held)
            self.turns += 1
            self.wait_s += began - asked if waited else 0.0
            self.device_s += held

    def idle(self) -> None:
        """The engine has no work: the device is not held for it between turns."""
        self.gate._idle(self)
