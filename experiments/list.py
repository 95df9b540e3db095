"""What `--model`, `--accelerator`, `--engine` and the dtype flags accept, with sources.

  python -m experiments.list                 # models, accelerators, engines
  python -m experiments.list --what=engines  # each engine's measured accelerators and error
  python -m experiments.list --what=dtypes   # weight and K/V dtypes
"""

from __future__ import annotations

from absl import flags

from experiments import _cli
from jaxroof import files
from jaxroof.engines import engine_profiles as profiles
from jaxroof.report import table
from jaxroof.specs import accelerators
from jaxroof.specs import kv_sizing
from jaxroof.specs import models
from jaxroof.specs import parameters

_WHAT = flags.DEFINE_enum("what", "all", ["all", "models", "accelerators", "engines", "dtypes"],
                          "What to list.")
_JSON_OUT = flags.DEFINE_string("json_out", None, "Write the lists as JSON here.")


def model_rows() -> list[dict]:
  rows = []
  for name in models.shipped_models():
    spec = models.load_model(name)
    counts = parameters.parameter_counts(spec)
    rows.append({
        "name": name, "layers": spec.num_layers, "parameters": counts.total,
        "active_parameters": counts.active,
        "published_weight_dtype": parameters.published_format(spec).dtype,
        "kinds": sorted(set(spec.layer_kinds)), "source": spec.source
    })
  return rows


_RATE_COLUMNS = ("bf16", "fp8", "mxfp4", "nvfp4")  # Dense; "-": no such datapath.


def _rate(rates: dict, dtype: str) -> str:
  return f"{rates[dtype] / 1e12:,.0f}" if dtype in rates else "-"


def accelerator_rows() -> list[dict]:
  rows = []
  for name in accelerators.known_accelerators():
    device = accelerators.load_accelerator(name)
    rows.append({
        "name": name, "full_name": device.full_name, "memory_bytes": device.memory_capacity_bytes,
        "bandwidth_bytes_per_s": device.memory_bandwidth_bytes_per_s,
        "dense_flops_per_s": dict(device.flops_per_s), "tdp_w": device.tdp_w
    })
  return rows


def main(argv: list[str]) -> None:
  del argv  # Unused.
  what = _WHAT.value
  out: dict = {}
  if what in ("all", "models"):
    out["models"] = model_rows()
    print(
        table.format_table(
            ("model (--model)", "layers", "params B", "active B", "published", "layer kinds"), [[
                r["name"], r["layers"], f"{r['parameters'] / 1e9:,.2f}",
                f"{r['active_parameters'] / 1e9:,.2f}", r["published_weight_dtype"], ", ".join(
                    r["kinds"])
            ] for r in out["models"]]))
    print("or give a path to a Hugging Face config.json (or its folder).\n")
  if what in ("all", "accelerators"):
    out["accelerators"] = accelerator_rows()
    print(
        table.format_table(("accelerator (--accelerator)", "name", "memory GB", "TB/s") +
                           tuple(f"{d} TFLOP/s" for d in _RATE_COLUMNS), [[
                               r["name"], r["full_name"], f"{r['memory_bytes'] / 1e9:,.0f}",
                               f"{r['bandwidth_bytes_per_s'] / 1e12:,.2f}"
                           ] + [_rate(r["dense_flops_per_s"], d)
                                for d in _RATE_COLUMNS] for r in out["accelerators"]]))
    print("'-': no published rate for that format; weights in it run at the bf16 rate.")
    print("or give your own with --accelerator_file=PATH (the same JSON schema).\n")
  if what in ("all", "engines"):
    out["engines"] = profiles.summary()
    print(
        table.format_table(
            ("engine (--engine)", "profile", "measured on", "held-out error"),
            [[r["engine"], r["profile"], ", ".join(r["accelerators"]) or "-", r["heldout"]]
             for r in out["engines"]]))
    print("bound (the default): the analytic model. An accelerator an engine was not measured "
          "on, of a vendor it was, takes a derived entry (a wider error); another is refused.\n")
  if what in ("all", "dtypes"):
    out["weight_dtypes"] = {d: parameters.bytes_per_weight(d) for d in parameters.WEIGHT_DTYPES}
    out["kv_dtypes"] = dict(kv_sizing.KV_DTYPES)
    print("weight dtypes (bytes/weight, scales included): " +
          ", ".join(f"{d} {q:g}" for d, q in out["weight_dtypes"].items()))
    print("--weight_dtype=published (the default) takes each model's own format, "
          "listed with the models.")
    print("K/V dtypes (bytes/element): " +
          ", ".join(f"{d} {b:g}" for d, b in out["kv_dtypes"].items()))
  if _JSON_OUT.value:
    files.write_json(_JSON_OUT.value, out)


if __name__ == "__main__":
  _cli.run(main)
