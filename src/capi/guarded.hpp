// The C ABI's exception boundary: an exception becomes the call's status and this thread's last
// error message. A header of its own so unit tests can throw through it what no call can be made
// to throw without a GPU (host or device memory running out).
#pragma once

#include <exception>
#include <new>

#include "moejit/error.hpp"
#include "moejit/moejit.h"

namespace moejit::capi {

// ErrorCode mirrors moejit_status value for value: guarded casts one to the other.
static_assert(static_cast<int>(ErrorCode::kInternal) == MOEJIT_ERROR_INTERNAL);
static_assert(static_cast<int>(ErrorCode::kOutOfMemory) == MOEJIT_ERROR_OUT_OF_MEMORY);

void clear_error() noexcept;
void set_error(const char* message) noexcept;

template <typename F>
moejit_status guarded(F&& f) noexcept {
  try {
    clear_error();
    f();
    return MOEJIT_OK;
  } catch (const Error& e) {
    set_error(e.what());
    return static_cast<moejit_status>(e.code());
  } catch (const std::bad_alloc&) {
    // Host memory, reported like the device's: a caller's response (free memory, a smaller
    // batch) is the same.
    set_error("out of host memory");
    return MOEJIT_ERROR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    set_error(e.what());
    return MOEJIT_ERROR_INTERNAL;
  } catch (...) {
    set_error("unknown error");
    return MOEJIT_ERROR_INTERNAL;
  }
}

}  // namespace moejit::capi
