"""The autotuner and its cache, on a fake op that XLA runs on the CPU, and the
chained device timing; real kernels are never tuned when interpreted."""

import dataclasses
import json
import os
import pathlib
import subprocess
import sys
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags
from absl.testing import absltest

from jaxroof.errors import InputError
from jaxroof.timing import Timing
from kernels import _backend
from kernels import autotune
from kernels import decode_attention as da
from kernels import device_timing
from kernels import linear
from kernels import paged_attention as pa
from kernels import testing


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
    candidates=lambda problem, rules:
    [_Config(mode=m) for m in ("slow", "invalid", "raise", "wrong", "fast")],
    why_invalid=_why_invalid,
    heuristic=lambda problem, rules: _Config(mode="slow"),
    tolerance=lambda dtype: (1e-6, 1e-6),
    chain_feed=lambda args, out: (out,),
    example_args=lambda problem, key: (jnp.arange(problem.n, dtype=jnp.float32),),
)
# A compiled "CPU kernel": XLA runs the fake op; only tests build this target.
_XLA_CPU = _backend.Target(platform="cpu", interpret=False)
_INTERPRET = _backend.resolve_target("cpu")
_CUDA = _backend.resolve_target("cuda")


def _timing(median):
  return Timing(median_s=median, min_s=median, max_s=median, p10_s=median, p90_s=median, repeats=3,
                warmup=1, method="fake")


def _fake_timer(fn, args, feed):
  """Times by config: "fast" 1 us, anything else 5 us (no clock involved)."""
  del args, feed  # Unused.
  config = fn.__wrapped__.keywords["config"]  # fn: the jitted candidate.
  return _timing(1e-6 if config.mode == "fast" else 5e-6)


class TuneTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.cache_dir = self.create_tempdir().full_path

  def _tune(self, **kwargs):
    return autotune.tune(_FAKE, _Problem(n=8), target=_XLA_CPU, cache_dir=self.cache_dir,
                         timer=_fake_timer, progress=False, **kwargs)

  def test_records_every_fate_and_picks_the_fastest(self):
    result = self._tune()
    self.assertTrue(result.tuned)
    self.assertEqual(result.config, _Config(mode="fast"))
    fates = {t.config.mode: t.status for t in result.trials}
    self.assertEqual(
        fates,
        {"slow": "ok", "invalid": "skipped", "raise": "failed", "wrong": "wrong", "fast": "ok"})
    failed = next(t for t in result.trials if t.status == "failed")
    self.assertIn("cannot lower this config", failed.reason)

  def test_device_kind_slug(self):
    self.assertEqual(_backend.device_kind_slug("NVIDIA H200"), "nvidia_h200")
    self.assertEqual(_backend.device_kind_slug("TPU v5 lite"), "tpu_v5_lite")

  def test_largest_pow2_divisor(self):
    self.assertEqual(_backend.largest_pow2_divisor(8192, 128, 16), 128)
    self.assertEqual(_backend.largest_pow2_divisor(96, 128, 16), 32)
    self.assertIsNone(_backend.largest_pow2_divisor(100, 128, 16))

  def test_cache_file_is_keyed_and_complete(self):
    self._tune()
    path = autotune.cache_path("fake_op", None, self.cache_dir)
    self.assertEqual(path.parent.name, _backend.device_kind_slug())
    data = json.loads(path.read_text())
    (key, entry), = data["entries"].items()
    self.assertEqual(key, autotune.cache_key(_FAKE, _Problem(n=8), _XLA_CPU))
    self.assertEqual(key, f"pallas-triton|cpu|jax-{jax.__version__}|n=8")
    self.assertEqual(entry["key"], key)
    for field in ("device_kind", "op", "backend", "jax_version", "args", "message", "checked_on",
                  "timed_on"):
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
        autotune.choose_config(_FAKE, args, _INTERPRET, cache_dir=self.cache_dir),
        _Config(mode="slow"),
    )

  def test_on_miss_autotune_tunes_and_stale_entries_are_ignored(self):
    args = (jnp.zeros(8, jnp.float32),)
    fake = dataclasses.replace(_FAKE, candidates=lambda p, r: [_Config(mode="fast")])
    with autotune.on_miss("autotune"):
      self.assertEqual(autotune.choose_config(fake, args, _XLA_CPU, cache_dir=self.cache_dir),
                       _Config(mode="fast"))
    path = autotune.cache_path("fake_op", None, self.cache_dir)
    data = json.loads(path.read_text())
    for entry in data["entries"].values():
      entry["best"] = {"block_q": 64}  # Written by an older config type.
    path.write_text(json.dumps(data))
    self.assertIsNone(autotune.cached_config(_FAKE, args, _XLA_CPU, cache_dir=self.cache_dir))

  def test_a_failed_tuning_is_cached_and_not_repeated(self):
    args = (jnp.zeros(8, jnp.float32),)
    broken = dataclasses.replace(
        _FAKE, candidates=lambda p, r: [_Config(mode="wrong"),
                                        _Config(mode="raise")])
    result = autotune.tune(broken, _Problem(n=8), target=_XLA_CPU, cache_dir=self.cache_dir,
                           timer=_fake_timer, progress=False)
    self.assertFalse(result.tuned)
    self.assertIsNone(result.entry["best"])
    self.assertIn("heuristic", result.entry["message"])
    with mock.patch.object(autotune, "tune", side_effect=AssertionError("tuned again")):
      with autotune.on_miss("autotune"), self.assertLogs("absl", "WARNING") as logs:
        for _ in range(2):
          self.assertEqual(autotune.choose_config(broken, args, _XLA_CPU, cache_dir=self.cache_dir),
                           _Config(mode="slow"))  # The heuristic, without tuning.
    self.assertLen(logs.output, 1)  # Said once.
    self.assertIn("found no config that runs correctly", logs.output[0])
    with autotune.on_miss("error"):  # Not a miss either.
      self.assertEqual(autotune.choose_config(broken, args, _XLA_CPU, cache_dir=self.cache_dir),
                       _Config(mode="slow"))

  def test_outputs_are_checked_on_ragged_arguments_too(self):
    # "abs" is right on the timed arguments (all >= 0) but not on the check
    # arguments, as a kernel that breaks ragged tails is right on full ones.
    def kernel(x, *, config, target):
      del target  # Unused.
      return (jnp.abs(x) if config.mode == "abs" else x) * 2.0

    op = dataclasses.replace(
        _FAKE, kernel=kernel,
        candidates=lambda p, r: [_Config(mode="abs"), _Config(mode="fast")],
        check_args=lambda args, key: (-args[0],), check_note="negative values")
    result = autotune.tune(op, _Problem(n=8), target=_XLA_CPU, cache_dir=self.cache_dir,
                           timer=_fake_timer, progress=False)
    fates = {t.config.mode: t.status for t in result.trials}
    self.assertEqual(fates, {"abs": "wrong", "fast": "ok"})
    self.assertEqual(result.entry["checked_on"], "negative values")
    self.assertEqual(result.entry["timed_on"], "example_args")
    unchecked = dataclasses.replace(op, check_args=None)
    result = autotune.tune(unchecked, _Problem(n=8), target=_XLA_CPU, save=False, timer=_fake_timer,
                           progress=False)
    self.assertEqual({t.status for t in result.trials}, {"ok"})

  def test_attention_is_checked_on_ragged_lengths(self):
    # A kernel that ignores the lengths is right when all are full: the
    # tuner must reject it on ragged lengths (1 and max_len included).
    def ignores_lengths(q, k, v, lengths, *, config, target):
      del config, target  # Unused.
      return da.reference(q, k, v, jnp.full_like(lengths, k.shape[1]))

    def interpreted(*args, config, target):
      del target  # Unused: the real kernel, interpreted.
      return da._decode_call(*args, config=config, target=_INTERPRET)

    problem = da.DecodeProblem(batch=3, heads=4, kv_heads=2, max_len=64, head_dim=16,
                               dtype="float32")
    timer = lambda fn, args, feed: _timing(1e-6)  # noqa: E731
    for kernel, status in ((ignores_lengths, "wrong"), (interpreted, "ok")):
      op = dataclasses.replace(da.TUNABLE, kernel=kernel)
      result = autotune.tune(op, problem, target=_XLA_CPU, save=False, timer=timer, progress=False,
                             max_candidates=1)
      with self.subTest(kernel=kernel.__name__):
        self.assertEqual([t.status for t in result.trials], [status])
    self.assertIn("ragged lengths", result.entry["checked_on"])
    self.assertIn("every length max_len", result.entry["timed_on"])
    key = jax.random.key(testing.fresh_seed())
    paged = pa.PagedProblem(batch=5, heads=4, kv_heads=2, head_dim=16, num_pages=20, page_size=16,
                            pages_per_seq=4, dtype="float32")
    for op, args in ((da.TUNABLE, da.example_args(problem,
                                                  key)), (pa.TUNABLE, pa.example_args(paged, key))):
      lengths = op.check_args(args, key)[-1]  # max_len 64 for both.
      with self.subTest(op=op.name):
        self.assertEqual((int(lengths[0]), int(lengths[-1])), (1, 64))
        self.assertTrue(((lengths >= 1) & (lengths <= 64)).all())

  def test_interpreted_kernels_are_never_tuned(self):
    problem = linear.LinearProblem(m=4, k=64, n=32, dtype="float32")
    result = autotune.tune(linear.TUNABLE, problem, target=_INTERPRET, cache_dir=self.cache_dir,
                           progress=False)
    self.assertFalse(result.tuned)
    self.assertIn("never tuned", result.message)
    self.assertEqual(result.config, linear.heuristic(problem, "interpret"))
    self.assertEmpty(os.listdir(self.cache_dir))

  def test_experiment_says_so_on_a_cpu(self):
    out = os.path.join(self.cache_dir, "result.json")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run(
        [
            sys.executable, "-m", "experiments.autotune", "--op=linear", "--m=4", "--k=64",
            "--n=32", "--dtype=float32", f"--json_out={out}", f"--cache_dir={self.cache_dir}"
        ],
        cwd=root,
        env={**os.environ, "PYTHONPATH": root},
        capture_output=True,
        text=True,
        timeout=120,
    )
    self.assertEqual(proc.returncode, 0, proc.stderr)
    self.assertIn("never tuned", proc.stdout)
    data = json.loads(open(out).read())
    self.assertFalse(data["tuned"])
    self.assertEqual(
        data["config"],
        dataclasses.asdict(
            linear.heuristic(linear.LinearProblem(m=4, k=64, n=32, dtype="float32"), "interpret")))

  def test_experiment_page_size_must_divide_max_len(self):
    from experiments import autotune as experiment  # Defines its flags.
    values = {"op": "paged_decode_attention", "max_len": 100, "page_size": 64}
    self.assertFalse(experiment._page_size_divides(values))
    self.assertTrue(experiment._page_size_divides({**values, "max_len": 128}))
    self.assertTrue(experiment._page_size_divides({**values, "op": "linear"}))
    self.assertIn("must divide --max_len", flags.FLAGS[experiment._PAGE_SIZE.name].help)


class CacheKeyTest(absltest.TestCase):

  def test_decode_key_is_readable_and_bucketed(self):
    problem = da.DecodeProblem(batch=20, heads=32, kv_heads=8, max_len=5000, head_dim=128,
                               dtype="bfloat16")
    self.assertEqual(
        autotune.cache_key(da.TUNABLE, problem, _CUDA),
        f"pallas-triton|cuda|jax-{jax.__version__}|dtype=bfloat16 heads=32 "
        "kv_heads=8 head_dim=128 batch<=32 max_len<=8192",
    )

  def test_nearby_sizes_and_pool_sizes_share_a_key(self):
    key = lambda op, p: autotune.cache_key(op, p, _CUDA)  # noqa: E731
    decode = da.DecodeProblem(batch=32, heads=32, kv_heads=8, max_len=8192, head_dim=128,
                              dtype="bfloat16")
    paged = pa.PagedProblem(batch=32, heads=32, kv_heads=8, head_dim=128, num_pages=32 * 128,
                            page_size=64, pages_per_seq=128, dtype="bfloat16")
    lin = linear.LinearProblem(m=16, k=4096, n=4096, dtype="bfloat16")
    same = {
        da.TUNABLE: (decode, [dict(batch=17),
                              dict(max_len=4160),
                              dict(batch=30, max_len=6144)]),
        pa.TUNABLE:
            (paged,
             [dict(num_pages=50_000),
              dict(num_pages=4097),
              dict(batch=24, pages_per_seq=100)]),
        linear.TUNABLE: (lin, [dict(m=9)]),
    }
    different = {
        da.TUNABLE: [
            dict(head_dim=64),
            dict(dtype="float16"),
            dict(kv_heads=4),
            dict(batch=33),
            dict(max_len=8193)
        ],
        pa.TUNABLE: [
            dict(head_dim=64),
            dict(dtype="float32"),
            dict(page_size=32, pages_per_seq=256)
        ],
        linear.TUNABLE: [dict(k=2048), dict(dtype="float32"),
                         dict(m=17)],
    }
    for op, (base, changes) in same.items():
      for change in changes:
        with self.subTest(op=op.name, same=change):
          self.assertEqual(key(op, base), key(op, dataclasses.replace(base, **change)))
      for change in different[op]:
        with self.subTest(op=op.name, different=change):
          self.assertNotEqual(key(op, base), key(op, dataclasses.replace(base, **change)))

  def test_a_paged_tuning_serves_any_pool_size(self):
    cache_dir = self.create_tempdir().full_path
    problem = pa.PagedProblem(batch=2, heads=4, kv_heads=2, head_dim=32, num_pages=16, page_size=16,
                              pages_per_seq=8, dtype="float32")
    config = pa.PagedAttentionConfig(num_splits=4)
    autotune._store(autotune.cache_path(pa.OP_NAME, None, cache_dir),
                    autotune.cache_key(pa.TUNABLE, problem, _XLA_CPU),
                    {"best": dataclasses.asdict(config)}, pa.OP_NAME, "cpu")
    pool = (1000, 16, 2, 32)  # A pool sized by memory, not by the problem.
    args = (jax.ShapeDtypeStruct((2, 4, 32), jnp.float32), jax.ShapeDtypeStruct(pool, jnp.float32),
            jax.ShapeDtypeStruct(pool, jnp.float32), jax.ShapeDtypeStruct(
                (2, 8), jnp.int32), jax.ShapeDtypeStruct((2,), jnp.int32))
    self.assertEqual(autotune.cached_config(pa.TUNABLE, args, _XLA_CPU, cache_dir=cache_dir),
                     config)


class CacheDirTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.package = pathlib.Path(self.create_tempdir("package").full_path)
    self.home = pathlib.Path(self.create_tempdir("home").full_path)
    self.user = self.home / ".cache" / "jaxroof" / "autotune"
    self.enter_context(mock.patch.object(autotune, "PACKAGE_CACHE_DIR", self.package))
    env = {k: v for k, v in os.environ.items() if k != autotune.CACHE_ENV}
    self.enter_context(mock.patch.dict(os.environ, {**env, "HOME": str(self.home)}, clear=True))

  def _read_only_package(self):
    return mock.patch.object(autotune, "_writable", lambda path: path != self.package)

  def test_resolution_order(self):
    self.assertEqual(autotune.write_dir(), self.package)  # Writable.
    self.assertEqual(autotune.read_dirs(), [self.package])
    with self._read_only_package():
      self.assertEqual(autotune.write_dir(), self.user)
      self.assertEqual(autotune.read_dirs(), [self.user, self.package])
      env = self.create_tempdir("env").full_path
      with mock.patch.dict(os.environ, {autotune.CACHE_ENV: env}):
        self.assertEqual(autotune.write_dir(), pathlib.Path(env))
        self.assertEqual(autotune.read_dirs(), [pathlib.Path(env), self.package])
        explicit = self.create_tempdir("explicit").full_path
        self.assertEqual(autotune.write_dir(explicit), pathlib.Path(explicit))
        self.assertEqual(autotune.read_dirs(explicit), [pathlib.Path(explicit)])

  def test_read_only_package_tunes_into_the_user_dir(self):
    with self._read_only_package():
      autotune.tune(_FAKE, _Problem(n=8), target=_XLA_CPU, timer=_fake_timer, progress=False)
    self.assertEqual(os.listdir(self.package), [])
    written = autotune.cache_path("fake_op", None, root=self.user)
    self.assertTrue(written.exists())

  def test_lookups_read_the_write_dir_then_the_shipped_results(self):
    args = (jnp.zeros(8, jnp.float32),)
    key = autotune.cache_key(_FAKE, _Problem(n=8), _XLA_CPU)

    def store(root, best):
      path = autotune.cache_path("fake_op", None, root=root)
      autotune._store(path, key, {"best": best}, "fake_op", "cpu")

    choose = lambda: autotune.choose_config(  # noqa: E731
        _FAKE, args, _XLA_CPU)
    with self._read_only_package():
      store(self.package, {"mode": "wrong"})  # Shipped.
      self.assertEqual(choose(), _Config(mode="wrong"))
      store(self.user, None)  # A failed local tuning: the shipped one wins.
      self.assertEqual(choose(), _Config(mode="wrong"))
      store(self.user, {"mode": "fast"})  # A local winner comes first.
      self.assertEqual(choose(), _Config(mode="fast"))


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
        lambda x: x * 2.0,
        (jnp.ones(4),),
        feed=lambda a, o: (o,),
        inner=5,
        warmup=1,
        repeats=3,
        clock=lambda: next(ticks),
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
    bumped, _ = device_timing.perturb_first((x, "w"), jnp.full((2, 5), jnp.nan))
    self.assertEqual(float(bumped[0, 0]), 1.0)


if __name__ == "__main__":
  absltest.main()
