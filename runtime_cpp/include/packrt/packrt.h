/* packrt: the C API of the packager runtime.
 *
 * Open a package folder, ask for its inputs/outputs, run it on caller buffers, close it.
 * No Python, no TVM: the package's kernels are plain shared objects with a C entry point.
 *
 *   packrt_options opt; packrt_options_init(&opt); opt.num_threads = 4;
 *   packrt_model* m = NULL;
 *   if (packrt_open("dist/cnn", &opt, &m) != PACKRT_OK) { puts(packrt_last_error()); return 1; }
 *   packrt_tensor in = {"image", data, PACKRT_FLOAT32, 4, {1, 3, 64, 64}, nbytes};
 *   packrt_tensor out = {"logits", outbuf, PACKRT_FLOAT32, 0, {0}, outbuf_bytes};
 *   packrt_run(m, &in, 1, &out, 1);      // out.ndim/out.shape are filled in
 *   packrt_close(m);
 *
 * Thread safety: one model may be run from several threads at once; each concurrent run
 * gets its own scratch memory. Error messages are per thread (packrt_last_error).
 * Buffers: any alignment works; 64-byte aligned buffers are used without a copy.
 *
 * CUDA targets (kernels.fatbin) run through the same calls: packrt_run takes host buffers and
 * copies them to and from the GPU; packrt_run_device takes CUDA device pointers. libcuda.so.1 is
 * opened at run time, so this library has no CUDA dependency; without a driver, opening a CUDA
 * target fails with "no CUDA driver ...". Runs of one CUDA model are serialized.
 */
#ifndef PACKRT_PACKRT_H_
#define PACKRT_PACKRT_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define PACKRT_API __declspec(dllexport)
#else
#define PACKRT_API __attribute__((visibility("default")))
#endif

#define PACKRT_ABI_VERSION 1
#define PACKRT_MAX_DIMS 8
#define PACKRT_MAX_THREADS 1024 /* num_threads above this is refused: a typo or an attack, not a machine */

typedef enum packrt_status {
  PACKRT_OK = 0,
  PACKRT_ERROR_INVALID_ARGUMENT = 1, /* wrong shape/dtype/name/count, bad option */
  PACKRT_ERROR_NOT_FOUND = 2,        /* package folder or file missing */
  PACKRT_ERROR_CORRUPT_PACKAGE = 3,  /* bad manifest/plan, size or checksum mismatch */
  PACKRT_ERROR_UNSUPPORTED = 4,      /* no target for this CPU, unknown format version */
  PACKRT_ERROR_RUNTIME = 5           /* a kernel failed, out of memory */
} packrt_status;

typedef enum packrt_dtype {
  PACKRT_DTYPE_UNKNOWN = 0,
  PACKRT_FLOAT32 = 1,
  PACKRT_FLOAT16 = 2,
  PACKRT_FLOAT64 = 3,
  PACKRT_INT8 = 4,
  PACKRT_INT16 = 5,
  PACKRT_INT32 = 6,
  PACKRT_INT64 = 7,
  PACKRT_UINT8 = 8,
  PACKRT_BOOL = 9,
  PACKRT_UINT16 = 10 /* bf16 bits between a package's own kernels */
} packrt_dtype;

/* Where a target runs. packrt_options.device_type restricts target selection to one kind;
 * PACKRT_DEVICE_ANY (the default) takes the first target that runs here, in package order. */
typedef enum packrt_device_type {
  PACKRT_DEVICE_ANY = 0,
  PACKRT_DEVICE_CPU = 1,
  PACKRT_DEVICE_CUDA = 2
} packrt_device_type;

typedef struct packrt_options {
  uint32_t struct_size;      /* set by packrt_options_init; lets the struct grow compatibly */
  const char* target;        /* NULL: the first target in the package that runs on this CPU */
  int32_t num_threads;       /* 0: all cores; at most PACKRT_MAX_THREADS */
  int32_t verify_checksums;  /* 1 (default): check sha256 of every file used; 0: sizes only */
  int32_t device_type;       /* packrt_device_type, used with target NULL: ANY (default), CPU only or CUDA only */
  int32_t cuda_device;       /* CUDA device ordinal for CUDA targets (default 0) */
  int32_t cuda_graph;        /* 1: after a profile's first packrt_run, replay its kernels as a CUDA graph */
  const char* expected_sha256; /* NULL: any package. Else the sha256 (64 hex digits; anything else, the
                                  empty string included, is refused) its manifest.json must have: pins one
                                  build (the manifest lists every file's sha256), and every file the run
                                  uses is then checked whatever verify_checksums says */
} packrt_options;

/* A tensor passed to or from packrt_run, also used to describe inputs/outputs.
 * name: matched against the model's names; NULL means "by position".
 * nbytes: the size of `data` (for outputs: capacity; must be at least the output's size). */
typedef struct packrt_tensor {
  const char* name;
  void* data;
  int32_t dtype; /* packrt_dtype */
  int32_t ndim;
  int64_t shape[PACKRT_MAX_DIMS];
  uint64_t nbytes;
} packrt_tensor;

typedef struct packrt_model packrt_model;

PACKRT_API const char* packrt_version(void);
PACKRT_API void packrt_options_init(packrt_options* options);

/* Opens a package folder. On failure *model is NULL and packrt_last_error() says why. */
PACKRT_API packrt_status packrt_open(const char* package_dir, const packrt_options* options,
                                     packrt_model** model);
PACKRT_API void packrt_close(packrt_model* model);

/* The calling thread's last error message ("" if none). Valid until the next call on this thread. */
PACKRT_API const char* packrt_last_error(void);

PACKRT_API const char* packrt_model_name(const packrt_model* model);
/* The package's identity (manifest "id"): lets a loader check it opened the package it meant. */
PACKRT_API const char* packrt_model_id(const packrt_model* model);
/* sha256 of the package's manifest.json (64 hex digits): the value expected_sha256 pins. */
PACKRT_API const char* packrt_manifest_sha256(const packrt_model* model);
PACKRT_API const char* packrt_model_target(const packrt_model* model);
/* "cpu" or "cuda": where the opened target runs. */
PACKRT_API const char* packrt_model_device(const packrt_model* model);
PACKRT_API int32_t packrt_num_threads(const packrt_model* model);
PACKRT_API int32_t packrt_num_profiles(const packrt_model* model);
PACKRT_API const char* packrt_profile_name(const packrt_model* model, int32_t profile);
PACKRT_API int32_t packrt_num_inputs(const packrt_model* model);
PACKRT_API int32_t packrt_num_outputs(const packrt_model* model);

/* Describes input/output `index` under `profile` (name, dtype, ndim, shape, nbytes; data = NULL).
 * The name pointer stays valid until packrt_close. */
PACKRT_API packrt_status packrt_input_info(const packrt_model* model, int32_t profile, int32_t index,
                                           packrt_tensor* info);
PACKRT_API packrt_status packrt_output_info(const packrt_model* model, int32_t profile, int32_t index,
                                            packrt_tensor* info);

/* The profile whose input shapes equal the given inputs' (matched like packrt_run), e.g. to size
 * output buffers with packrt_output_info before running. */
PACKRT_API packrt_status packrt_select_profile(const packrt_model* model, const packrt_tensor* inputs,
                                               int32_t num_inputs, int32_t* profile);

/* Runs the model. The profile is the one whose input shapes equal the given ones. Inputs and
 * outputs are matched by name (or by position where name is NULL); every input and output
 * must be given exactly once. On success each output's ndim/shape/dtype are filled in. */
PACKRT_API packrt_status packrt_run(packrt_model* model, const packrt_tensor* inputs, int32_t num_inputs,
                                    packrt_tensor* outputs, int32_t num_outputs);

/* Runs a CUDA target on device memory: every input/output `data` is a CUdeviceptr (cast to void*)
 * on the model's CUDA device. The work runs on `cuda_stream` (a CUstream, e.g. ONNX Runtime's compute
 * stream; NULL: the model's own stream), after the work already queued there, and the call returns
 * when the outputs are ready. Fails with PACKRT_ERROR_INVALID_ARGUMENT for CPU targets. */
PACKRT_API packrt_status packrt_run_device(packrt_model* model, const packrt_tensor* inputs, int32_t num_inputs,
                                           packrt_tensor* outputs, int32_t num_outputs, void* cuda_stream);

/* Per-step timing, for finding the kernels that dominate latency. While enabled, every run adds
 * each step's wall time to a per-step total (small overhead: one clock read per step). */
PACKRT_API packrt_status packrt_set_profiling(packrt_model* model, int32_t enabled);
PACKRT_API int32_t packrt_num_steps(const packrt_model* model, int32_t profile);
/* Step `step` of `profile`: its kernel name ("copy" for copies, "assemble" for a concat whose parts
 * were written in place), total milliseconds and run count since profiling was enabled. */
PACKRT_API packrt_status packrt_step_profile(const packrt_model* model, int32_t profile, int32_t step,
                                             const char** kernel, double* total_ms, int64_t* runs);

PACKRT_API const char* packrt_dtype_name(int32_t dtype);
PACKRT_API size_t packrt_dtype_size(int32_t dtype);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* PACKRT_PACKRT_H_ */
