"""The recorder's clock follows the wall clock but never jumps or goes back."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpuledger.recorder.clock import SLEW, SteadyClock

T0 = 1_700_000_000.0


class Clocks:
    def __init__(self) -> None:
        self.mono, self.wall = 100.0, T0

    def advance(self, seconds: float, drift_ppm: float = 0.0) -> None:
        self.mono += seconds
        self.wall += seconds * (1 + drift_ppm * 1e-6)


def test_without_steps_it_is_the_wall_clock_even_while_ntp_slews() -> None:
    c = Clocks()
    clock = SteadyClock(wall=lambda: c.wall, mono=lambda: c.mono)
    for _ in range(1000):
        c.advance(1.0, drift_ppm=450)  # NTP slewing at almost its maximum rate
        assert clock() == c.wall


def test_a_step_back_is_absorbed_not_shown() -> None:
    c = Clocks()
    clock = SteadyClock(wall=lambda: c.wall, mono=lambda: c.mono)
    c.advance(10)
    before = clock()
    c.wall -= 30  # an administrator sets the clock back 30 s
    c.advance(1)
    after = clock()
    assert after > before and after - before <= 1 + 1e-9  # one second passed, not minus 29
    for _ in range(20_000):  # converges toward the wall clock at SLEW s per s
        c.advance(1)
        clock()
    assert abs(clock() - c.wall) < 1e-6


@given(st.lists(st.tuples(st.floats(0, 10), st.floats(-3600, 3600)), max_size=60))
def test_never_decreases_and_never_runs_faster_than_slew(steps) -> None:
    c = Clocks()
    clock = SteadyClock(wall=lambda: c.wall, mono=lambda: c.mono)
    last = clock()
    for seconds, jump in steps:
        c.advance(seconds)
        c.wall += jump
        now = clock()
        assert last <= now <= last + seconds * (1 + SLEW) + 1e-6  # float resolution at 1.7e9 s
        last = now
