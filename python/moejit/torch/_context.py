"""Binds the device's primary CUDA context to the calling thread before a library call.

moejit works in the driver's current context. PyTorch's tensors live in each device's primary
context, but a thread PyTorch starts (autograd's backward threads) may have none current yet:
c10 skips cudaSetDevice when the device index already matches, and the runtime binds the
context lazily. So the primary context is made current explicitly, as the runtime would.
"""

import ctypes
import threading

from ..errors import CudaError, NoDeviceError
from ..options import get_option
from ._errors import OutOfMemoryError

_lock = threading.Lock()
_driver = None
_primary = {}  # device ordinal -> its primary context, retained once for the life of the process


def _load_driver():
    # The library's driver: set_option's MOEJIT_CUDA_DRIVER reaches it, not the environment.
    name = get_option("cuda_driver") or "libcuda.so.1"
    try:
        d = ctypes.CDLL(name)
    except OSError as e:
        raise NoDeviceError(f"no CUDA driver: cannot load {name} ({e})", status="no_device") from e
    vp, i = ctypes.c_void_p, ctypes.c_int
    d.cuCtxGetCurrent.argtypes = [ctypes.POINTER(vp)]
    d.cuCtxSetCurrent.argtypes = [vp]
    d.cuDeviceGet.argtypes = [ctypes.POINTER(i), i]
    d.cuDevicePrimaryCtxRetain.argtypes = [ctypes.POINTER(vp), i]
    for fn in (d.cuCtxGetCurrent, d.cuCtxSetCurrent, d.cuDeviceGet, d.cuDevicePrimaryCtxRetain):
        fn.restype = i
    # Drivers before 12.5 lack it, and have no green context to resolve either.
    if hasattr(d, "cuStreamGetCtx_v2"):
        d.cuStreamGetCtx_v2.argtypes = [vp, ctypes.POINTER(vp), ctypes.POINTER(vp)]
        d.cuStreamGetCtx_v2.restype = i
    return d


def _owner_of_current(d):
    """The context behind the current one: for a green context (PyTorch's
    GreenContext.set_context()), its device's primary context, which the library takes as its own
    and which must stay current under it. None where the driver cannot say."""
    if not hasattr(d, "cuStreamGetCtx_v2"):
        return None
    owner, green = ctypes.c_void_p(), ctypes.c_void_p()
    _check(d.cuStreamGetCtx_v2(None, ctypes.byref(owner), ctypes.byref(green)), "cuStreamGetCtx_v2")
    return owner.value


_CUDA_ERROR_OUT_OF_MEMORY = 2


def _check(result, call):
    if result == _CUDA_ERROR_OUT_OF_MEMORY:  # as the library reports it (MOEJIT_ERROR_OUT_OF_MEMORY)
        raise OutOfMemoryError(f"{call} failed with CUDA error {result} (out of memory)", status="out_of_memory",
                               function=call)
    if result != 0:
        raise CudaError(f"{call} failed with CUDA error {result}", status="cuda", function=call)


def _primary_context(d, ordinal):
    with _lock:
        ctx = _primary.get(ordinal)
        if ctx is None:
            device = ctypes.c_int()
            _check(d.cuDeviceGet(ctypes.byref(device), ordinal), "cuDeviceGet")
            ctx = ctypes.c_void_p()
            _check(d.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), device), "cuDevicePrimaryCtxRetain")
            _primary[ordinal] = ctx
        return ctx


def make_current(ordinal):
    """Makes device `ordinal`'s primary context (PyTorch's) current on this thread, unless a
    green context of it is current already."""
    global _driver
    if _driver is None:
        with _lock:
            if _driver is None:
                _driver = _load_driver()
    d = _driver
    current = ctypes.c_void_p()
    _check(d.cuCtxGetCurrent(ctypes.byref(current)), "cuCtxGetCurrent")
    primary = _primary_context(d, ordinal)
    if current.value != primary.value and (current.value is None or _owner_of_current(d) != primary.value):
        _check(d.cuCtxSetCurrent(primary), "cuCtxSetCurrent")
