"""Box-bounded least squares: Levenberg-Marquardt with a finite-difference Jacobian.

The published fits (`published_fit` on whole-system points, `published_kernels` on kernel
rows) minimise squared log ratios of numpy predictors, each evaluation one vectorised
pass; this is their one search.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def levenberg_marquardt(residuals: Callable[[np.ndarray], np.ndarray], theta: np.ndarray,
                        clip: Callable[[np.ndarray], np.ndarray], *, max_iterations: int,
                        fd_step: float, tolerance: float, max_damping: float, min_damping: float,
                        floor: float) -> np.ndarray:
  """The parameters minimising `residuals(theta) @ residuals(theta)`, from `theta`.

  Each step solves the damped normal equations (damping scaled by the Gram diagonal) and
  keeps the step, `clip`ped into the bounds, only if it lowers the sum of squares; the
  damping falls by 3 after a kept step (not below `min_damping`) and rises by 4 after a
  refused one. It stops when a step gains less than `tolerance` of the sum (at least
  `floor`), no damping below `max_damping` finds a lower sum, or after `max_iterations`.
  """
  r = residuals(theta)
  damping = 1e-3
  for _ in range(max_iterations):
    jac = np.empty((r.size, theta.size))
    for j in range(theta.size):
      step = theta.copy()
      step[j] += fd_step
      jac[:, j] = (residuals(step) - r) / fd_step
    gram, grad = jac.T @ jac, jac.T @ r
    improved = False
    while damping < max_damping:
      delta = np.linalg.solve(gram + damping * np.diag(np.diag(gram) + 1e-12), -grad)
      trial = clip(theta + delta)
      r_trial = residuals(trial)
      if r_trial @ r_trial < r @ r:
        improved = r @ r - r_trial @ r_trial > tolerance * max(r @ r, floor)
        theta, r, damping = trial, r_trial, max(damping / 3, min_damping)
        break
      damping *= 4
    if not improved:
      break
  return theta
