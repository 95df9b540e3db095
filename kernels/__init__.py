"""Pallas kernels for the operations the roofline model reasons about.

One module per op (`decode_attention`, `paged_attention`, `linear`), each with
a jnp `reference`, a Pallas kernel taking a frozen config, a heuristic and a
config space; each `pallas_call` carries a `pl.CostEstimate` from the roofline's sympy
counts (`cost_estimate`); `autotune` picks and caches configs
(`jaxroof.measure.kernel_benchmark` times them on a GPU against XLA and the device's
measured ceilings). Submodules share their ops' names, so import them as modules:
`from kernels import linear`.
"""
