"""Shared entry point and flag checks for the absl experiments.

`run(main)` is `absl.app.run` with two rules: a flag that fails to parse or
validate, and a user's mistake found later (`InputError`), are each printed as
one line naming the parameter, and the process exits 2 without a traceback.
A library error names its field (`InputError.field`, e.g. "tp"); `FIELD_FLAGS`
maps fields to flags, so the line names the flag the user typed (`--tp=3`).
"""

from __future__ import annotations

import difflib
import logging as std_logging
import math
import re
import sys
from collections.abc import Callable

from absl import app
from absl import flags

from experiments import _finite
from jaxroof import files
from jaxroof.errors import InputError

_HINT = "(see --helpshort for what each flag allows)"

_ENUM_ERROR = re.compile(
    r"flag --[\w.]+=(?P<value>.*?): value should be one of <(?P<choices>[^>]*)>")


def _suggestion(message: str) -> str:
  """' Did you mean ...?' for an enum flag's misspelt value ('' if none is close)."""
  match = _ENUM_ERROR.search(message)
  if not match:
    return ""
  value, choices = match["value"], match["choices"].split("|")
  close = difflib.get_close_matches(value.lower(), choices, n=1, cutoff=0.6)
  return f" Did you mean {close[0]!r}?" if close else ""


def empty_flag_error() -> str | None:
  """The error for a text flag given an empty value (`--model=`, often an unset
  shell variable), or None. Empty is never read as "absent"."""
  for name in flags.FLAGS:
    flag = flags.FLAGS[name]
    if (flag.present and type(flag.parser) is flags.ArgumentParser and
        isinstance(flag.value, str) and not flag.value.strip()):
      return (f"--{flag.name}={flag.value!r} is empty: give a value, or omit "
              f"--{flag.name} {_HINT}")
  return None


def _parse_flags(argv: list[str]) -> list[str]:
  try:
    rest = flags.FLAGS(argv)
  except flags.Error as e:
    empty = empty_flag_error()  # Before a validator's reading of '' as given.
    if empty:
      print(f"error: {empty}", file=sys.stderr)
      sys.exit(2)
    message = str(e).strip().splitlines()[0]  # absl may report several: the first.
    # A multi-flag validator's message starts by echoing every flag it read
    # ("flags a=1, b=2, ...: "); its own words name the flags that matter.
    message = re.sub(r"^flags .*?=.*?: (?=[a-z-]*--)", "", message, count=1)
    suggestion = _suggestion(message)
    if len(message) > 300:  # A huge list flag would be echoed whole.
      message = f"{message[:150]} ... {message[-120:]}"
    print(f"error: {message}{suggestion} {_HINT}", file=sys.stderr)
    sys.exit(2)
  empty = empty_flag_error()
  if empty:
    print(f"error: {empty}", file=sys.stderr)
    sys.exit(2)
  return rest


# Output flags every experiment may define, and the kind of output each takes (a
# file's extensions, `files.EXTENSIONS`, or a folder).
OUTPUT_FLAGS: dict[str, str] = {
    "json_out": "json", "plot_out": "plot", "profile_out": "json", "summary_out": "json",
    "out_dir": files.FOLDER
}
_SIBLINGS: dict[str, tuple[str, ...]] = {}  # Output flag -> suffixes written beside it.


def output_siblings(flag: str, *suffixes: str) -> None:
  """Declares the files the calling experiment writes beside an output flag's path
  (`simulate --plot_out=a.png` also writes `a_kv.png`): checked with it, first."""
  _SIBLINGS[flag] = suffixes


def check_outputs() -> None:
  """Checks every set output flag before any work starts (`files.check_outputs`): each
  file with its siblings, each folder, and no two naming the same path."""
  outputs = {
      f"--{name}": (flags.FLAGS[name].value or None, kind) for name, kind in OUTPUT_FLAGS.items()
      if name in flags.FLAGS
  }
  files.check_outputs(outputs, siblings={f"--{n}": s for n, s in _SIBLINGS.items()})


# No count this tool takes (tokens, sequences, layers, sizes, seeds) is
# physically above this; a larger one is a typo, and would hang or overflow.
MAX_INT_FLAG = 2**31 - 1


def check_numeric_flags() -> None:
  """Refuses nan and inf in any float flag, and integers beyond `MAX_INT_FLAG`,
  naming the flag (absl accepts all of them)."""
  for name in flags.FLAGS:
    value = flags.FLAGS[name].value
    if isinstance(value, float) and not math.isfinite(value):
      raise InputError(f"--{name}={value} is not a finite number.")
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT_FLAG:
      raise InputError(f"--{name}={value} is too large: at most {MAX_INT_FLAG:,}.")
    if name == "seed" and isinstance(value, int) and not 0 <= value < 2**32:
      raise InputError(f"--seed={value} is not allowed: seeds are whole numbers in "
                       "[0, 2**32).")


# Library fields (`InputError.field`) whose flag has another name (often another unit),
# in the order tried: the first flag the running experiment defines is named. Any other
# field names the flag of its own name, when the experiment defines one.
FIELD_FLAGS: dict[str, tuple[str, ...]] = {
    "token_gap_s": ("token_gap_ms",),
    "token_gap": ("token_gap_ms",),
    "ttft_s": ("ttft_ms",),
    "ttft": ("ttft_ms",),
    "tpot_s": ("tpot_ms",),
    "itl_s": ("itl_ms",),
    "batching_window": ("batching_window_ms", "batch_window_ms"),
    "window_s": ("batching_window_ms", "batch_window_ms"),
    "BW": ("bandwidth_tbps",),
    "F": ("tflops",),
    "N": ("params_b", "weights_gb"),
    "q": ("bytes_per_weight",),
    "k": ("kv_bytes_per_token",),
    "layers": ("layers",),
    "memory_capacity_bytes": ("memory_gb",),
    "kv_memory_bytes": ("kv_memory_gb",),
    "kv_per_sequence_bytes": ("kv_gb_per_seq",),
    "arrival_rate_per_s": ("arrival_rate",),
    "aggregate_tokens_per_s": ("aggregate_tokens_per_s",),
    "accelerators": ("accelerators", "accelerator"),
    "accelerator": ("accelerator",),
    "bandwidth_tb_s": ("bandwidth_tbps",),
    "bandwidth_bytes_per_s": ("bandwidth_tbps",),
    "flops_per_s": ("tflops",),
    "weight_bytes": ("weights_gb",),
    "kv_bytes_per_sequence": ("kv_gb_per_seq",),
    "weight_dtypes": ("weight_dtype",),
    "kv_dtypes": ("kv_dtype",),
    "contexts": ("context",),
    "batch_window_s": ("batching_window_ms", "batch_window_ms"),
    "measurements": ("from_csv", "from_vllm"),
}


def flag_for(field: str | None, flag_values: flags.FlagValues = flags.FLAGS) -> str | None:
  """The flag a library field maps to in this experiment (`FIELD_FLAGS`, else the flag
  of the field's own name; an element `batch_sizes[2]` maps as its list), or None."""
  if not field:
    return None
  base = re.sub(r"\[\d+\]$", "", field)
  for name in FIELD_FLAGS.get(base, (base,)):
    if name in flag_values:
      return name
  return None


def error_line(error: InputError, flag_values: flags.FlagValues = flags.FLAGS) -> str:
  """The one line for a library error, naming the flag of its field: `--tp=3 is not
  allowed ...` where the flag is the field, `--token_gap_ms=0.5: token_gap_s=...` where
  they differ. A message that already names a flag, or a field no flag sets, is kept."""
  message = str(error)
  field = getattr(error, "field", None)
  flag = flag_for(field, flag_values)
  if flag is None or message.startswith("--"):
    return message
  if flag == field and message.startswith(f"{field}="):
    return f"--{message}"
  holder = flag_values[flag]
  if isinstance(holder, flags.BooleanFlag) and not holder.present:
    return f"{message} (the switch: --{flag})"  # Not given: the line must not say it was.
  # A switch names itself (`--what_if`), not its unset value (`--nowhat_if`).
  given = (f"--{flag}"
           if isinstance(holder, flags.BooleanFlag) else holder.serialize() or f"--{flag}")
  if len(given) > 80:  # A long list flag, echoed whole, would bury the message.
    given = f"{given[:60]}..."
  return f"{given}: {message}"


# Flags an experiment takes from the shared flag modules (`_model_flags`, `_layout_flags`,
# ...) that its --helpshort lists beside its own: declared by `key_flags`, registered by
# `run` for the module it runs.
_KEY_FLAGS: list[str] = []
MODEL_KEYS = ("model", "accelerator", "weight_dtype", "kv_dtype", "profile")  # The usual ones.
_EXPERIMENT = re.compile(r"experiments\.[a-z]\w*")


def key_flags(*names: str) -> None:
  """Declares the calling experiment's key flags among those a shared flag module defines
  for it: `--helpshort` lists them beside the flags it defines itself (absl's key flags).
  They are registered when `run` parses the flags, so the call may come first."""
  _KEY_FLAGS.extend(names)


def register_key_flags(main_module: str, flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """Makes the declared key flags, and the key flags of any experiment the running one
  wraps (an alias such as `calibrate_engine` runs `calibrate`), key flags of
  `main_module` (absl's name for the module run: `sys.argv[0]`)."""
  wrapped = [
      flag for module in flag_values.flags_by_module_dict() if _EXPERIMENT.fullmatch(module)
      for flag in flag_values.get_key_flags_for_module(module)
  ]
  for flag in wrapped + [flag_values[name] for name in dict.fromkeys(_KEY_FLAGS)]:
    flag_values.register_key_flag_for_module(main_module, flag)


def run(main: Callable[[list[str]], int | None]) -> None:
  """Runs an absl `main`, turning bad input into a one-line error.

  Before `main`: the experiment's key flags are registered (`key_flags`), every
  output path is checked (so hours of work never end in an unwritable path) and
  no float flag may be nan or inf.
  """
  register_key_flags(sys.argv[0])

  def guarded(argv: list[str]) -> int | None:
    # jax logs at INFO that it found no TPU library on every start; not news.
    std_logging.getLogger("jax._src.xla_bridge").setLevel(std_logging.WARNING)
    if len(argv) > 1:
      print(f"error: unexpected arguments {argv[1:]} {_HINT}", file=sys.stderr)
      sys.exit(2)
    try:
      _finite.install()  # A nan or inf result is an error line, never exit 0.
      check_numeric_flags()
      check_outputs()
      return main(argv)
    except InputError as e:
      print(f"error: {error_line(e)}", file=sys.stderr)
      sys.exit(2)
    except OSError as e:  # An output path that cannot be written, a missing file.
      print(f"error: {e.filename or ''}: {e.strerror or e}", file=sys.stderr)
      sys.exit(2)

  app.run(guarded, flags_parser=_parse_flags)


PLAUSIBLE = (1e-9, 1e9)  # A flag's physical range in its own unit (e.g. TB/s, ms, GB).


def define_progress() -> flags.FlagHolder:
  """`--progress` (default on; `--noprogress` turns it off): a bar with the time left
  on stderr, shown only on a terminal (`jaxroof.progress`)."""
  return flags.DEFINE_boolean(
      "progress", True, "Show a progress bar with the time left on stderr when it is a "
      "terminal (--noprogress, or the env var JAXROOF_NO_PROGRESS=1: never).")


def require_positive(holder: flags.FlagHolder, unit: str, within: tuple[float,
                                                                        float] = PLAUSIBLE) -> None:
  """Validates that a numeric flag, when set, lies in a physical range > 0.

  The default range, 1e-9 to 1e9 in the flag's own unit, keeps subnormal
  and huge values (which would print inf) out of every formula.
  """
  low, high = within
  flags.register_validator(
      holder.name,
      lambda v: v is None or (math.isfinite(v) and low <= v <= high),
      message=f"must be a number in [{low:g}, {high:g}] ({unit})",
  )


MAX_LIST_ITEMS = 1_000  # Values in one list flag (batch sizes, contexts): each is work.


def require_positive_int_list(holder: flags.FlagHolder, unit: str,
                              max_items: int = MAX_LIST_ITEMS) -> None:
  """Validates a list flag of whole numbers in [1, MAX_INT_FLAG] (e.g. batch sizes), at
  most `max_items` of them."""

  def valid(values: list[str] | None) -> bool:
    if not values or len(values) > max_items:
      return False
    try:
      return all(1 <= int(v) <= MAX_INT_FLAG and float(v) == int(v) for v in values)
    except ValueError:
      return False

  flags.register_validator(
      holder.name,
      valid,
      message=(f"must be a non-empty comma-separated list of at most {max_items:,} whole "
               f"numbers in [1, {MAX_INT_FLAG:,}] ({unit})"),
  )


def int_list(holder: flags.FlagHolder) -> list[int]:
  """The validated values of a `require_positive_int_list` flag."""
  return [int(v) for v in holder.value]


def require_flags(*holders: flags.FlagHolder) -> None:
  """Required flags, checked in main so that `--only_check_args` works bare."""
  for holder in holders:
    if holder.value is None:
      raise InputError(f"--{holder.name} is required: {flags.FLAGS[holder.name].help}")
