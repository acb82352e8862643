"""The MOEJIT_* settings from Python.

The settings are the MOEJIT_* environment variables (README, "Environment variables");
set_option sets one for this process without changing os.environ: the library's own go to the
library (moejit_set_option), which reads them in place of the environment and is safe while
other threads build plans, as setenv is not. The library reads each when it needs it, so a change
applies to plans built afterwards — plans already built keep their kernels and configs
(moejit.torch.clear_plans() drops the cached ones), MOEJIT_CHECK_ADOPTED applies to the next
backward of any plan, and MOEJIT_CUDA_DRIVER is read once, at the library's first GPU use. `moejit.tune` passes the settings to the CLI. MOEJIT_LIBRARY and
MOEJIT_CLI are read by this package only, when it first loads the library and each time it runs
the CLI; setting them needs no library.
"""

import os
import threading

# A module, its functions looked up when called: _library imports this module while it loads.
from . import _library

# name -> what it sets; the library's variables (src/core/env.cpp) then this package's.
_LIBRARY_OPTIONS = {
    "CACHE_DIR": "on-disk kernel cache directory",
    "DISK_CACHE": "0 turns the disk kernel cache off",
    "DB": "user tuning database (SQLite file)",
    "SHIPPED_DB_DIR": "folder of shipped tuned tables (db/)",
    "JOBS": "NVRTC compile threads",
    "LOG": "error, warn, info or debug",
    "CUDA_DRIVER": "driver library to dlopen instead of libcuda.so.1",
    "AUTOTUNE": "0: never self-tune (databases are still read)",
    "CHECK_ADOPTED": "0: a backward takes an adopted (copied) or captured forward's state without checking its stamp",
    "CALL_GRAPHS": "0: plans built afterwards launch each kernel of an eager call on the stream, not as one graph",
    "TUNE_BUDGET_S": "wall-clock seconds one self-tuning run may take",
}
OPTIONS = {
    **_LIBRARY_OPTIONS,
    "LIBRARY": "path of libmoejit.so for this package",
    "CLI": "path of the moejit CLI for moejit.tune",
}

# "MOEJIT_<NAME>" -> set_option's value, in place of os.environ's ("": unset). The library keeps
# its own copy of its variables; this one answers get_option and gives the CLI its environment.
_settings = {}
# Held while both copies change, so that threads setting one option leave them alike.
_lock = threading.Lock()


def _variable(name):
    key = name.upper()
    if key.startswith("MOEJIT_"):
        key = key[len("MOEJIT_"):]
    if key not in OPTIONS:
        raise ValueError(f"unknown moejit option {name!r}; known: {', '.join(sorted(OPTIONS))}")
    return "MOEJIT_" + key


def _text(value):
    if value is None:
        return ""
    if isinstance(value, bool):
        return "1" if value else "0"
    return os.fspath(value) if isinstance(value, os.PathLike) else str(value)


def set_option(name, value):
    """Sets MOEJIT_<NAME> ("db" or "MOEJIT_DB") for this process, in place of the environment
    variable; None unsets it (the default applies whatever the environment holds), booleans
    become 1/0. A library setting loads the library, which checks the value (InvalidArgumentError
    for MOEJIT_AUTOTUNE="off"): set MOEJIT_LIBRARY first."""
    variable, text = _variable(name), _text(value)
    with _lock:
        if variable[len("MOEJIT_"):] in _LIBRARY_OPTIONS:
            _library.set_option(variable, text)
        _settings[variable] = text


def clear_option(name):
    """Drops set_option's setting of MOEJIT_<NAME>: the environment variable applies again."""
    variable = _variable(name)
    with _lock:
        if variable in _settings:
            if variable[len("MOEJIT_"):] in _LIBRARY_OPTIONS:
                _library.clear_option(variable)
            del _settings[variable]


def get_option(name):
    """The value of MOEJIT_<NAME>: set_option's, else the environment's; None when unset (the
    default applies)."""
    variable = _variable(name)
    return _settings.get(variable, os.environ.get(variable)) or None


def options():
    """Every known option and its current value (None: unset)."""
    return {"MOEJIT_" + key: get_option(key) for key in OPTIONS}


def environment():
    """A copy of os.environ with set_option's settings in it: a child process's environment (the
    CLI's) in which it sees them."""
    env = dict(os.environ)
    for variable, text in _settings.copy().items():
        if text:
            env[variable] = text
        else:
            env.pop(variable, None)
    return env
