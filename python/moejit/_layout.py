"""The size of the library's saved state (moejit_problem_memory's saved_bytes) as arithmetic.

PyTorch's fake tensors need that size when a dimension is symbolic (torch.compile with dynamic
shapes), where the library's host function cannot be called. The same function of ints works on
torch SymInts: its comparisons become guards (a recompile when T crosses a token-tile bucket),
the rest stays an expression of T. It mirrors memory_layout() and routing_layout() in src/moe/
and token_block_m() in tuner/role_traits.cpp; python/tests/test_library.py checks it against the
library, and inductor asserts the real `saved` has this size.
"""

_ALIGN = 256  # every region of the layout starts on a 256-byte boundary
_ROUTING_MIN_CHUNK = 512  # kRoutingMinChunk
_ELEMENT_BYTES = 2  # bf16 and fp16


def _aligned(nbytes):
    return (nbytes + _ALIGN - 1) // _ALIGN * _ALIGN


def token_block_m(pairs, experts):
    per_expert = (pairs + experts - 1) // max(1, experts)
    block_m = 16
    while not (block_m >= per_expert and (block_m - per_expert) ** 2 >= 4 * per_expert) and block_m < 128:
        block_m *= 2
    return block_m


def routing_bytes(pairs, experts):
    max_tiles = max(1, pairs // token_block_m(pairs, experts) + min(experts, pairs))
    max_chunks = max(1, (pairs + _ROUTING_MIN_CHUNK - 1) // _ROUTING_MIN_CHUNK)
    int32_arrays = ((experts + 1) * max_chunks, experts + 1, experts + 2, experts + 1, max_tiles, max_tiles,
                    max(pairs, 1), max(pairs, 1), 4 * experts)
    return sum(_aligned(4 * n) for n in int32_arrays)


def saved_bytes(tokens, experts, intermediate, topk, inference):
    """Routing arrays and pre_act [T*K, 2I] in the training modes; nothing in inference."""
    if inference:
        return 0
    pairs = tokens * topk
    return _aligned(routing_bytes(pairs, experts)) + _aligned(pairs * 2 * intermediate * _ELEMENT_BYTES)
