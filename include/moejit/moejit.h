/* moejit C ABI: the fused MoE block over raw device pointers, for Python (ctypes) and other
 * FFIs. Same semantics as include/moejit/moejit.hpp; every call returns a status and never
 * throws or aborts; moejit_last_error() gives the message of this thread's last call if it failed.
 * A CUDA context must be current on the calling thread (the CUDA runtime's primary context,
 * e.g. PyTorch's, works). Streams are CUstream / cudaStream_t passed as void*, NULL for the
 * legacy default stream. A plan is not safe for concurrent calls from several threads; distinct
 * plans are. */
#ifndef MOEJIT_MOEJIT_H_
#define MOEJIT_MOEJIT_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Values never change; new ones are appended: MOEJIT_ERROR_OUT_OF_MEMORY since 0.2.0
 * (moejit_version()). */
typedef enum moejit_status {
  MOEJIT_OK = 0,
  MOEJIT_ERROR_INVALID_ARGUMENT = 1,
  MOEJIT_ERROR_NO_DEVICE = 2,
  MOEJIT_ERROR_CUDA = 3, /* a CUDA driver call failed, other than for memory */
  MOEJIT_ERROR_COMPILE = 4,
  MOEJIT_ERROR_DATABASE = 5,
  MOEJIT_ERROR_IO = 6,
  MOEJIT_ERROR_UNSUPPORTED = 7,
  MOEJIT_ERROR_STATE = 8,
  MOEJIT_ERROR_INTERNAL = 9,
  /* Host or device memory ran out (std::bad_alloc, CUDA_ERROR_OUT_OF_MEMORY; the message says
   * which): a caller may free memory or shrink the batch and try again. */
  MOEJIT_ERROR_OUT_OF_MEMORY = 10
} moejit_status;

enum { MOEJIT_DTYPE_BF16 = 0, MOEJIT_DTYPE_FP16 = 1 };
enum { MOEJIT_MODE_TRAINING = 0, MOEJIT_MODE_INFERENCE = 1, MOEJIT_MODE_MEMORY_EFFICIENT = 2 };

typedef struct moejit_problem {
  int64_t tokens;
  int32_t experts;
  int32_t hidden;
  int32_t intermediate;
  int32_t topk;
  int32_t dtype;             /* MOEJIT_DTYPE_* */
  int32_t mode;              /* MOEJIT_MODE_* */
  /* nonzero: ids outside [0, E), and a token naming one expert twice, are an error of the forward,
   * found after its routing ran: `saved` then holds the rejected call's routing, and a backward
   * over it fails with MOEJIT_ERROR_STATE. */
  int32_t check_expert_ids;
} moejit_problem;

typedef struct moejit_memory_plan {
  size_t saved_bytes;
  size_t forward_workspace_bytes;
  size_t backward_workspace_bytes;
} moejit_memory_plan;

typedef struct moejit_plan moejit_plan;

/* Validates the problem, chooses configs, compiles and loads kernels into the current context.
 * *out is the plan, or NULL when the call fails. */
moejit_status moejit_plan_create(const moejit_problem* problem, moejit_plan** out);
/* The same, naming the stream the plan will run on: while that stream is being captured into a
 * CUDA graph the plan never tunes (it takes the nearest tuned row or the default config), as
 * Options::stream in moejit.hpp. moejit_plan_create checks the legacy default stream. */
moejit_status moejit_plan_create_on_stream(const moejit_problem* problem, void* stream, moejit_plan** out);
void moejit_plan_destroy(moejit_plan* plan);
moejit_status moejit_plan_memory(const moejit_plan* plan, moejit_memory_plan* out);
/* What moejit_plan_memory will report for a plan of this problem, computed on the host: no GPU
 * or context needed (e.g. to size buffers while tracing). Validates the problem's shape like
 * moejit_plan_create (H within gather_sum's grid included, since 0.3.0); a limit that depends on
 * the configs a plan chooses (a GEMM's grid past 2^31 - 1 blocks, README: Limits) is checked only
 * when a plan is created. */
moejit_status moejit_problem_memory(const moejit_problem* problem, moejit_memory_plan* out);

moejit_status moejit_forward(moejit_plan* plan, const void* x, const void* w1, const void* w2,
                             const int32_t* topk_ids, const void* topk_weights, void* out, void* saved,
                             size_t saved_bytes, void* workspace, size_t workspace_bytes, void* stream);

/* dx, dw1, dw2 and d_topk_weights are written, never accumulated into. dw1 also holds an
 * intermediate during the call (written over last; in training mode where T*K <= 2*E*H, in
 * memory-efficient mode unless bwd_dw2 recomputes the activation), so like every output it must
 * not overlap another argument. dw1 and dw2 both NULL (frozen experts): neither weight gradient
 * is computed, and the call runs only what dx and d_topk_weights need; one NULL alone is
 * MOEJIT_ERROR_INVALID_ARGUMENT. topk_ids is never read (the routing comes from `saved`), so it may
 * be NULL; x may be NULL when dw1 and dw2 are (only the weight gradients read it), so a caller
 * need not keep either alive until backward (both since 0.2.0). Given, each is checked like the
 * forward's.
 * MOEJIT_ERROR_STATE for a `saved` no forward of this process wrote (since
 * 0.2.0: its routing tables would send the kernels' reads and writes anywhere), one a forward
 * stopped in part-way, one a memory-efficient backward consumed, one another problem's forward
 * wrote last, or (since 0.3.0) one a later call wrote over in part, or one written in another
 * CUDA context than the plan's, e.g. before a reset (FusedMoe::backward in moejit.hpp). */
moejit_status moejit_backward(moejit_plan* plan, const void* d_out, const void* x, const void* w1, const void* w2,
                              const int32_t* topk_ids, const void* topk_weights, void* saved, size_t saved_bytes,
                              void* dx, void* dw1, void* dw2, void* d_topk_weights, void* workspace,
                              size_t workspace_bytes, void* stream);

/* FusedMoe::adopt_saved (moejit.hpp): `saved` holds a state a forward of this plan's problem
 * completed, copied there afterwards (offloaded to the host and brought back, or from another
 * process). Required before moejit_backward takes a state at an address its forward did not
 * write; the first backward over it (outside a graph capture) checks the stamp its forward wrote
 * and refuses another problem's state, or none, with MOEJIT_ERROR_STATE. */
moejit_status moejit_plan_adopt_saved(moejit_plan* plan, const void* saved);

/* Sets one of the library's settings, the MOEJIT_* variables (README, "Environment variables"),
 * for this process in place of the environment, as moejit::set_option (moejit.hpp): `name` is
 * "MOEJIT_DB" or "DB"; `value` NULL (or "") unsets it, so its default applies whatever the
 * environment holds. Applies where the setting is next read (plans already built keep their
 * kernels). Thread-safe, and unlike setenv safe while other threads build plans: the process
 * environment is left alone. MOEJIT_ERROR_INVALID_ARGUMENT for an unknown name (the message
 * lists the known ones) or a value the setting's reader refuses (MOEJIT_AUTOTUNE=off). Since
 * 0.3.0. */
moejit_status moejit_set_option(const char* name, const char* value);
/* Drops moejit_set_option's setting of `name`: the environment variable applies again. Since
 * 0.3.0. */
moejit_status moejit_clear_option(const char* name);

/* The message of this thread's last call if it failed, "" if it succeeded; valid until this
 * thread's next call. */
const char* moejit_last_error(void);
/* "ok", "invalid_argument", ..., "out_of_memory"; "unknown" for a value this build lacks. */
const char* moejit_status_name(moejit_status status);
const char* moejit_version(void);

#ifdef __cplusplus
}
#endif

#endif /* MOEJIT_MOEJIT_H_ */
