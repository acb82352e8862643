#include "moejit/error.hpp"

namespace moejit {

const char* error_code_name(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::kOk: return "ok";
    case ErrorCode::kInvalidArgument: return "invalid_argument";
    case ErrorCode::kNoDevice: return "no_device";
    case ErrorCode::kCuda: return "cuda";
    case ErrorCode::kCompile: return "compile";
    case ErrorCode::kDatabase: return "database";
    case ErrorCode::kIo: return "io";
    case ErrorCode::kUnsupported: return "unsupported";
    case ErrorCode::kState: return "state";
    case ErrorCode::kInternal: return "internal";
    case ErrorCode::kOutOfMemory: return "out_of_memory";
  }
  return "unknown";
}

}  // namespace moejit
