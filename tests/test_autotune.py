"""The autotuner and its cache, on a fake op that XLA runs on the CPU, and the
chained device timing; real kernels are never tuned when interpreted."""

import dataclasses
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest

from jaxroof.errors import InputError
from jaxroof.timing import Timing
from kernels import _backend
from kernels import autotune
from kernels import device_timing
from kernels import linear


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class _Config:
  mode: str = "fast"


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class _Problem:
  n: int


def _kernel(x, *, config, target):
  del target  # Unused.
  if config.mode == "raise":
    raise ValueError("cannot lower this config")
  return x * (3.0 if config.mode == "wrong" else 2.0)


def _why_invalid(config, problem, rules):
  del problem, rules  # Unused.
  return "does not fit" if config.mode == "invalid" else None


_FAKE = autotune.TunableOp(
    name="fake_op",
    config_type=_Config,
    problem=lambda args: _Problem(n=args[0].shape[0]),
    kernel=_kernel,
    reference=lambda x: x * 2.0,
    candidates=lambda problem, rules: [
        _Config(mode=m) for m in ("slow", "invalid", "raise", "wrong", "fast")
    ],
    why_invalid=_why_invalid,
    heuristic=lambda problem, rules: _Config(mode="slow"),
    tolerance=lambda dtype: (1e-6, 1e-6),
    chain_feed=lambda args, out: (out,),
    example_args=lambda problem, key: (
        jnp.arange(problem.n, dtype=jnp.float32),),
)
# A compiled "CPU kernel": XLA runs the fake op; only tests build this target.
_XLA_CPU = _backend.Target(platform="cpu", interpret=False)
_INTERPRET = _backend.resolve_target("cpu")


def _fake_timer(fn, args, feed):
  """Times by config: "fast" 1 us, anything else 5 us (no clock involved)."""
  del args, feed  # Unused.
  config = fn.__wrapped__.keywords["config"]  # fn: the jitted candidate.
  median = 1e-6 if config.mode == "fast" else 5e-6
  return Timing(median_s=median, min_s=median, max_s=median, p10_s=median,
                p90_s=median, repeats=3, warmup=1, method="fake")


class TuneTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.cache_dir = self.create_tempdir().full_path

  def _tune(self, **kwargs):
    return autotune.tune(_FAKE, _Problem(n=8), target=_XLA_CPU,
                         cache_dir=self.cache_dir, timer=_fake_timer,
                         progress=False, **kwargs)

  def test_records_every_fate_and_picks_the_fastest(self):
    result = self._tune()
    self.assertTrue(result.tuned)
    self.assertEqual(result.config, _Config(mode="fast"))
    fates = {t.config.mode: t.status for t in result.trials}
    self.assertEqual(fates, {"slow": "ok", "invalid": "skipped",
                             "raise": "failed", "wrong": "wrong",
                             "fast": "ok"})
    failed = next(t for t in result.trials if t.status == "failed")
    self.assertIn("cannot lower this config", failed.reason)

  def test_device_kind_slug(self):
    self.assertEqual(_backend.device_kind_slug("NVIDIA H200"), "nvidia_h200")
    self.assertEqual(_backend.device_kind_slug("TPU v5 lite"), "tpu_v5_lite")

  def test_cache_file_is_keyed_and_complete(self):
    self._tune()
    path = autotune.cache_path("fake_op", None, self.cache_dir)
    self.assertEqual(path.parent.name, _backend.device_kind_slug())
    data = json.loads(path.read_text())
    (key, entry), = data["entries"].items()
    self.assertEqual(key, autotune.cache_key(
        (jnp.zeros(8, jnp.float32),), _XLA_CPU))
    for field in ("device_kind", "op", "backend", "jax_version", "args"):
      self.assertIn(field, entry)
    self.assertEqual(entry["jax_version"], jax.__version__)
    self.assertEqual(entry["args"], ["float32[8]"])
    self.assertEqual(entry["best"], {"mode": "fast"})
    self.assertLen(entry["trials"], 5)
    timed = [t for t in entry["trials"] if t["timing"]]
    self.assertLen(timed, 2)
    self.assertEqual({t["timing"]["median_s"] for t in timed}, {1e-6, 5e-6})
    self.assertEqual([f for f in os.listdir(path.parent)], ["fake_op.json"])

  def test_time_budget_skips_the_rest_and_falls_back(self):
    result = self._tune(time_budget_s=0.0)
    self.assertFalse(result.tuned)
    self.assertEqual(result.config, _Config(mode="slow"))  # The heuristic.
    self.assertIn("time budget", result.trials[0].reason)

  def test_lookup_order_cache_then_tuning_then_heuristic(self):
    args = (jnp.zeros(8, jnp.float32),)
    choose = lambda: autotune.choose_config(  # noqa: E731
        _FAKE, args, _XLA_CPU, cache_dir=self.cache_dir)
    self.assertEqual(choose(), _Config(mode="slow"))  # Miss: heuristic.
    with autotune.on_miss("error"):
      with self.assertRaisesRegex(InputError, "no cached fake_op config"):
        choose()
    self._tune()
    self.assertEqual(choose(), _Config(mode="fast"))  # Hit.
    # An interpreted target never reads the cache nor tunes.
    self.assertEqual(
        autotune.choose_config(_FAKE, args, _INTERPRET,
                               cache_dir=self.cache_dir),
        _Config(mode="slow"),
    )

  def test_on_miss_autotune_tunes_and_stale_entries_are_ignored(self):
    args = (jnp.zeros(8, jnp.float32),)
    fake = dataclasses.replace(_FAKE, candidates=lambda p, r: [
        _Config(mode="fast")])
    with autotune.on_miss("autotune"):
      self.assertEqual(
          autotune.choose_config(fake, args, _XLA_CPU,
                                 cache_dir=self.cache_dir),
          _Config(mode="fast"))
    path = autotune.cache_path("fake_op", None, self.cache_dir)
    data = json.loads(path.read_text())
    for entry in data["entries"].values():
      entry["best"] = {"block_q": 64}  # Written by an older config type.
    path.write_text(json.dumps(data))
    self.assertIsNone(autotune.cached_config(_FAKE, args, _XLA_CPU,
                                             cache_dir=self.cache_dir))

  def test_interpreted_kernels_are_never_tuned(self):
    problem = linear.LinearProblem(m=4, k=64, n=32, dtype="float32")
    result = autotune.tune(linear.TUNABLE, problem, target=_INTERPRET,
                           cache_dir=self.cache_dir, progress=False)
    self.assertFalse(result.tuned)
    self.assertIn("never tuned", result.message)
    self.assertEqual(result.config, linear.heuristic(problem, "interpret"))
    self.assertEmpty(os.listdir(self.cache_dir))

  def test_experiment_says_so_on_a_cpu(self):
    out = os.path.join(self.cache_dir, "result.json")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.autotune", "--op=linear", "--m=4",
         "--k=64", "--n=32", "--dtype=float32", f"--json_out={out}",
         f"--cache_dir={self.cache_dir}"],
        cwd=root, env={**os.environ, "PYTHONPATH": root},
        capture_output=True, text=True, timeout=120,
    )
    self.assertEqual(proc.returncode, 0, proc.stderr)
    self.assertIn("never tuned", proc.stdout)
    data = json.loads(open(out).read())
    self.assertFalse(data["tuned"])
    self.assertEqual(data["config"], dataclasses.asdict(
        linear.heuristic(linear.LinearProblem(m=4, k=64, n=32,
                                              dtype="float32"), "interpret")))


class DeviceTimingTest(absltest.TestCase):

  def test_poke_writes_one_element_from_the_output(self):
    k = jnp.zeros((2, 3, 4), jnp.bfloat16)
    poked = device_timing.poke(k, jnp.full((5, 6), 2.5, jnp.float32))
    self.assertEqual(float(poked[0, 0, 0]), 2.5)
    self.assertEqual(float(jnp.abs(poked).sum()), 2.5)
    self.assertEqual(poked.dtype, k.dtype)

  def test_chain_runs_dependent_calls(self):
    run = device_timing.chain(lambda x: x + 1.0, lambda args, out: (out,), 7)
    (last,) = jax.jit(run)(jnp.zeros(()))
    self.assertEqual(float(last), 7.0)

  def test_times_are_per_call_and_labelled(self):
    ticks = iter(np.arange(0.0, 100.0, 0.5))  # Every chain "takes" 0.5 s.
    timing = device_timing.time_chained(
        lambda x: x * 2.0, (jnp.ones(4),), feed=lambda a, o: (o,), inner=5,
        warmup=1, repeats=3, clock=lambda: next(ticks),
    )
    self.assertAlmostEqual(timing.median_s, 0.1)
    self.assertAlmostEqual(timing.max_s, 0.1)
    self.assertEqual(timing.repeats, 3)
    self.assertIn("chain of 5 dependent calls", timing.method)

  def test_perturb_first_depends_on_the_output_but_keeps_values(self):
    x = jnp.arange(6.0).reshape(2, 3)
    same, w = device_timing.perturb_first((x, "w"), jnp.ones((2, 5)))
    np.testing.assert_array_equal(same, x)
    self.assertEqual(w, "w")
    bumped, _ = device_timing.perturb_first((x, "w"),
                                            jnp.full((2, 5), jnp.nan))
    self.assertEqual(float(bumped[0, 0]), 1.0)


if __name__ == "__main__":
  absltest.main()
