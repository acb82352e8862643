// Driver entry points that only the tests call (the library loads just those it uses).
#pragma once

namespace moejit::test {

// The CUDA driver's entry point `name` (cuda.h's versioned name, e.g. "cuMemAlloc_v2"), or null
// where this driver lacks it. Loads the library's driver first: throws NoDeviceError without one.
void* driver_symbol(const char* name);

}  // namespace moejit::test

// The symbol name cuda.h's versioning macros give `name`, as src/cuda/driver.cpp spells it.
#define MOEJIT_TEST_SYMBOL_TEXT(name) #name
#define MOEJIT_TEST_SYMBOL(name) MOEJIT_TEST_SYMBOL_TEXT(name)
