"""The largest batch that fits, searched with few compiles (`memory_fit.largest_fitting`), against
memory models whose answer is known by hand."""

import pytest

from cdeit_jax.train import memory_fit

GIB = 2**30


def _measured(peak, budget):
  """A `measure` from a memory model `peak(b)` (bytes), recording what was asked."""
  asked = []

  def measure(b):
    asked.append(b)
    return peak(b) <= budget, peak(b)

  return measure, asked


@pytest.mark.parametrize(
  "fixed, per_example, start",
  [(1.61 * GIB, 0.605 * GIB, 32), (0.2 * GIB, 0.02 * GIB, 64), (3 * GIB, 2.5 * GIB, 4)],
)
def test_a_linear_memory_is_found_exactly_in_a_few_compiles(fixed, per_example, start):
  """peak = fixed + per_example * b: the answer is floor((budget - fixed) / per_example)."""
  budget = int(59.33 * GIB)
  measure, asked = _measured(lambda b: int(fixed + per_example * b), budget)
  best, tried = memory_fit.largest_fitting(measure, start, budget)
  assert best == int((budget - fixed) // per_example)
  assert tried[best][0] and not tried[best + 1][0]
  assert len(asked) == len(set(asked)) <= 5  # start, twice it, the prediction and beside it


def test_a_memory_that_grows_faster_than_linear_still_ends_at_the_boundary():
  """peak = b^2 MiB within 10 GiB (10,240 MiB): 101^2 = 10,201 fits, 102^2 = 10,404 does not;
  the linear prediction from 16 and 32 (224) overshoots, the measurements decide."""
  budget = 10 * 1024 * 2**20
  measure, asked = _measured(lambda b: b * b * 2**20, budget)
  best, tried = memory_fit.largest_fitting(measure, 16, budget)
  assert best == 101 and tried[101][0] and not tried[102][0]
  assert len(asked) <= 12


def test_a_start_that_does_not_fit_searches_down_and_nothing_fitting_gives_zero():
  budget = 100
  measure, _ = _measured(lambda b: 30 * b, budget)  # 3 fit
  assert memory_fit.largest_fitting(measure, 32, budget)[0] == 3
  measure, _ = _measured(lambda b: 1000 * b, budget)
  best, tried = memory_fit.largest_fitting(measure, 8, budget)
  assert best == 0 and not tried[1][0]


def test_the_ceiling_is_kept():
  measure, asked = _measured(lambda b: b, 10**9)
  best, _ = memory_fit.largest_fitting(measure, 8, 10**9, most=100)
  assert best == 100 and max(asked) == 100
