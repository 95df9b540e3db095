"""Issue 53 ("Bad input, third pass"), part 3: limits on work (traces and synthetic workloads,
simulate's runs and fleets, plan's simulations, list flags), conflicts refused (raw numbers
beside --model, a length shape without its spread, checked before the search), prices that
overflow, serve_toy with one output token, a profile on a slice of its own device. Each
refusal is one line naming the flag or field, the value and what is allowed; valid edges
are still answered."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from absl import flags

from experiments import _cli
from experiments import _work
from jaxroof.errors import InputError
from jaxroof.measure import profiles
from jaxroof.parallel import planner
from jaxroof.serving import arrivals
from jaxroof.serving import replica
from jaxroof.serving import simulator
from jaxroof.specs.accelerators import load_accelerators
from jaxroof.specs.models import load_model
from jaxroof.symbolic import calibrated
from jaxroof.symbolic import iteration
from jaxroof.symbolic.step_model import StepModel

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = ("--model=llama-3-8b", "--accelerator=h100-sxm", "--context=4096")
PLAN = ("--model=llama-3-8b", "--context=4096", "--token_gap_ms=50", "--ttft_ms=2000",
        "--aggregate_tokens_per_s=1000", "--accelerators=h100-sxm")


def _one_line(error: pytest.ExceptionInfo, *needles: str) -> str:
  message = str(error.value)
  assert "\n" not in message and len(message) < 600, message
  for needle in needles:
    assert needle in message, message
  return message


def _refused(module: str, *args: str, needles: tuple[str, ...] = ()) -> str:
  proc = subprocess.run([sys.executable, "-m", f"experiments.{module}", *args], cwd=ROOT,
                        capture_output=True, text=True, timeout=300)
  said = [line for line in proc.stderr.splitlines() if line.strip()]
  assert proc.returncode == 2 and len(said) == 1, proc.stderr[-2000:]
  assert said[0].startswith("error: ") and "Traceback" not in proc.stderr, said
  for needle in needles:
    assert needle in said[0], said[0]
  return said[0]


def _trace(tmp_path, rows: list[tuple]) -> str:
  path = tmp_path / "trace.csv"
  path.write_text("arrival_s,prompt_tokens,output_tokens\n" +
                  "".join(",".join(str(x) for x in row) + "\n" for row in rows))
  return str(path)


# Traces and synthetic workloads: sizes bounded before anything is allocated.


@pytest.mark.parametrize("row, needles", [
    ((0, "1e30", 10), ["line 2", "prompt_tokens='1e30'", "[1, 10,000,000]"]),
    ((0, 10, 10**9), ["line 2", "output_tokens='1000000000'", "[1, 10,000,000]"]),
    ((2e9, 10, 10), ["line 2", "arrival_s=2e+09", "at most 1e+09 s"]),
])
def test_a_trace_beyond_the_limits_is_one_line_naming_its_line(tmp_path, row, needles):
  with pytest.raises(InputError) as e:
    arrivals.load_trace(_trace(tmp_path, [row]))
  _one_line(e, "trace=", *needles)


def test_a_trace_over_the_row_or_token_total_is_refused(tmp_path, monkeypatch):
  path = _trace(tmp_path, [(0, 10, 20), (1, 10, 20), (2, 10, 20)])
  monkeypatch.setattr(arrivals, "MAX_REQUESTS", 2)
  with pytest.raises(InputError) as e:
    arrivals.load_trace(path)
  _one_line(e, "more than 2 rows")
  monkeypatch.setattr(arrivals, "MAX_REQUESTS", 10)
  monkeypatch.setattr(arrivals, "MAX_OUTPUT_TOKENS", 59)
  with pytest.raises(InputError) as e:
    arrivals.load_trace(path)
  _one_line(e, "output_tokens sum to 60", "at most 59")
  monkeypatch.setattr(arrivals, "MAX_OUTPUT_TOKENS", 60)
  w = arrivals.load_trace(path)  # At the limit: accepted, as read.
  assert list(w.output_tokens) == [20, 20, 20]


def test_the_smallest_trace_is_accepted(tmp_path):
  w = arrivals.load_trace(_trace(tmp_path, [(0, 1, 1)]))
  assert len(w) == 1 and w.prompt_tokens[0] == 1 and w.output_tokens[0] == 1


@pytest.mark.parametrize("change, needles", [
    (dict(num_requests=arrivals.MAX_REQUESTS + 1), ["num_requests=1,000,001", "at most"]),
    (dict(output_tokens=1e9), ["output_tokens=1e+09", "10,000,000"]),
    (dict(num_requests=10**6, output_tokens=1000), ["1e+09 output tokens", "at most 200"]),
    (dict(arrival_rate=1e-9), ["arrival_rate=1e-09", "span"]),
])
def test_a_synthetic_workload_beyond_the_limits_is_refused(change, needles):
  kw = dict(arrival="poisson", num_requests=10, arrival_rate=10.0, seed=0, prompt_tokens=10,
            output_tokens=10)
  with pytest.raises(InputError) as e:
    arrivals.synthetic(**{**kw, **change})
  _one_line(e, *needles)


def test_the_smallest_synthetic_workload_is_drawn():
  w = arrivals.synthetic(arrival="poisson", num_requests=1, arrival_rate=1.0, seed=0,
                         prompt_tokens=1, output_tokens=1)
  assert len(w) == 1 and w.output_tokens[0] == 1


# simulate's work: the estimate is the simulator's own count, within a factor.


@pytest.mark.parametrize("rate, requests", [(0.05, 40), (1000.0, 2000)])
def test_the_iteration_estimate_follows_the_simulator(rate, requests):
  """At a light load each request runs alone (n(o + 1) iterations); at a heavy one they
  share iterations up to max_running. The refusal rests on this estimate."""
  r = replica.from_model(load_model("llama-3-8b"),
                         load_accelerators("h100-sxm")[0], context=4096,
                         step_model=StepModel.bound())
  w = arrivals.synthetic(arrival="poisson", num_requests=requests, arrival_rate=rate, seed=0,
                         prompt_tokens=500, output_tokens=100)
  run = simulator.simulate(w, r, "iteration")
  running = _work._running(r, 500, 100)  # noqa: SLF001
  estimate = _work._iterations(requests, 100, 100, running, rate,
                               _work._step_s(r, 550))  # noqa: SLF001
  assert 0.5 < len(run.step_s) / estimate < 1.5, (len(run.step_s), estimate)


@pytest.mark.parametrize("args, needles", [
    (("--find_max_rate", "--ttft_ms=500", "--num_requests=1000000"),
     ("--num_requests=1,000,000", "40 bisection runs", "allowed --num_requests in [1, ")),
    (("--dp=2147483647",), ("--dp=2,147,483,647", "--dp in [1, 4,096]")),
    (("--num_requests=1000000", "--output_tokens=199"), ("at 10 requests/s", "over 1e+07")),
    (("--params_b=70", "--bandwidth_tbps=1"),
     ("--params_b=70.0, --bandwidth_tbps=1.0", "--model=llama-3-8b")),
])
def test_simulate_refuses_work_for_hours_and_ignored_flags_up_front(args, needles):
  _refused("simulate", *MODEL, *args, needles=needles)


def test_plan_refuses_its_simulations_and_a_shape_without_spread_before_the_search():
  _refused("plan", *PLAN, "--top_k=20", "--sim_seeds=20", "--sim_requests=100000",
           needles=("--top_k=20", "1e+10 simulated output tokens", "allowed --top_k in [0, 1]"))
  _refused("plan", *PLAN, "--prompt_distribution=lognormal",
           needles=("--prompt_spread=0.0", "--prompt_distribution=lognormal", "(0, 100]"))


def test_a_list_flag_holds_at_most_a_thousand_values():
  batches = ",".join(str(b) for b in range(1, _cli.MAX_LIST_ITEMS + 2))
  _refused("compare_accelerators", "--model=llama-3-8b", "--context=4096",
           f"--batch_sizes={batches}", needles=("--batch_sizes", "at most 1,000 whole numbers"))


def test_serve_toy_refuses_one_output_token_up_front():
  _refused("serve_toy", "--output_tokens=1", "--output_spread=0",
           needles=("--output_tokens=1", "no inter-token latency"))


# Smaller: prices, a profile on a slice, a switch nobody gave, the raw twin's expression.


@pytest.mark.parametrize("price", ["1e308", "1e-300"])
def test_a_price_beyond_its_range_is_refused(price):
  with pytest.raises(InputError) as e:
    planner.parse_prices(f"h100-sxm={price}", ["h100-sxm"])
  _one_line(e, price, "[1e-06, 1e+06]")
  assert planner.parse_prices("h100-sxm=1e6", ["h100-sxm"]) == {"h100-sxm": 1e6}


def test_a_profile_applies_to_a_slice_of_its_own_device():
  profile = profiles.load_profile(
      os.path.join(ROOT, "results", "profile_h100-sxm_trtllm_0.9.0.json"))
  assert profiles.check_applies(profile, "8xh100-sxm") == []
  with pytest.raises(InputError, match="what_if"):
    profiles.check_applies(profile, "8xh200")


def test_an_error_never_shows_a_switch_nobody_gave():
  values = flags.FlagValues()
  flags.DEFINE_bool("what_if", False, "A switch.", flag_values=values)
  values(["x"])
  line = _cli.error_line(InputError("give what_if to apply it.", field="what_if"), values)
  assert not line.startswith("--what_if") and line.endswith("(the switch: --what_if)")
  values(["x", "--what_if"])
  assert _cli.error_line(InputError("not so.", field="what_if"), values).startswith("--what_if")


def test_the_raw_iteration_has_no_free_symbol_beyond_its_inputs():
  """serve_toy's twin lambdifies it: a symbol left free (N_xb) was a NameError."""
  for kind in ("bound", "calibrated"):
    free = {str(s) for s in iteration.step_expression(kind).free_symbols}
    assert free <= {str(s) for s in iteration.INPUTS + calibrated.FACTORS}, free


def test_a_fleet_beyond_its_rows_is_refused_naming_the_range():
  with pytest.raises(InputError) as e:
    _work.check_replicas(4000, 100_000)
  _one_line(e, "--dp=4,000", "--dp in [1, 100]")
  _work.check_replicas(100, 100_000)  # At the limit: accepted.
  assert np.isfinite(_work.MAX_FLEET_ROWS)
