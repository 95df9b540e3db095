"""jaxroof: how fast a transformer serves tokens on an accelerator, and why.

The symbolic layer is importable without jax; the toy model, measurement and
calibration live in submodules that import jax when used.
"""

from jaxroof import errors
from jaxroof import formulas
from jaxroof import solved
from jaxroof import symbols
from jaxroof.accelerators import Accelerator
from jaxroof.accelerators import load_accelerator
from jaxroof.errors import InputError
from jaxroof.evaluate import step_model
from jaxroof.evaluate import summary_model
from jaxroof.model_spec import ModelSpec
from jaxroof.model_spec import load_model
from jaxroof.sweep import decode_sweep
from jaxroof.workload import decode_step_inputs

__version__ = "0.1.0"

__all__ = (
    "Accelerator",
    "InputError",
    "ModelSpec",
    "decode_step_inputs",
    "decode_sweep",
    "errors",
    "formulas",
    "load_accelerator",
    "load_model",
    "solved",
    "step_model",
    "summary_model",
    "symbols",
)
