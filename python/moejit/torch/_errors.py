"""moejit's out-of-memory error made PyTorch's too: a training loop that catches
torch.OutOfMemoryError to shrink its batch and retry then catches moejit's the same way. Here, not
in moejit.errors, because importing moejit must not import torch."""

import torch

from .. import errors


class OutOfMemoryError(errors.OutOfMemoryError, torch.cuda.OutOfMemoryError):
    """moejit.OutOfMemoryError that is also torch.OutOfMemoryError (named here by its older
    alias, torch.cuda's: torch 2.4 has no top-level name for it)."""


errors._raise_for_status(10, OutOfMemoryError)
