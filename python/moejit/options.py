"""The MOEJIT_* settings from Python.

They are environment variables of this process (README, "Environment variables"): the library
reads each one when it needs it, so a change applies to plans built afterwards — plans already
built keep their kernels and configs (moejit.torch.clear_plans() drops the cached ones), and
MOEJIT_CUDA_DRIVER is read once, at the library's first GPU use. `moejit.tune` passes them to the
CLI. MOEJIT_LIBRARY and MOEJIT_CLI are read by this package only, when it first loads the
library and each time it runs the CLI.
"""

import os

# name -> what it sets; the library's variables (src/core/env.cpp) then this package's.
OPTIONS = {
    "CACHE_DIR": "on-disk kernel cache directory",
    "DISK_CACHE": "0 turns the disk kernel cache off",
    "DB": "user tuning database (SQLite file)",
    "SHIPPED_DB_DIR": "folder of shipped tuned tables (db/)",
    "JOBS": "NVRTC compile threads",
    "LOG": "error, warn, info or debug",
    "CUDA_DRIVER": "driver library to dlopen instead of libcuda.so.1",
    "AUTOTUNE": "0: never self-tune (databases are still read)",
    "TUNE_BUDGET_S": "wall-clock seconds one self-tuning run may take",
    "LIBRARY": "path of libmoejit.so for this package",
    "CLI": "path of the moejit CLI for moejit.tune",
}


def _variable(name):
    key = name.upper()
    if key.startswith("MOEJIT_"):
        key = key[len("MOEJIT_"):]
    if key not in OPTIONS:
        raise ValueError(f"unknown moejit option {name!r}; known: {', '.join(sorted(OPTIONS))}")
    return "MOEJIT_" + key


def set_option(name, value):
    """Sets MOEJIT_<NAME> ("db" or "MOEJIT_DB"); None unsets it, booleans become 1/0."""
    variable = _variable(name)
    if value is None:
        os.environ.pop(variable, None)
    elif isinstance(value, bool):
        os.environ[variable] = "1" if value else "0"
    else:
        os.environ[variable] = os.fspath(value) if isinstance(value, os.PathLike) else str(value)


def get_option(name):
    """The value of MOEJIT_<NAME>, or None when unset (the library's default applies)."""
    return os.environ.get(_variable(name)) or None


def options():
    """Every known option and its current value (None: unset)."""
    return {"MOEJIT_" + key: get_option(key) for key in OPTIONS}
