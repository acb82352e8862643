/* Compiled as C: the public C header must be valid C and link against the library. */
#include "moejit/moejit.h"

const char* moejit_c_abi_version_from_c(void) {
  moejit_memory_plan m = {0, 0, 0};
  (void)m;
  return moejit_version();
}

int moejit_c_abi_out_of_memory_from_c(void) { return MOEJIT_ERROR_OUT_OF_MEMORY; }

int moejit_c_abi_set_option_from_c(const char* name, const char* value) {
  const moejit_status s = moejit_set_option(name, value);
  return s != MOEJIT_OK ? s : moejit_clear_option(name);
}
