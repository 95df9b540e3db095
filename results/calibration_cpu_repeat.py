"""Rewrites calibration_cpu_repeat.json: every pair of the twelve `calibrate --budget_s=120`
runs of 2026-12-02 (sets D, E, F, G) compared by `toy_fit.compare_profiles`.

Each run is refitted from the timings its calibration JSON holds (`measurements`,
`operations`, `ceilings`) with the current fit, which gives its factors again and the
records later code adds to a profile (`fit.basis_round_spread`, `fit.basis_sensitivity`,
`fit.point_round_spread`, `fit.point_median_s`), so all twelve are compared alike (G's
own profiles, from 290ca81, hold an earlier, per-stage form of the sensitivity). Run from
the repository root: `python results/calibration_cpu_repeat.py` (about 30 s).
"""

import dataclasses
import itertools
import json
import pathlib
import sys

sys.path.insert(0, ".")

from jaxroof import files  # noqa: E402
from jaxroof.calibrate import toy_fit  # noqa: E402
from jaxroof.measure import ceilings as ceilings_lib  # noqa: E402
from jaxroof.measure import measurement  # noqa: E402
from jaxroof.toy.config import ToyConfig  # noqa: E402

RUNS = [
    f"results/calibration_cpu_2026-12-02_spread{s}_run{i}.json" for s in "DEFG" for i in (1, 2, 3)
]


def refit(path: str):
  """The run's profile, refitted from its own timings."""
  run = json.loads(pathlib.Path(path).read_text())
  records = [measurement.Measurement.from_json(m) for m in run["measurements"]]
  fit_names = [m["name"] for m in run["fit_models"]]
  held_names = [m["name"] for m in run["heldout_models"]]
  configs = {n: ToyConfig(**c) for n, c in run["model"]["configs"].items()}
  measured = toy_fit.Measured(ceilings_lib.Ceilings.from_json(run["ceilings"]),
                              [measurement.Measurement.from_json(m) for m in run["operations"]],
                              [r for r in records if r.extra["model"] in fit_names],
                              [r for r in records if r.extra["model"] in held_names],
                              len(run["heldout_points"]))
  job = toy_fit.fit_steps(
      measured, fit="ops", dtype=run["dtype"], backend=run["backend"], regime=True,
      models={n: configs[n] for n in fit_names}, heldout_models={n: configs[n] for n in held_names},
      budget_s=run["budget_s"],
      plan={k: run["model"][k] for k in ("rounds", "warmup", "repeats", "interleaved")})
  shipped = {**run["factors"], **run["regime_factors"]}
  again = {**job.profile.factors, **job.profile.regime_factors}
  # The run's own date, not the refit's.
  profile = dataclasses.replace(job.profile, created=run["created"])
  return profile, max(abs(again[n] / shipped[n] - 1) for n in shipped)


def main():
  profiles, refit_moved = {}, {}
  for path in RUNS:
    profiles[path], refit_moved[path] = refit(path)
  pairs = [{**toy_fit.compare_profiles(profiles[a], profiles[b]), "previous": a, "current": b}
           for a, b in itertools.combinations(RUNS, 2)]
  failing = [p for p in pairs if not p["pass"]]

  def within(s: str) -> list[dict]:
    return [p for p in pairs if f"spread{s}" in p["previous"] and f"spread{s}" in p["current"]]

  files.write_json(
      "results/calibration_cpu_repeat.json", {
          "kind": "repeatability",
          "what":
              ("toy_fit.compare_profiles over every pair of twelve calibrate --budget_s=120 runs, "
               "four sets of three from clean clones (D: 248562f, 05:12-05:19 UTC; E: 248562f, "
               "05:20-05:27; F: 6ba412f, 05:31-05:38; G: 290ca81, 07:29-07:36, a noisier "
               "hour; 2026-12-02, AMD EPYC 2 cores, XLA:CPU, float32, load 0.6-2.0)"),
          "made_by": ("python results/calibration_cpu_repeat.py (each run refitted from its "
                      "own timings)"),
          "refit_max_factor_rel_change": max(refit_moved.values()),
          "pass_count": sum(p["pass"] for p in pairs),
          "pairs_count": len(pairs),
          "pass_count_within_sets": {s: sum(p["pass"] for p in within(s)) for s in "DEFG"},
          "failing_explained_by_machine": sum(p["outside_explained_by_machine"] for p in failing),
          "failing_not_explained": [{k: p[k] for k in ("previous", "current", "factors_outside")}
                                    for p in failing if not p["outside_explained_by_machine"]],
          "max_factor_rel_diff_by_factor":
              {n: max(p["factor_rel_diff"][n] for p in pairs) for n in pairs[0]["factor_rel_diff"]},
          "max_factor_rel_diff_data_removed_by_factor": {
              n: max(p["factor_rel_diff_data_removed"][n] for p in pairs)
              for n in pairs[0]["factor_rel_diff_data_removed"]
          },
          "pairs": pairs,
      })
  summary = json.loads(pathlib.Path("results/calibration_cpu_repeat.json").read_text())
  print({k: v for k, v in summary.items() if k != "pairs"})


if __name__ == "__main__":
  main()
