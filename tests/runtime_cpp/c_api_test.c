/* Drives the packrt C API the way a C deployment would, and checks its error paths.
 *   c_api_test PKG INPUT.raw OUTPUT.raw    (float32 CNN sample: image [1,3,64,64] -> logits [1,10])
 * Prints one "ok ..." line per check; exits non-zero on the first failed check. */
#include <packrt/packrt.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(cond, ...)                                    \
  do {                                                      \
    if (!(cond)) {                                          \
      fprintf(stderr, "FAILED %s:%d: ", __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                         \
      fprintf(stderr, "\n");                                \
      exit(1);                                              \
    }                                                       \
  } while (0)

enum { N_IN = 3 * 64 * 64, N_OUT = 10, THREADS = 4, RUNS = 50 };

static packrt_model* g_model;
static float* g_input;
static float g_expected[N_OUT];

static packrt_tensor input_tensor(float* data) {
  packrt_tensor t;
  memset(&t, 0, sizeof t);
  t.name = "image";
  t.data = data;
  t.dtype = PACKRT_FLOAT32;
  t.ndim = 4;
  t.shape[0] = 1; t.shape[1] = 3; t.shape[2] = 64; t.shape[3] = 64;
  t.nbytes = sizeof(float) * N_IN;
  return t;
}

static packrt_tensor output_tensor(float* data, uint64_t nbytes) {
  packrt_tensor t;
  memset(&t, 0, sizeof t);
  t.name = "logits";
  t.data = data;
  t.nbytes = nbytes;
  return t;
}

static void* worker(void* arg) {
  (void)arg;
  float out[N_OUT];
  for (int i = 0; i < RUNS; ++i) {
    packrt_tensor in = input_tensor(g_input), o = output_tensor(out, sizeof out);
    if (packrt_run(g_model, &in, 1, &o, 1) != PACKRT_OK) return (void*)1;
    if (memcmp(out, g_expected, sizeof out) != 0) return (void*)2;
  }
  return NULL;
}

int main(int argc, char** argv) {
  CHECK(argc == 4, "usage: c_api_test PKG INPUT.raw OUTPUT.raw");
  packrt_options opt;
  packrt_options_init(&opt);
  opt.num_threads = 2;

  packrt_model* bad = (packrt_model*)1;
  CHECK(packrt_open("/nonexistent/pkg", &opt, &bad) == PACKRT_ERROR_NOT_FOUND && bad == NULL, "open missing");
  CHECK(strstr(packrt_last_error(), "package folder not found") != NULL, "msg: %s", packrt_last_error());
  printf("ok missing package -> NOT_FOUND: %s\n", packrt_last_error());

  opt.target = "no-such-target";
  CHECK(packrt_open(argv[1], &opt, &bad) == PACKRT_ERROR_INVALID_ARGUMENT, "open bad target");
  printf("ok unknown target -> INVALID_ARGUMENT: %s\n", packrt_last_error());
  opt.target = NULL;
  opt.device_type = PACKRT_DEVICE_CUDA; /* CUDA targets only: this package has none */
  CHECK(packrt_open(argv[1], &opt, &bad) == PACKRT_ERROR_UNSUPPORTED && bad == NULL, "open CUDA-only");
  CHECK(strstr(packrt_last_error(), "CUDA targets were asked for"), "msg: %s", packrt_last_error());
  printf("ok device_type CUDA on a CPU package -> UNSUPPORTED: %s\n", packrt_last_error());
  opt.device_type = PACKRT_DEVICE_ANY;
  opt.target = NULL;
  opt.expected_sha256 = ""; /* an empty pin is refused like any other that is not 64 hex digits */
  CHECK(packrt_open(argv[1], &opt, &bad) == PACKRT_ERROR_INVALID_ARGUMENT && bad == NULL, "open empty pin");
  CHECK(strstr(packrt_last_error(), "is not 64 hex digits"), "msg: %s", packrt_last_error());
  printf("ok empty expected_sha256 -> INVALID_ARGUMENT: %s\n", packrt_last_error());
  opt.expected_sha256 = NULL;

  CHECK(packrt_open(argv[1], &opt, &g_model) == PACKRT_OK, "open: %s", packrt_last_error());
  CHECK(strcmp(packrt_model_name(g_model), "cnn") == 0, "name");
  CHECK(packrt_num_threads(g_model) == 2, "threads");
  CHECK(packrt_num_inputs(g_model) == 1 && packrt_num_outputs(g_model) == 1, "io counts");
  packrt_tensor info;
  CHECK(packrt_input_info(g_model, 0, 0, &info) == PACKRT_OK, "input info");
  CHECK(strcmp(info.name, "image") == 0 && info.dtype == PACKRT_FLOAT32 && info.ndim == 4 && info.shape[3] == 64 &&
            info.nbytes == sizeof(float) * N_IN, "input info values");
  CHECK(packrt_output_info(g_model, 0, 0, &info) == PACKRT_OK && info.nbytes == sizeof(float) * N_OUT, "output info");
  CHECK(packrt_input_info(g_model, 0, 5, &info) == PACKRT_ERROR_INVALID_ARGUMENT, "info index range");
  printf("ok opened target %s, %d profile(s)\n", packrt_model_target(g_model), packrt_num_profiles(g_model));

  /* An unaligned input buffer (staged through the arena) must give the same result. */
  char* raw = malloc(sizeof(float) * N_IN + 64);
  g_input = (float*)(raw + 4);
  FILE* f = fopen(argv[2], "rb");
  CHECK(f && fread(g_input, sizeof(float), N_IN, f) == N_IN, "read input");
  fclose(f);
  float out[N_OUT];
  packrt_tensor in = input_tensor(g_input), o = output_tensor(out, sizeof out);
  CHECK(packrt_run(g_model, &in, 1, &o, 1) == PACKRT_OK, "run: %s", packrt_last_error());
  CHECK(o.dtype == PACKRT_FLOAT32 && o.ndim == 2 && o.shape[0] == 1 && o.shape[1] == 10, "output shape filled in");
  memcpy(g_expected, out, sizeof out);
  f = fopen(argv[3], "wb");
  CHECK(f && fwrite(out, sizeof(float), N_OUT, f) == N_OUT, "write output");
  fclose(f);
  printf("ok run (unaligned input)\n");

  /* A CPU target: device runs are refused, the device is reported. */
  CHECK(strcmp(packrt_model_device(g_model), "cpu") == 0, "device");
  CHECK(packrt_run_device(g_model, &in, 1, &o, 1, NULL) == PACKRT_ERROR_INVALID_ARGUMENT, "device run on a CPU target");
  CHECK(strstr(packrt_last_error(), "runs on the CPU"), "msg: %s", packrt_last_error());
  printf("ok packrt_run_device on a CPU target -> %s\n", packrt_last_error());

  /* Positional binding (name = NULL) works too. */
  in.name = NULL;
  o.name = NULL;
  CHECK(packrt_run(g_model, &in, 1, &o, 1) == PACKRT_OK && memcmp(out, g_expected, sizeof out) == 0, "positional");
  printf("ok positional binding\n");

  /* Wrong shape, dtype, name, count, capacity: clear errors, and the model stays usable. */
  in = input_tensor(g_input);
  in.shape[2] = 32;
  CHECK(packrt_run(g_model, &in, 1, &o, 1) == PACKRT_ERROR_INVALID_ARGUMENT, "wrong shape accepted");
  CHECK(strstr(packrt_last_error(), "image[1,3,32,64]") && strstr(packrt_last_error(), "match no profile"), "msg: %s",
        packrt_last_error());
  printf("ok wrong shape -> %s\n", packrt_last_error());
  in = input_tensor(g_input);
  in.dtype = PACKRT_FLOAT64;
  CHECK(packrt_run(g_model, &in, 1, &o, 1) == PACKRT_ERROR_INVALID_ARGUMENT, "wrong dtype accepted");
  CHECK(strstr(packrt_last_error(), "'image' has dtype float64, the model expects float32"), "msg: %s",
        packrt_last_error());
  printf("ok wrong dtype -> %s\n", packrt_last_error());
  in = input_tensor(g_input);
  in.name = "img";
  CHECK(packrt_run(g_model, &in, 1, &o, 1) == PACKRT_ERROR_INVALID_ARGUMENT && strstr(packrt_last_error(), "'img'"),
        "unknown name: %s", packrt_last_error());
  in = input_tensor(g_input);
  CHECK(packrt_run(g_model, &in, 0, &o, 1) == PACKRT_ERROR_INVALID_ARGUMENT && strstr(packrt_last_error(), "takes 1 input"),
        "count: %s", packrt_last_error());
  o = output_tensor(out, 8);
  CHECK(packrt_run(g_model, &in, 1, &o, 1) == PACKRT_ERROR_INVALID_ARGUMENT && strstr(packrt_last_error(), "needs 40 bytes"),
        "capacity: %s", packrt_last_error());
  in.nbytes = 100;
  o = output_tensor(out, sizeof out);
  CHECK(packrt_run(g_model, &in, 1, &o, 1) == PACKRT_ERROR_INVALID_ARGUMENT, "short input buffer accepted");
  in = input_tensor(g_input);
  CHECK(packrt_run(g_model, &in, 1, &o, 1) == PACKRT_OK && memcmp(out, g_expected, sizeof out) == 0, "usable after errors");
  printf("ok name/count/capacity errors, model still usable\n");

  /* Several threads on one model: identical results (each run has its own arena). */
  pthread_t th[THREADS];
  for (int i = 0; i < THREADS; ++i) pthread_create(&th[i], NULL, worker, NULL);
  for (int i = 0; i < THREADS; ++i) {
    void* rc;
    pthread_join(th[i], &rc);
    CHECK(rc == NULL, "thread %d failed (%ld)", i, (long)rc);
  }
  printf("ok %d threads x %d runs identical\n", THREADS, RUNS);

  /* Per-step profiling. */
  CHECK(packrt_set_profiling(g_model, 1) == PACKRT_OK, "profiling");
  CHECK(packrt_run(g_model, &in, 1, &o, 1) == PACKRT_OK, "profiled run");
  double total = 0;
  for (int s = 0; s < packrt_num_steps(g_model, 0); ++s) {
    const char* k;
    double ms;
    int64_t runs;
    CHECK(packrt_step_profile(g_model, 0, s, &k, &ms, &runs) == PACKRT_OK && runs == 1 && k[0], "step profile");
    total += ms;
  }
  CHECK(total > 0, "profile total");
  printf("ok profiling: %d steps, %.3f ms\n", packrt_num_steps(g_model, 0), total);

  packrt_close(g_model);
  free(raw);
  printf("ALL OK\n");
  return 0;
}
