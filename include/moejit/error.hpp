// Typed errors thrown by the moejit host API. Every error carries a code (mirrored by the C ABI)
// and a message that names what went wrong; subclasses carry the details a caller may act on.
#pragma once

#include <stdexcept>
#include <string>

namespace moejit {

enum class ErrorCode : int {
  kOk = 0,
  kInvalidArgument = 1,  // a shape, dtype, alignment, pointer or option the caller passed is wrong
  kNoDevice = 2,         // no CUDA driver or no GPU where one was needed
  kCuda = 3,             // a CUDA driver call failed
  kCompile = 4,          // NVRTC rejected generated source
  kDatabase = 5,         // the tuning database could not be read or written
  kIo = 6,               // a file could not be read or written
  kUnsupported = 7,      // valid request this build or device cannot serve
  kState = 8,            // a call out of order (e.g. a second memory-efficient backward)
  kInternal = 9,         // a bug in moejit
  kOutOfMemory = 10,     // memory ran out: free some or shrink the batch, and retry
};

const char* error_code_name(ErrorCode code) noexcept;

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

class InvalidArgument : public Error {
 public:
  InvalidArgument(std::string argument, const std::string& message)
      : Error(ErrorCode::kInvalidArgument, argument + ": " + message), argument_(std::move(argument)) {}
  const std::string& argument() const noexcept { return argument_; }

 private:
  std::string argument_;
};

class NoDeviceError : public Error {
 public:
  explicit NoDeviceError(const std::string& message) : Error(ErrorCode::kNoDevice, message) {}
};

class CudaError : public Error {
 public:
  CudaError(int result, std::string result_name, const std::string& message)
      : CudaError(ErrorCode::kCuda, result, std::move(result_name), message) {}
  int result() const noexcept { return result_; }
  const std::string& result_name() const noexcept { return result_name_; }

 protected:
  CudaError(ErrorCode code, int result, std::string result_name, const std::string& message)
      : Error(code, message), result_(result), result_name_(std::move(result_name)) {}

 private:
  int result_;
  std::string result_name_;
};

// Device memory ran out (CUDA_ERROR_OUT_OF_MEMORY). Still a CudaError, so handlers of driver
// failures catch it as before; its own type and code let a caller free memory or shrink the batch
// and retry. Host memory running out stays std::bad_alloc in C++; the C ABI reports both as
// MOEJIT_ERROR_OUT_OF_MEMORY.
class OutOfMemoryError : public CudaError {
 public:
  OutOfMemoryError(int result, std::string result_name, const std::string& message)
      : CudaError(ErrorCode::kOutOfMemory, result, std::move(result_name), message) {}
};

class CompileError : public Error {
 public:
  CompileError(const std::string& message, std::string log, std::string source)
      : Error(ErrorCode::kCompile, message), log_(std::move(log)), source_(std::move(source)) {}
  const std::string& log() const noexcept { return log_; }
  const std::string& source() const noexcept { return source_; }

 private:
  std::string log_;
  std::string source_;
};

class DatabaseError : public Error {
 public:
  explicit DatabaseError(const std::string& message) : Error(ErrorCode::kDatabase, message) {}
};

class IoError : public Error {
 public:
  explicit IoError(const std::string& message) : Error(ErrorCode::kIo, message) {}
};

class UnsupportedError : public Error {
 public:
  explicit UnsupportedError(const std::string& message) : Error(ErrorCode::kUnsupported, message) {}
};

class StateError : public Error {
 public:
  explicit StateError(const std::string& message) : Error(ErrorCode::kState, message) {}
};

class InternalError : public Error {
 public:
  explicit InternalError(const std::string& message) : Error(ErrorCode::kInternal, message) {}
};

}  // namespace moejit
