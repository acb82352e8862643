"""moejit: fused Mixture-of-Experts CUDA kernels, JIT-compiled and tuned per GPU.

  moejit.torch.fused_moe(x, gate_up_proj, down_proj, topk_ids, topk_weights)   the PyTorch op
  moejit.torch.MoEExperts                                                       drop-in HF experts block
  moejit.set_option("db", path), moejit.options()                              MOEJIT_* settings
  moejit.tune(shape=(E, H, I, K), tokens=[...])                                 offline tuning (CLI)

Importing moejit needs neither torch nor a GPU; `moejit.torch` imports torch.
"""

import importlib

from ._library import library_path, version
from .errors import (
    CompileError,
    CudaError,
    DatabaseError,
    FileError,
    InvalidArgumentError,
    LibraryNotFoundError,
    MoejitError,
    NoDeviceError,
    OutOfMemoryError,
    StateError,
    UnsupportedError,
)
from .options import clear_option, get_option, options, set_option
from .tuning import cli_path, tune

__version__ = "0.3.0"

__all__ = [
    "CompileError",
    "CudaError",
    "DatabaseError",
    "FileError",
    "InvalidArgumentError",
    "LibraryNotFoundError",
    "MoejitError",
    "NoDeviceError",
    "OutOfMemoryError",
    "StateError",
    "UnsupportedError",
    "clear_option",
    "cli_path",
    "get_option",
    "library_path",
    "options",
    "set_option",
    "tune",
    "version",
]


def __getattr__(name):
    # `moejit.torch` without an explicit import; loaded on first use so torch stays optional.
    if name == "torch":
        return importlib.import_module(".torch", __name__)
    raise AttributeError(f"module 'moejit' has no attribute {name!r}")
