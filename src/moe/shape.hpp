// The dimensions of one fused-MoE problem (DESIGN.md: x [T,H], W1 [E,2I,H], W2 [E,H,I], top-K).
#pragma once

#include "moejit/moejit.hpp"
#include "moejit/types.hpp"

namespace moejit {

struct MoeShape {
  long long tokens = 0;   // T
  int experts = 0;        // E
  int hidden = 0;         // H
  int intermediate = 0;   // I
  int topk = 0;           // K
  DType dtype = DType::kBF16;

  long long pairs() const { return tokens * topk; }  // T*K
  // H and I multiples of 8: every row the kernels touch is 16-byte aligned (vector paths, TMA).
  bool vector_aligned() const { return hidden % 8 == 0 && intermediate % 8 == 0; }
};

// A problem's dimensions (without its mode).
inline MoeShape shape_of(const MoeProblem& p) {
  return {p.tokens, p.experts, p.hidden, p.intermediate, p.topk, p.dtype};
}

}  // namespace moejit
