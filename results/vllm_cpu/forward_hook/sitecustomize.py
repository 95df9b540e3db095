"""Times vLLM's model forward in whichever process runs it (engine_served_forward.py).

Python imports `sitecustomize` at start-up from the path; with this folder on PYTHONPATH and
JAXROOF_FORWARD_LOG naming a folder, it wraps `GPUModelRunner._model_forward` when vLLM's
runner module is imported and appends "tokens seconds" per call (perf_counter) to
JAXROOF_FORWARD_LOG/forward_PID.log. Without JAXROOF_FORWARD_LOG it does nothing.
"""
import importlib.abc
import importlib.util
import os
import sys
import time

_LOG_DIR = os.environ.get("JAXROOF_FORWARD_LOG")
_RUNNER = "vllm.v1.worker.gpu_model_runner"


def _timed(module) -> None:
  runner = module.GPUModelRunner
  original = runner._model_forward
  log = open(os.path.join(_LOG_DIR, f"forward_{os.getpid()}.log"), "a", buffering=1)

  def _model_forward(self, *args, **kwargs):
    start = time.perf_counter()
    try:
      return original(self, *args, **kwargs)
    finally:
      ids = kwargs.get("input_ids", args[0] if args else None)
      log.write(f"{getattr(ids, 'shape', [-1])[0]} {time.perf_counter() - start:.6f}\n")

  runner._model_forward = _model_forward


class _Finder(importlib.abc.MetaPathFinder):
  """Lets the runner module load as usual, then wraps its forward."""

  def find_spec(self, name, path, target=None):
    if name != _RUNNER:
      return None
    sys.meta_path.remove(self)
    try:
      spec = importlib.util.find_spec(name)
    finally:
      sys.meta_path.insert(0, self)
    load = spec.loader.exec_module

    def exec_module(module):
      load(module)
      _timed(module)

    spec.loader.exec_module = exec_module
    return spec


if _LOG_DIR:
  sys.meta_path.insert(0, _Finder())
