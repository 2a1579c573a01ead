/* Concurrent C API calls on one package, for ThreadSanitizer (tests/runtime_cpp/test_tsan.py).
 *
 *   concurrent_runs PKG INPUTS.raw THREADS RUNS OPENERS OPENS
 *
 * INPUTS.raw: the bytes of every input of the package's first profile, in input order, back to back.
 * Phase 1: one model (num_threads 2) is run once on this thread for the expected outputs; then
 *   THREADS threads each run it RUNS times with their own input and output buffers (odd threads
 *   use buffers 4 bytes off 64-byte alignment, which the runtime stages through the arena; even
 *   threads 64-byte aligned ones, used in place), while one more thread turns per-step profiling
 *   on and off and reads the step times. Every output must equal the expected one bitwise.
 * Phase 2: OPENERS threads each open the same package OPENS times (num_threads 2), run it once,
 *   check the outputs and close it, all at once.
 * Prints one summary line ("concurrent_runs ok: ...") and exits 0, or says what failed and exits 1. */
#define _POSIX_C_SOURCE 200809L
#include <packrt/packrt.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { MAX_IO = 16, ALIGN = 64 };

static const char* g_pkg;
static packrt_model* g_model;
static int g_runs, g_opens, g_num_in, g_num_out;
static packrt_tensor g_in_info[MAX_IO], g_out_info[MAX_IO];
static unsigned char* g_inputs;              /* every input, back to back */
static size_t g_in_offset[MAX_IO];
static unsigned char* g_expected[MAX_IO];
static atomic_int g_stop_profiling;

static void die(const char* what, const char* detail) {
  fprintf(stderr, "concurrent_runs: FAILED: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
  exit(1);
}

static void* xmalloc(size_t n) {
  void* p = malloc(n ? n : 1);
  if (!p) die("out of memory", NULL);
  return p;
}

/* A thread's own buffers: copies of the inputs and room for the outputs, `skew` bytes past a
 * 64-byte boundary. */
typedef struct Buffers {
  void* in_block[MAX_IO];
  void* out_block[MAX_IO];
  packrt_tensor in[MAX_IO], out[MAX_IO];
} Buffers;

static void buffers_init(Buffers* b, size_t skew) {
  for (int k = 0; k < g_num_in; ++k) {
    b->in_block[k] = aligned_alloc(ALIGN, (g_in_info[k].nbytes + skew + ALIGN) / ALIGN * ALIGN);
    if (!b->in_block[k]) die("out of memory", NULL);
    unsigned char* data = (unsigned char*)b->in_block[k] + skew;
    memcpy(data, g_inputs + g_in_offset[k], g_in_info[k].nbytes);
    b->in[k] = g_in_info[k];               /* name, dtype, shape, nbytes */
    b->in[k].data = data;
  }
  for (int k = 0; k < g_num_out; ++k) {
    b->out_block[k] = aligned_alloc(ALIGN, (g_out_info[k].nbytes + skew + ALIGN) / ALIGN * ALIGN);
    if (!b->out_block[k]) die("out of memory", NULL);
    memset(&b->out[k], 0, sizeof b->out[k]);
    b->out[k].name = g_out_info[k].name;
    b->out[k].data = (unsigned char*)b->out_block[k] + skew;
    b->out[k].nbytes = g_out_info[k].nbytes;
  }
}

static void buffers_free(Buffers* b) {
  for (int k = 0; k < g_num_in; ++k) free(b->in_block[k]);
  for (int k = 0; k < g_num_out; ++k) free(b->out_block[k]);
}

/* Runs `m` on `b`; 0 if the outputs equal the expected ones bitwise. On failure `why` says what. */
static int run_and_check(packrt_model* m, Buffers* b, char* why, size_t why_size) {
  for (int k = 0; k < g_num_out; ++k) memset(b->out[k].data, 0xA5, b->out[k].nbytes);  /* no stale results */
  if (packrt_run(m, b->in, g_num_in, b->out, g_num_out) != PACKRT_OK) {
    snprintf(why, why_size, "packrt_run: %s", packrt_last_error());
    return 1;
  }
  for (int k = 0; k < g_num_out; ++k)
    if (memcmp(b->out[k].data, g_expected[k], g_out_info[k].nbytes) != 0) {
      snprintf(why, why_size, "output '%s' differs from the first run's", g_out_info[k].name);
      return 1;
    }
  return 0;
}

typedef struct Job {
  int id;
  char why[512];
} Job;

static void* runner(void* arg) {
  Job* job = (Job*)arg;
  Buffers b;
  buffers_init(&b, job->id % 2 ? 4 : 0);
  int rc = 0;
  for (int i = 0; i < g_runs && !rc; ++i) rc = run_and_check(g_model, &b, job->why, sizeof job->why);
  buffers_free(&b);
  return rc ? job : NULL;
}

static void* opener(void* arg) {
  Job* job = (Job*)arg;
  packrt_options opt;
  packrt_options_init(&opt);
  opt.num_threads = 2;
  Buffers b;
  buffers_init(&b, job->id % 2 ? 4 : 0);
  int rc = 0;
  for (int i = 0; i < g_opens && !rc; ++i) {
    packrt_model* m = NULL;
    if (packrt_open(g_pkg, &opt, &m) != PACKRT_OK) {
      snprintf(job->why, sizeof job->why, "packrt_open: %s", packrt_last_error());
      rc = 1;
      break;
    }
    rc = run_and_check(m, &b, job->why, sizeof job->why);
    packrt_close(m);
  }
  buffers_free(&b);
  return rc ? job : NULL;
}

/* A thread beside the runners: profiling on and off, reading the step times, until they are done.
 * Counts its rounds in *(int*)arg. */
static void* profile_toggles(void* arg) {
  int toggles = 0;
  struct timespec pause = {0, 2 * 1000 * 1000};
  while (!atomic_load(&g_stop_profiling)) {
    if (packrt_set_profiling(g_model, toggles % 2 == 0) != PACKRT_OK) die("packrt_set_profiling", packrt_last_error());
    for (int s = 0; s < packrt_num_steps(g_model, 0); ++s) {
      const char* kernel;
      double ms;
      int64_t runs;
      if (packrt_step_profile(g_model, 0, s, &kernel, &ms, &runs) != PACKRT_OK)
        die("packrt_step_profile", packrt_last_error());
      if (ms < 0 || runs < 0) die("packrt_step_profile", "negative time or run count");
    }
    ++toggles;
    nanosleep(&pause, NULL);
  }
  packrt_set_profiling(g_model, 0);
  *(int*)arg = toggles;
  return NULL;
}

static void start_all(int n, void* (*fn)(void*), pthread_t* th, Job* jobs) {
  for (int i = 0; i < n; ++i) {
    jobs[i].id = i;
    jobs[i].why[0] = 0;
    if (pthread_create(&th[i], NULL, fn, &jobs[i]) != 0) die("pthread_create", NULL);
  }
}

static void join_all(int n, pthread_t* th, const char* what) {
  for (int i = 0; i < n; ++i) {
    void* rc;
    pthread_join(th[i], &rc);
    if (rc) {
      char msg[600];
      snprintf(msg, sizeof msg, "%s thread %d", what, ((Job*)rc)->id);
      die(msg, ((Job*)rc)->why);
    }
  }
}

static double seconds_since(const struct timespec* t0) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)(t.tv_sec - t0->tv_sec) + (double)(t.tv_nsec - t0->tv_nsec) * 1e-9;
}

int main(int argc, char** argv) {
  if (argc != 7) die("usage", "concurrent_runs PKG INPUTS.raw THREADS RUNS OPENERS OPENS");
  g_pkg = argv[1];
  int threads = atoi(argv[3]), openers = atoi(argv[5]);
  g_runs = atoi(argv[4]);
  g_opens = atoi(argv[6]);
  if (threads < 1 || g_runs < 1 || openers < 0 || g_opens < 0) die("usage", "counts must be positive");

  packrt_options opt;
  packrt_options_init(&opt);
  opt.num_threads = 2;
  if (packrt_open(g_pkg, &opt, &g_model) != PACKRT_OK) die("packrt_open", packrt_last_error());
  g_num_in = packrt_num_inputs(g_model);
  g_num_out = packrt_num_outputs(g_model);
  if (g_num_in > MAX_IO || g_num_out > MAX_IO) die("too many inputs or outputs", NULL);
  size_t total = 0;
  for (int k = 0; k < g_num_in; ++k) {
    if (packrt_input_info(g_model, 0, k, &g_in_info[k]) != PACKRT_OK) die("packrt_input_info", packrt_last_error());
    g_in_offset[k] = total;
    total += g_in_info[k].nbytes;
  }
  for (int k = 0; k < g_num_out; ++k)
    if (packrt_output_info(g_model, 0, k, &g_out_info[k]) != PACKRT_OK) die("packrt_output_info", packrt_last_error());

  g_inputs = xmalloc(total + 1);
  FILE* f = fopen(argv[2], "rb");
  if (!f) die("cannot open", argv[2]);
  size_t got = fread(g_inputs, 1, total + 1, f);
  fclose(f);
  if (got != total) die("the inputs file does not hold the first profile's inputs, back to back", argv[2]);

  /* The expected outputs: one run on this thread before any other. */
  Buffers first;
  buffers_init(&first, 0);
  for (int k = 0; k < g_num_out; ++k) memset(first.out[k].data, 0, first.out[k].nbytes);
  if (packrt_run(g_model, first.in, g_num_in, first.out, g_num_out) != PACKRT_OK) die("first packrt_run", packrt_last_error());
  for (int k = 0; k < g_num_out; ++k) {
    g_expected[k] = xmalloc(g_out_info[k].nbytes);
    memcpy(g_expected[k], first.out[k].data, g_out_info[k].nbytes);
  }
  buffers_free(&first);

  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  pthread_t* th = xmalloc(sizeof(pthread_t) * (size_t)(threads > openers ? threads : openers));
  Job* jobs = xmalloc(sizeof(Job) * (size_t)(threads > openers ? threads : openers));
  pthread_t profiler;
  int toggles = 0;
  if (pthread_create(&profiler, NULL, profile_toggles, &toggles) != 0) die("pthread_create", NULL);
  start_all(threads, runner, th, jobs);
  join_all(threads, th, "runner");
  atomic_store(&g_stop_profiling, 1);
  pthread_join(profiler, NULL);
  double phase1 = seconds_since(&t0);

  clock_gettime(CLOCK_MONOTONIC, &t0);
  start_all(openers, opener, th, jobs);
  join_all(openers, th, "opener");
  double phase2 = seconds_since(&t0);

  packrt_close(g_model);
  printf("concurrent_runs ok: %d threads x %d runs identical (%.1f s, profiling toggled %d times); "
         "%d threads x %d open/run/close (%.1f s)\n", threads, g_runs, phase1, toggles, openers, g_opens, phase2);
  free(th);
  free(jobs);
  for (int k = 0; k < g_num_out; ++k) free(g_expected[k]);
  free(g_inputs);
  return 0;
}
