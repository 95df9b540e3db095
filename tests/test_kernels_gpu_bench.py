"""The GPU benchmark, as far as a CPU can check it: every config it will try
lowers through Triton, its chains type-check, its arithmetic is right, its
plumbing runs on a tiny case, and it refuses to run without a GPU."""

import json
import os
import subprocess
import sys

import jax
from absl.testing import absltest, parameterized

from jaxroof.errors import InputError
from kernels import _backend
from jaxroof.measure import kernel_benchmark as gpu_bench
from jaxroof.report import kernels as kernels_report
from kernels import decode_attention as da
from kernels import linear
from kernels import testing

_CUDA = _backend.resolve_target("cuda")


def _abstract(case):
  args = jax.eval_shape(lambda: case.op.example_args(case.problem, jax.random.key(0)))
  return tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args)


class BenchConfigsTest(parameterized.TestCase):

  @parameterized.named_parameters(
      (case.name, case) for case in gpu_bench.CASES + gpu_bench.QUICK_CASES)
  def test_every_config_tried_lowers_for_cuda(self, case):
    abstract = _abstract(case)
    tried = case.op.candidates(case.problem, "triton")[:12]
    valid = [c for c in tried if case.op.why_invalid(c, case.problem, "triton") is None]
    self.assertNotEmpty(valid)
    self.assertIn(case.op.heuristic(case.problem, "triton"), valid)
    for config in valid:
      with self.subTest(config=config):
        _backend.cross_lower(
            lambda *a, c=config: case.op.kernel(*a, config=c, target=_CUDA),
            *abstract,
            platform="cuda",
        )

  def test_chains_keep_their_argument_types(self):
    for case in gpu_bench.CASES:
      abstract = _abstract(case)
      config = case.op.heuristic(case.problem, "triton")
      fns = {
          "pallas": lambda *a, c=config, op=case.op: op.kernel(*a, config=c, target=_CUDA),
          **gpu_bench.xla_variants(case)
      }
      for name, fn in fns.items():
        if name == "cudnn_dot_product_attention":
          continue  # Needs cuDNN to trace; same wrapper as the xla one.
        with self.subTest(case=case.name, fn=name):
          fed = jax.eval_shape(lambda *a, f=fn, op=case.op: op.chain_feed(a, f(*a)), *abstract)
          self.assertEqual(
              [(a.shape, a.dtype) for a in fed],
              [(a.shape, a.dtype) for a in abstract],
          )


class BenchArithmeticTest(absltest.TestCase):

  def test_analytic_traffic_and_flops(self):
    attention = gpu_bench.analytic(gpu_bench.attention_case(32, 32, 8, 8192, 128))
    self.assertEqual(attention["kv_bytes"], 2 * 32 * 8192 * 8 * 128 * 2)
    self.assertGreaterEqual(attention["kv_bytes"], 1e9)  # The target's size.
    self.assertEqual(attention["flops"], 4 * 32 * 32 * 8192 * 128)
    lin = gpu_bench.analytic(gpu_bench.linear_case(16, 8192, 28672))
    self.assertEqual(lin["weight_bytes"], 8192 * 28672 * 2)
    self.assertEqual(lin["flops"], 2 * 16 * 8192 * 28672)
    self.assertEqual(lin["bytes"], (8192 * 28672 + 16 * 8192 + 16 * 28672) * 2)

  def test_attention_bytes_and_ragged_lengths(self):
    b, h, kv, t, d = 4, 32, 8, 1024, 128
    q_and_out = 2 * b * h * d * 2
    for case in (gpu_bench.attention_case(b, h, kv, t, d), gpu_bench.paged_case(b, h, kv, t, d,
                                                                                64)):
      with self.subTest(case=case.name):
        full = gpu_bench.analytic(case)
        self.assertEqual(full["bytes"], 2 * b * t * kv * d * 2 + q_and_out)
        # Ragged: K/V and FLOPs follow the total length, q and out the batch.
        lengths = [1, 1024, 7, 300]
        ragged = gpu_bench.analytic(case, lengths)
        self.assertEqual(ragged["kv_bytes"], 2 * 1332 * kv * d * 2)
        self.assertEqual(ragged["bytes"], 2 * 1332 * kv * d * 2 + q_and_out)
        self.assertEqual(ragged["flops"], 4 * h * 1332 * d)
        with self.assertRaisesRegex(InputError, "give 4 lengths"):
          gpu_bench.analytic(case, [1, 1025, 7, 300])
    with self.assertRaisesRegex(InputError, "linear"):
      gpu_bench.analytic(gpu_bench.linear_case(16, 64, 64), [1])

  def test_dot_product_attention_wrapper_is_decode_attention(self):
    problem = da.DecodeProblem(batch=3, heads=8, kv_heads=2, max_len=32, head_dim=16,
                               dtype="float32")
    seed = testing.fresh_seed()
    q, k, v, _ = da.example_args(problem, jax.random.key(seed))
    lengths = testing.ragged_lengths(seed, 3, 32)
    testing.assert_close(
        gpu_bench.dot_product_attention("xla")(q, k, v, lengths),
        da.reference(q, k, v, lengths),
        rtol=1e-5,
        atol=1e-5,
        what=f"seed={seed}",
    )


class ReportSectionTest(absltest.TestCase):

  def test_without_results_it_says_how_to_get_them(self):
    root = self.create_tempdir().full_path
    text = kernels_report.report_section("unused", root=root)
    self.assertIn("No GPU benchmark", text)
    self.assertIn("experiments/gpu_bench.sh", text)

  def test_latest_summary_becomes_a_table(self):
    root = self.create_tempdir().full_path
    pallas = {
        "median_s": 250e-6, "bytes_per_s": 4.3e12, "flop_per_s": 4.3e12,
        "fraction_of_copy_bandwidth": 0.93, "fraction_of_matmul_rate": 0.006
    }
    summary = {
        "date": "2030-01-02T00:00:00+00:00",
        "device_kind": "NVIDIA H200",
        "jax_version": "0.11.0",
        "timing": "chained",
        "ceilings": {"copy": {"bytes_per_s": 4.6e12}, "matmul": {"flop_per_s": 7.5e14}},
        "cases": {
            "decode_attention_x": {
                "pallas": pallas, "xla_best_median_s": 300e-6,
                "targets": {"not_slower_than_xla": {"pass": True}, "copy_bw>=0.8": {"pass": False}}
            }
        },
        "skipped": ["linear_y"],
        "errors": {},
    }
    old = dict(summary, date="2029-01-01T00:00:00+00:00", cases={})
    for name, data in (("new", summary), ("old", old)):
      os.makedirs(os.path.join(root, name))
      with open(os.path.join(root, name, "summary.json"), "w") as f:
        json.dump(data, f)
    text = kernels_report.report_section("unused", root=root)
    self.assertIn("NVIDIA H200", text)
    self.assertIn("| decode_attention_x | 250.0 | 4.30 |", text)
    self.assertIn("copy_bw>=0.8: **FAIL**", text)
    self.assertIn("Not measured: linear_y", text)


class BenchPlumbingTest(absltest.TestCase):

  def test_run_case_records_on_tiny_cases(self):
    # Interpreted kernels on a CPU: the times mean nothing, the records'
    # structure is what is checked.
    ceilings = {"copy": {"bytes_per_s": 1e12}, "matmul": {"flop_per_s": 1e14}}
    out_dir = self.create_tempdir().full_path
    lin = gpu_bench.run_case(
        gpu_bench.Case(name="tiny_linear", op=linear.TUNABLE,
                       problem=linear.LinearProblem(m=16, k=64, n=32, dtype="float32")),
        ceilings,
        out_dir,
        repeats=3,
        max_candidates=2,
        tune_budget_s=5.0,
    )
    self.assertFalse(lin["tuning"]["tuned"])
    self.assertEqual(lin["backend"], "pallas-interpret")
    pallas = lin["pallas"]
    self.assertAlmostEqual(pallas["fraction_of_copy_bandwidth"], pallas["bytes_per_s"] / 1e12)
    self.assertIn("linear_m<=16_fraction_of_copy_bw>=0.8", lin["targets"])
    self.assertIn("median_s", lin["xla"]["xla_reference"])
    attention = gpu_bench.run_case(
        gpu_bench.Case(
            name="tiny_attention", op=da.TUNABLE,
            problem=da.DecodeProblem(batch=2, heads=4, kv_heads=2, max_len=64, head_dim=16,
                                     dtype="float32")),
        ceilings,
        out_dir,
        repeats=3,
        max_candidates=2,
        tune_budget_s=5.0,
    )
    self.assertEqual(set(attention["xla"]),
                     {"xla_reference", "xla_dot_product_attention", "cudnn_dot_product_attention"})
    self.assertIn("median_s", attention["xla"]["xla_dot_product_attention"])
    json.dumps([lin, attention])  # Serialisable as they are.

  def test_refuses_without_a_gpu(self):
    out_dir = self.create_tempdir().full_path
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root, "PYTHON": sys.executable}
    for command in (
        [sys.executable, "-m", "experiments.gpu_bench", f"--out_dir={out_dir}"],
        ["bash", "experiments/gpu_bench.sh", out_dir],
    ):
      proc = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=120)
      self.assertEqual(proc.returncode, 1, proc.stderr)
      self.assertIn("NO GPU", proc.stderr)
    self.assertEmpty(os.listdir(out_dir))


if __name__ == "__main__":
  absltest.main()
