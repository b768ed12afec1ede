"""DeviceGate (engine/device_gate.py): one holder at a time, equal device time for busy
parties whatever their steps cost, no credit for time spent idle. Real threads; a turn's
cost is a sleep (it lets go of the GIL, as a torch step does)."""
from __future__ import annotations

import threading
import time

import pytest

from engine.device_gate import DeviceGate, GateParty

BOOKING_S = 0.0003  # each party's work between two turns (an engine booking its outputs)


class _Contention:
    """Threads that take turns at one gate until `stop`, each turn costing its party's
    seconds; counts how many held the gate at once."""

    def __init__(self, gate: DeviceGate):
        self.gate = gate
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.inside = self.most_inside = 0
        self.threads: list[threading.Thread] = []

    def start(self, cost_s: float) -> GateParty:
        party = self.gate.party()
        thread = threading.Thread(target=self._run, args=(party, cost_s), daemon=True)
        self.threads.append(thread)
        thread.start()
        return party

    def _run(self, party: GateParty, cost_s: float) -> None:
        while not self.stop.is_set():
            with party.turn():
                with self.lock:
                    self.inside += 1
                    self.most_inside = max(self.most_inside, self.inside)
                time.sleep(cost_s)
                with self.lock:
                    self.inside -= 1
            time.sleep(BOOKING_S)
        party.idle()

    def finish(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(5)


def _shares(parties: list[GateParty], before: list[float]) -> list[float]:
    used = [p.device_s - b for p, b in zip(parties, before)]
    return [u / sum(used) for u in used]


@pytest.mark.parametrize("costs_ms", [(1, 10), (1, 3, 9)])
def test_busy_parties_get_equal_device_time_one_holder_at_a_time(costs_ms):
    run = _Contention(DeviceGate())
    parties = [run.start(ms / 1000) for ms in costs_ms]
    time.sleep(1.0)
    run.finish()
    shares = _shares(parties, [0.0] * len(parties))
    turns = [p.turns for p in parties]
    print(f"costs {costs_ms} ms: device shares {[round(s, 2) for s in shares]}, turns {turns}")
    assert run.most_inside == 1
    fair = 1 / len(parties)
    assert all(0.6 * fair < s < 1.4 * fair for s in shares), shares
    assert turns[0] >= 2 * turns[-1]  # the cheap party takes many turns per costly one


def test_without_the_reservation_the_costly_party_takes_most_of_the_device():
    """The contrast that shows what holding the device for the party next in line buys:
    with no reservation the two can only alternate, and 10x costlier steps take ~10/11."""
    run = _Contention(DeviceGate(reserve_s=0.0))
    cheap, costly = run.start(0.001), run.start(0.010)
    time.sleep(0.6)
    run.finish()
    print(f"no reservation: device shares {_shares([cheap, costly], [0.0, 0.0])}")
    assert _shares([cheap, costly], [0.0, 0.0])[1] > 0.75


def test_a_party_back_from_idle_starts_level_with_the_busy_one():
    """B runs alone for a while; A, never run, then joins: they split the device from
    there on, A does not get B's time alone back."""
    run = _Contention(DeviceGate())
    b = run.start(0.002)
    time.sleep(0.4)
    a = run.start(0.002)
    time.sleep(0.1)  # A's first turns
    before = [a.device_s, b.device_s]
    time.sleep(0.5)
    run.finish()
    shares = _shares([a, b], before)
    print(f"after A joined: device shares A {shares[0]:.2f}, B {shares[1]:.2f}")
    assert 0.3 < shares[0] < 0.7


def test_alone_a_party_never_waits_and_a_vanished_party_costs_one_reservation():
    gate = DeviceGate(reserve_s=0.05)
    a, gone = gate.party(), gate.party()
    with gone.turn():  # then its engine dies without saying it is idle
        pass
    started = time.perf_counter()
    for _ in range(200):
        with a.turn():
            pass
    assert time.perf_counter() - started < 0.05 + 0.1  # one reservation, then not again
    assert a.turns == 200 and a.device_s >= 0 and a.wait_s <= 0.05 + 0.02
    solo = DeviceGate().party()
    for _ in range(100):
        with solo.turn():
            pass
    assert solo.wait_s == 0.0 and solo.turns == 100  # never found the device taken


def test_a_step_that_raises_still_ends_its_turn():
    gate = DeviceGate()
    a, b = gate.party(), gate.party()
    with pytest.raises(RuntimeError), a.turn():
        raise RuntimeError("step failed")
    a.idle()
    done = threading.Event()
    threading.Thread(target=lambda: (b.turn().__enter__(), done.set()), daemon=True).start()
    assert done.wait(1.0), "the gate stayed held after a failed step"
    assert a.turns == 1


def test_the_gate_refuses_a_negative_reservation():
    with pytest.raises(ValueError, match="reserve_s"):
        DeviceGate(reserve_s=-1)
