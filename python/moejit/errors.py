"""Python exceptions for the moejit library's status codes (include/moejit/moejit.h).

Every failure of a library call raises a subclass of MoejitError whose message is the
library's own (moejit_last_error); `status` is the C status name ("invalid_argument", ...).
"""


class MoejitError(RuntimeError):
    """A moejit call failed; `status` names the library's status code, `function` the call."""

    def __init__(self, message, status="internal", function=None):
        super().__init__(message)
        self.status = status
        self.function = function


class InvalidArgumentError(MoejitError, ValueError):
    """A shape, dtype, alignment, pointer or option passed to moejit is wrong."""


class NoDeviceError(MoejitError):
    """No CUDA driver, GPU or current context where one was needed."""


class CudaError(MoejitError):
    """A CUDA driver call failed."""


class CompileError(MoejitError):
    """NVRTC rejected generated kernel source."""


class DatabaseError(MoejitError):
    """The tuning database could not be read or written."""


class FileError(MoejitError, OSError):
    """A file (kernel cache, database) could not be read or written."""


class UnsupportedError(MoejitError, NotImplementedError):
    """A valid request this build or device cannot serve."""


class StateError(MoejitError):
    """A call out of order, e.g. a second backward over memory-efficient saved state."""


class OutOfMemoryError(MoejitError, MemoryError):
    """Host or device memory ran out (the message says which): free memory or shrink the batch,
    and try again. Once moejit.torch is imported, the library raises moejit.torch.OutOfMemoryError,
    a subclass that is also the torch.OutOfMemoryError PyTorch training loops catch."""


class LibraryNotFoundError(MoejitError, OSError):
    """libmoejit.so could not be located or loaded."""


# Indexed by the C enum moejit_status.
_BY_STATUS = {
    1: InvalidArgumentError,
    2: NoDeviceError,
    3: CudaError,
    4: CompileError,
    5: DatabaseError,
    6: FileError,
    7: UnsupportedError,
    8: StateError,
    10: OutOfMemoryError,
}


def _raise_for_status(code, cls):
    """Raise `cls`, a subclass of the status's class, for `code` from now on (moejit.torch's
    out-of-memory error, which torch's handlers catch too)."""
    _BY_STATUS[code] = cls


def error_for_status(code, message, status_name, function):
    """The exception for a failed call returning status `code`."""
    return _BY_STATUS.get(code, MoejitError)(message, status=status_name, function=function)
