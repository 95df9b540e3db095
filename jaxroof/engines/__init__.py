"""Engines: what is particular to one engine or host, as extensions of the one cost model.

Each engine module registers its own cost terms (`jaxroof.symbolic.terms.register`,
owner its name), contributes their formulas through a `terms.Extension`, and ships
its measured constants under `data/` with their provenance. Importing this package
registers every engine's terms, so names such as `c_llc` resolve.

  xla_cpu    XLA:CPU's GEMM re-packing the weights from two rows (r_pack)
  vllm_cpu   vLLM on a CPU: cache, GEMM passes, elementwise kernels, wake, kernel builds

Serving engines on GPUs, from published measurements (`data/published/`):
  published        the published points, read and checked
  engine_rules     each engine's scheduler defaults and memory-reservation rule, sourced
  engine_profiles  the shipped engine profiles (`data/profiles/`): entries per accelerator
"""

from jaxroof.engines import vllm_cpu
from jaxroof.engines import xla_cpu

ENGINES = (xla_cpu.NAME, vllm_cpu.NAME)

__all__ = ["ENGINES", "vllm_cpu", "xla_cpu"]
