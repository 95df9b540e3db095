"""jaxroof: how fast a transformer serves tokens on an accelerator, and why.

The package is layered by folder; imports point down, never up:

  report/            Markdown sections, tables, plots, the lesson's claims
  serving/ parallel/ whole requests, queueing, the simulator; multi-chip terms
  measure/           timing records, ceilings, op sweeps, calibration, profiles
  toy/  (kernels/)   the JAX toy Transformer; Pallas kernels (top level)
  specs/             models, parameter counts, KV sizing, accelerators, workloads
  symbolic/          sympy: symbols, formulas, solved forms, lambdify (no jax)

Leaf utilities used by every layer: `errors`, `files`, `timing`, `progress`.
This file imports nothing, so `import jaxroof.symbolic` never pulls in jax.
"""

__version__ = "0.1.0"
