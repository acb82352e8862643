"""The size of the library's saved state (moejit_problem_memory's saved_bytes) as arithmetic.

PyTorch's fake tensors need that size when a dimension is symbolic (torch.compile with dynamic
shapes), where the library's host function cannot be called. The same function of ints works on
torch SymInts without a guard: min, max and the tile choice become torch.sym_min, sym_max and
sym_ite, so the size stays one expression of T, also where T is data-dependent (unbacked: an
expert-parallel rank's token count from .item()), which cannot be guarded on. It mirrors
memory_layout() and routing_layout() in src/moe/ and token_block_m() in tuner/role_traits.cpp;
python/tests/test_library.py checks it against the library, and inductor asserts the real `saved`
has this size.
"""

_ALIGN = 256  # every region of the layout starts on a 256-byte boundary
_ROUTING_MIN_CHUNK = 512  # kRoutingMinChunk
_ELEMENT_BYTES = 2  # bf16 and fp16
_STAMP_BYTES = 256  # MemoryLayout::kStampBytes


def _symbolic(*values):
    # torch is imported only for SymInts: importing moejit must not import it.
    return not all(isinstance(v, int) for v in values)


def _max(a, b):
    if not _symbolic(a, b):
        return max(a, b)
    import torch
    return torch.sym_max(a, b)


def _min(a, b):
    if not _symbolic(a, b):
        return min(a, b)
    import torch
    return torch.sym_min(a, b)


def _ite(condition, then, otherwise):
    if not _symbolic(condition):
        return then if condition else otherwise
    import torch
    return torch.sym_ite(condition, then, otherwise)


def _aligned(nbytes):
    return (nbytes + _ALIGN - 1) // _ALIGN * _ALIGN


def _covers(block_m, per_expert):
    """A uniform router gives an expert about per_expert +- sqrt(per_expert) rows: the tile covers
    the mean plus two spreads, as token_block_m() in role_traits.cpp tests it."""
    return block_m >= per_expert and (block_m - per_expert) ** 2 >= 4 * per_expert


# Past per_expert, (bm - m)^2 - 4m falls as m grows: a tile covers exactly the per_expert up to
# these (9, 22 and 49 rows), so the tile is a sum of comparisons of T, with no guard on it.
_MOST_COVERED = {bm: max(m for m in range(bm + 1) if _covers(bm, m)) for bm in (16, 32, 64)}


def token_block_m(pairs, experts):
    """The smallest of 16, 32, 64 covering the mean rows per expert, else 128: 16, plus the step to
    the next tile for each of 16, 32, 64 that does not cover."""
    per_expert = (pairs + experts - 1) // _max(1, experts)
    return 16 + sum(_ite(per_expert > most, bm, 0) for bm, most in _MOST_COVERED.items())


def routing_bytes(pairs, experts):
    max_tiles = _max(1, pairs // token_block_m(pairs, experts) + _min(experts, pairs))
    max_chunks = _max(1, (pairs + _ROUTING_MIN_CHUNK - 1) // _ROUTING_MIN_CHUNK)
    int32_arrays = ((experts + 1) * max_chunks, experts + 1, experts + 2, experts + 1, max_tiles, max_tiles,
                    _max(pairs, 1), _max(pairs, 1), 4 * experts)
    return sum(_aligned(4 * n) for n in int32_arrays)


def saved_bytes(tokens, experts, intermediate, topk, inference):
    """Routing arrays, pre_act [T*K, 2I] and the state's stamp in the training modes; nothing in
    inference."""
    if inference:
        return 0
    pairs = tokens * topk
    return _aligned(routing_bytes(pairs, experts)) + _aligned(pairs * 2 * intermediate * _ELEMENT_BYTES) + _STAMP_BYTES
