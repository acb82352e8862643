"""Wrapper tensor subclasses, as DTensor and NF4 are (no storage of their own): aten ops run on the
inner tensor. Shared by the CPU and GPU tests of the eager path's gate (functional._eager)."""

import torch


class PassThrough(torch.Tensor):
    """Runs every op, moejit's too, on its inner tensor."""

    refuses_moejit = False

    @staticmethod
    def __new__(cls, inner):
        return torch.Tensor._make_wrapper_subclass(cls, inner.shape, strides=inner.stride(), dtype=inner.dtype,
                                                   device=inner.device, requires_grad=inner.requires_grad)

    def __init__(self, inner):
        self.inner = inner

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if cls.refuses_moejit and func.namespace == "moejit":
            raise NotImplementedError(f"{cls.__name__} does not run {func}")
        args, kwargs = torch.utils._pytree.tree_map_only(cls, lambda t: t.inner, (args, kwargs or {}))
        return func(*args, **kwargs)


class RefusesMoejit(PassThrough):
    """Refuses moejit's ops, as such subclasses refuse ops they do not know."""

    refuses_moejit = True
