"""ctypes binding of the moejit C ABI (include/moejit/moejit.h).

Where libmoejit.so is looked for, first match wins:
  1. MOEJIT_LIBRARY, set_option's or the environment's (a path to the file; an error if it does
     not exist),
  2. a copy or link inside this package: moejit/lib/libmoejit.so,
  3. the source tree this package sits in: build/release/src/libmoejit.so
     (editable installs and running from a checkout).
Loading the library neither initialises CUDA nor needs a GPU.
"""

import ctypes
import operator
import os
import pathlib
import threading

from .errors import InvalidArgumentError, LibraryNotFoundError, error_for_status
from .options import get_option

DTYPES = {"bf16": 0, "fp16": 1}
MODES = {"train": 0, "infer": 1, "memeff": 2}

_PACKAGE_DIR = pathlib.Path(__file__).resolve().parent
_REPO_LIBRARY = _PACKAGE_DIR.parent.parent / "build" / "release" / "src" / "libmoejit.so"


class Problem(ctypes.Structure):
    """moejit_problem; build it with make_problem, which checks each value against its C type."""

    _fields_ = [
        ("tokens", ctypes.c_int64),
        ("experts", ctypes.c_int32),
        ("hidden", ctypes.c_int32),
        ("intermediate", ctypes.c_int32),
        ("topk", ctypes.c_int32),
        ("dtype", ctypes.c_int32),
        ("mode", ctypes.c_int32),
        ("check_expert_ids", ctypes.c_int32),
    ]

    def key(self):
        return tuple(getattr(self, name) for name, _ in self._fields_)


# (name, value bits) of each field's signed C type, computed once: make_problem runs on every op call.
_FIELD_BITS = tuple((name, 8 * ctypes.sizeof(ctype) - 1) for name, ctype in Problem._fields_)


class MemoryPlan(ctypes.Structure):
    _fields_ = [
        ("saved_bytes", ctypes.c_size_t),
        ("forward_workspace_bytes", ctypes.c_size_t),
        ("backward_workspace_bytes", ctypes.c_size_t),
    ]


def make_problem(tokens, experts, hidden, intermediate, topk, dtype="bf16", mode="train", check_expert_ids=False):
    """A moejit_problem; dtype is "bf16"/"fp16", mode "train"/"infer"/"memeff" (or the C enums).
    A value outside its field's C type raises InvalidArgumentError, since ctypes would keep the low
    bits (2**32 + 8 experts would be 8); the library checks the rest."""
    values = (tokens, experts, hidden, intermediate, topk, _enum(DTYPES, dtype, "dtype"), _enum(MODES, mode, "mode"),
              1 if check_expert_ids else 0)
    for (name, bits), value in zip(_FIELD_BITS, values):
        if not -(1 << bits) <= operator.index(value) < 1 << bits:
            raise InvalidArgumentError(
                f"{name}: must be in [-2^{bits}, 2^{bits}) (int{bits + 1}_t in moejit_problem), got {value}",
                status="invalid_argument")
    return Problem(*values)


def _enum(table, value, what):
    if isinstance(value, int):
        return value
    try:
        return table[value]
    except KeyError:
        raise ValueError(f"{what} must be one of {sorted(table)}, got {value!r}") from None


def library_candidates():
    """The paths tried, in order (see the module docstring)."""
    explicit = get_option("library")
    if explicit:
        return [pathlib.Path(explicit)]
    return [_PACKAGE_DIR / "lib" / "libmoejit.so", _REPO_LIBRARY]


def library_path():
    """The libmoejit.so that is (or would be) loaded."""
    candidates = library_candidates()
    for path in candidates:
        if path.is_file():
            return path
    tried = ", ".join(str(p) for p in candidates)
    raise LibraryNotFoundError(
        f"libmoejit.so not found (tried {tried}); build it with `cmake --preset release && "
        "cmake --build --preset release` or set MOEJIT_LIBRARY to its path",
        status="io",
    )


_lock = threading.Lock()
_lib = None


def lib():
    """The loaded library (loaded on first use, once per process)."""
    global _lib
    if _lib is None:
        with _lock:
            if _lib is None:
                _lib = _load(library_path())
    return _lib


def _load(path):
    try:
        cdll = ctypes.CDLL(str(path))
    except OSError as e:
        raise LibraryNotFoundError(f"cannot load {path}: {e}", status="io") from e
    vp, sz, status = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
    problem_p, memory_p = ctypes.POINTER(Problem), ctypes.POINTER(MemoryPlan)
    signatures = {
        "moejit_plan_create": (status, [problem_p, ctypes.POINTER(vp)]),
        "moejit_plan_destroy": (None, [vp]),
        "moejit_plan_memory": (status, [vp, memory_p]),
        "moejit_problem_memory": (status, [problem_p, memory_p]),
        "moejit_forward": (status, [vp, vp, vp, vp, vp, vp, vp, vp, sz, vp, sz, vp]),
        "moejit_backward": (status, [vp, vp, vp, vp, vp, vp, vp, vp, sz, vp, vp, vp, vp, vp, sz, vp]),
        "moejit_plan_adopt_saved": (status, [vp, vp]),
        "moejit_set_option": (status, [ctypes.c_char_p, ctypes.c_char_p]),
        "moejit_clear_option": (status, [ctypes.c_char_p]),
        "moejit_last_error": (ctypes.c_char_p, []),
        "moejit_status_name": (ctypes.c_char_p, [status]),
        "moejit_version": (ctypes.c_char_p, []),
    }
    for name, (restype, argtypes) in signatures.items():
        try:
            fn = getattr(cdll, name)
        except AttributeError as e:
            raise LibraryNotFoundError(f"{path} lacks {name}: rebuild the library", status="io") from e
        fn.restype, fn.argtypes = restype, argtypes
    return cdll


def check(code, function):
    """Raises the moejit exception for a failed status, with the library's message."""
    if code != 0:
        lib_ = lib()
        message = lib_.moejit_last_error().decode(errors="replace")
        raise error_for_status(code, message, status_name(code), function)


def version():
    return lib().moejit_version().decode()


def status_name(code):
    return lib().moejit_status_name(code).decode()


def set_option(variable, value):
    """moejit_set_option: one of the library's MOEJIT_* settings, "" or None unsetting it."""
    encoded = None if value is None else os.fsencode(value)
    check(lib().moejit_set_option(variable.encode(), encoded), "moejit_set_option")


def clear_option(variable):
    """moejit_clear_option: the environment variable applies again."""
    check(lib().moejit_clear_option(variable.encode()), "moejit_clear_option")


def problem_memory(problem):
    """Device bytes a plan of `problem` needs, computed on the host (no GPU)."""
    out = MemoryPlan()
    check(lib().moejit_problem_memory(ctypes.byref(problem), ctypes.byref(out)), "moejit_problem_memory")
    return out


class Plan:
    """One moejit_plan: kernels compiled (or tuned) and loaded into the CUDA context current at
    creation. Calls take raw device addresses (ints) and a CUstream (int, 0 = legacy default);
    backward's dw1 and dw2 may both be None (frozen experts: neither is computed). One plan
    serialises its calls (the library's plan is not thread-safe)."""

    def __init__(self, problem):
        self._calls = threading.Lock()  # first: __del__ runs close() also when creation fails
        self._handle = None
        self.problem = problem
        handle = ctypes.c_void_p()
        check(lib().moejit_plan_create(ctypes.byref(problem), ctypes.byref(handle)), "moejit_plan_create")
        self._handle = handle
        self.memory = MemoryPlan()
        check(lib().moejit_plan_memory(handle, ctypes.byref(self.memory)), "moejit_plan_memory")

    def forward(self, x, w1, w2, topk_ids, topk_weights, out, saved, saved_bytes, workspace, workspace_bytes, stream):
        with self._calls:
            code = lib().moejit_forward(
                self._handle, x, w1, w2, topk_ids, topk_weights, out, saved, saved_bytes, workspace,
                workspace_bytes, stream)
        check(code, "moejit_forward")

    def backward(self, d_out, x, w1, w2, topk_ids, topk_weights, saved, saved_bytes, dx, dw1, dw2, d_topk_weights,
                 workspace, workspace_bytes, stream, adopt_saved=False):
        """adopt_saved: `saved` holds a completed forward state of this problem, copied there
        since a forward wrote it (moejit_plan_adopt_saved): the library checks the stamp that
        forward wrote, synchronising the stream (MOEJIT_CHECK_ADOPTED=0: it takes the word)."""
        with self._calls:
            if adopt_saved:
                check(lib().moejit_plan_adopt_saved(self._handle, saved), "moejit_plan_adopt_saved")
            code = lib().moejit_backward(
                self._handle, d_out, x, w1, w2, topk_ids, topk_weights, saved, saved_bytes, dx, dw1, dw2,
                d_topk_weights, workspace, workspace_bytes, stream)
        check(code, "moejit_backward")

    def close(self):
        # A call on another thread holds the lock while the library runs (ctypes releases the
        # GIL): the plan is destroyed after it, and a later call finds no handle.
        with self._calls:
            handle, self._handle = self._handle, None
            if handle and _lib is not None:
                _lib.moejit_plan_destroy(handle)

    def __del__(self):
        self.close()
