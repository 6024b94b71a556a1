/* The process's thread pool for generated kernels' parallel loops (see threadpool/__init__.py for why).
 *
 * A parallel region of T threads is T tasks: task i runs the region's outlined body as OpenMP
 * thread i of T (omp_get_thread_num() = i), so the static schedules gcc computes inline and the
 * per-thread workspace slices keep their meaning. The caller publishes the region, runs task 0
 * itself (so thread 0 is the same core in every region), then claims further tasks from one atomic
 * word (generation | task count | next task) exactly as the workers do, and at the end waits only
 * for tasks a worker has already started. In a region of two tasks a dynamic loop is handed out
 * from both ends (afp_set_workshare says why). A worker that is asleep, or whose vCPU the
 * hypervisor has taken away, joins late or not at all and the caller runs its task: the region
 * never waits for a thread to wake up. libgomp's region cannot end before every
 * team thread has checked in.
 *
 * Workers spin while a region runs and for a while after the last one (kernels of one run are
 * microseconds apart), then sleep on a futex, away from their caller's CPU (afp_sleep_away); the
 * caller wakes sleepers when it publishes and goes on without them.
 *
 * Supported inside a region: static schedules, dynamic (nonmonotonic) worksharing loops with
 * nowait ends, reductions by atomics or GOMP_atomic_start/end. A barrier inside a region cannot be
 * honoured by tasks that may run one after the other on the same thread: it stops the process
 * loudly instead of computing something wrong (gcc emits none for the kernels' loops: a
 * worksharing loop that ends its region has its barrier removed). */
#define _GNU_SOURCE
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define AFP_MAX_TASKS 1024
#define AFP_WORKER_NAME "afp-worker"
#define AFP_MAX_WORKSHARES 8

/* Each on its own cache line, as are the claim word and the done count below: threads hammer
 * them from both cores, and a line shared by two of them would bounce at every touch. */
#define AFP_LINE 64

typedef struct {
  _Alignas(AFP_LINE) _Atomic long next; /* the next iteration to hand out (one-ended) */
  _Atomic uint64_t ends;                /* two-ended: chunks taken from the front << 32 | the back's end */
  long start, end, incr, step;
  int two_ended;
  _Atomic int state; /* 0 unset, 1 being set, 2 ready */
} afp_workshare;

typedef struct {
  afp_body fn;
  void *data;
  int ntasks;
  int first_workshare; /* 1 for a combined `parallel for`: its loop is set before the tasks run */
  _Alignas(AFP_LINE) _Atomic int done;
  afp_workshare ws[AFP_MAX_WORKSHARES];
} afp_region;

/* What a thread runs now: its task (OpenMP thread number), the task count, its region. */
typedef struct {
  int tid, nthreads, workshare;
  afp_region *region;
} afp_task;

static _Thread_local afp_task afp_now = {0, 1, 0, NULL};

static struct {
  _Alignas(AFP_LINE) _Atomic uint64_t claim; /* generation << 32 | tasks << 16 | next task */
  _Alignas(AFP_LINE) _Atomic uint32_t wake;  /* futex word, bumped when a region is published to sleepers */
  _Atomic int sleepers;     /* workers in (or entering) a futex wait */
  _Atomic int busy;         /* a caller owns the pool (others run their regions inline) */
  _Atomic long spin_ns;     /* how long a worker spins after its last task before sleeping */
  _Alignas(AFP_LINE) _Atomic long regions; /* regions run with the pool, for tests and statistics */
  _Alignas(AFP_LINE) _Atomic long tasks_by_workers;
  _Atomic int hold;         /* workers claim nothing (tests: the caller must run every task) */
  _Atomic int two_ended;    /* two-task regions hand out dynamic chunks from both ends (afp_set_workshare) */
  _Atomic int caller_cpu;   /* the CPU the last region's caller published it from (afp_step_aside) */
  _Alignas(AFP_LINE) _Atomic long step_asides; /* workers moved off their caller's CPU */
  uint32_t generation;
  int workers;              /* threads started */
  pthread_mutex_t grow;
  pthread_mutex_t atomic_lock;
  afp_region region;
} afp = {.spin_ns = 100000,
         .caller_cpu = -1,
         .two_ended = 1,
         .grow = PTHREAD_MUTEX_INITIALIZER,
         .atomic_lock = PTHREAD_MUTEX_INITIALIZER};

static inline void afp_pause(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

static inline long afp_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

static void afp_run_task(afp_region *r, int tid) {
  const afp_task saved = afp_now;
  afp_now = (afp_task){tid, r->ntasks, r->first_workshare, r};
  r->fn(r->data);
  afp_now = saved;
  atomic_fetch_add_explicit(&r->done, 1, memory_order_release);
}

/* Claim and run one task of the published region; 0 when none is left to claim. */
static int afp_claim_one(void) {
  uint64_t c = atomic_load_explicit(&afp.claim, memory_order_acquire);
  for (;;) {
    const uint32_t next = (uint32_t)(c & 0xffffu), tasks = (uint32_t)(c >> 16 & 0xffffu);
    if (next >= tasks) return 0;
    if (atomic_compare_exchange_weak_explicit(&afp.claim, &c, c + 1, memory_order_acq_rel,
                                              memory_order_acquire)) {
      /* the region cannot change under a claimed task: its caller waits for it */
      afp_run_task(&afp.region, (int)next);
      return 1;
    }
  }
}

static int afp_work_available(void) {
  const uint64_t c = atomic_load_explicit(&afp.claim, memory_order_acquire);
  return (c & 0xffffu) < (c >> 16 & 0xffffu);
}

/* Where a worker runs relative to its caller. A futex wake places the woken thread by the guest
 * scheduler's rules, and in a virtual machine an idle vCPU that the hypervisor has descheduled
 * does not count as an idle CPU (vcpu_is_preempted), so a woken worker mostly lands on its
 * caller's own vCPU while the other stays idle: it preempts the caller there, and the two take
 * turns on one CPU until the load balancer separates them, ticks later (a worker spinning beside
 * its caller may stay for good). So a worker goes to sleep with its caller's CPU taken out of its
 * affinity (`afp_sleep_away`): the wake then has to put it on another CPU, where it restores the
 * mask it had (no thread stays pinned: a pinned thread waits for its busy core on a shared host).
 * If it still finds itself on its caller's CPU (the caller moved there), it steps aside the same
 * way (`afp_step_aside`: a mask without that CPU migrates it at once, then the old mask back).
 * Measured on a 2-vCPU AMD EPYC Zen 3 host (onnxruntime 1.31, whose workers spin, in the same
 * rounds), median (p75) ms: ResNet-50's 3x3 conv at 28x28 (two tiles) in blocks of back-to-back
 * calls 0.3 s apart 2.73 (3.51) with the worker left where the wake put it (the caller preempted
 * 158 times in 200 calls), 1.75 (1.83) with caller and worker pinned apart, 1.71 (1.84) with a
 * worker that never sleeps, onnxruntime 1.55 (1.64); MobileNetV2 called every 5 ms, its worker
 * asleep at each call, 11.1-12.1 ms with the wake's placement (the worker ran 60-70% of its
 * tasks), 7.7-9.2 with the worker sleeping away (99.9%), onnxruntime 6.4-6.9; ResNet-50 called
 * every 20 ms, 66.0 -> 55.4 ms (onnxruntime 53.7-54.3). */
static void afp_leave_cpu(int cpu, cpu_set_t *kept) {
  cpu_set_t away;
  if (cpu < 0 || sched_getaffinity(0, sizeof *kept, kept) != 0) {
    CPU_ZERO(kept);
    return;
  }
  away = *kept;
  CPU_CLR(cpu, &away);
  if (CPU_COUNT(&away) == 0 || sched_setaffinity(0, sizeof away, &away) != 0) CPU_ZERO(kept);
}

static void afp_step_aside(void) {
  const int cpu = sched_getcpu();
  if (cpu < 0 || cpu != atomic_load_explicit(&afp.caller_cpu, memory_order_relaxed)) return;
  cpu_set_t kept;
  afp_leave_cpu(cpu, &kept);
  if (CPU_COUNT(&kept) == 0) return;
  sched_setaffinity(0, sizeof kept, &kept);
  atomic_fetch_add_explicit(&afp.step_asides, 1, memory_order_relaxed);
}

/* Sleep until a caller publishes (read the word, announce, re-check, wait), away from the CPU
 * of the last region's caller. */
static void afp_sleep_away(void) {
  cpu_set_t kept;
  afp_leave_cpu(atomic_load_explicit(&afp.caller_cpu, memory_order_relaxed), &kept);
  const uint32_t word = atomic_load(&afp.wake);
  atomic_fetch_add(&afp.sleepers, 1);
  if (!afp_work_available()) syscall(SYS_futex, &afp.wake, FUTEX_WAIT_PRIVATE, word, NULL, NULL, 0);
  atomic_fetch_sub(&afp.sleepers, 1);
  if (CPU_COUNT(&kept) > 0) sched_setaffinity(0, sizeof kept, &kept);
  afp_step_aside();
}

static void *afp_worker(void *arg) {
  (void)arg;
  long idle_since = afp_now_ns();
  unsigned spins = 0;
  for (;;) {
    if (!atomic_load_explicit(&afp.hold, memory_order_relaxed) && afp_claim_one()) {
      atomic_fetch_add_explicit(&afp.tasks_by_workers, 1, memory_order_relaxed);
      idle_since = afp_now_ns();
      spins = 0;
      continue;
    }
    afp_pause();
    if (++spins & 63u) continue;
    afp_step_aside(); /* the caller may have moved onto this worker's CPU */
    /* A region still running (its caller finishing the larger share) means more regions follow:
     * the spin counts from when the pool was last busy, not from this worker's last task. Counted
     * from its last task, a worker done early in ResNet-50's longer regions slept a dozen times a
     * run, each region after it paying a wake (2-vCPU Zen 3 host, runs back to back: 12 sleeps a
     * run against one, between runs; median run 52-64 ms against 49-50). One clock reading for
     * both: with two, a worker preempted between them (for longer than its spin) went to sleep
     * in the middle of a busy region. */
    const long now = afp_now_ns();
    if (atomic_load_explicit(&afp.busy, memory_order_relaxed)) idle_since = now;
    if (now - idle_since < atomic_load_explicit(&afp.spin_ns, memory_order_relaxed)) continue;
    afp_sleep_away();
    idle_since = afp_now_ns();
    spins = 0;
  }
  return NULL;
}

/* Start workers until `wanted` run; 0 if a thread could not be started (the caller then runs
 * its regions with the threads it has). Signals stay with the threads that had them. */
static int afp_grow(int wanted) {
  pthread_mutex_lock(&afp.grow);
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &old);
  while (afp.workers < wanted) {
    pthread_t t;
    if (pthread_create(&t, NULL, afp_worker, NULL) != 0) break;
    pthread_setname_np(t, AFP_WORKER_NAME); /* what `top -H` and /proc show */
    pthread_detach(t);
    ++afp.workers;
  }
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  const int have = afp.workers;
  pthread_mutex_unlock(&afp.grow);
  return have;
}

static void afp_after_fork_in_child(void) {
  /* the child has this thread only: no workers, no owner, no sleepers */
  afp.workers = 0;
  atomic_store(&afp.busy, 0);
  atomic_store(&afp.sleepers, 0);
  atomic_store(&afp.claim, 0);
  pthread_mutex_init(&afp.grow, NULL);
  pthread_mutex_init(&afp.atomic_lock, NULL);
}

__attribute__((constructor)) static void afp_init(void) {
  pthread_atfork(NULL, NULL, afp_after_fork_in_child);
}

static void afp_reset_workshares(afp_region *r) {
  for (int i = 0; i < AFP_MAX_WORKSHARES; ++i) atomic_store_explicit(&r->ws[i].state, 0, memory_order_relaxed);
}

/* A combined `parallel for`'s loop, as gcc hands it over: set before the region's tasks run. */
typedef struct {
  long start, end, incr, chunk;
} afp_loop;

/* A dynamic loop of a two-task region is handed out from both ends: task 0 (always the caller,
 * afp_parallel_region) takes chunks from the front, task 1 from the back, until they meet. The
 * kernels' chunks are tiles in image order (pixel tiles, output rows), so each thread keeps
 * about the same half of the image from one kernel to the next, where its core's caches hold
 * what it wrote; handed out from one end, a thread's tiles fall anywhere, and about half of what
 * a kernel reads was written by the other core (on Zen 4 such a read of 1.8 MB ran at 15.7 GB/s,
 * 33-36 for the reading core's own writes). The balance of a dynamic schedule stays: the threads
 * meet wherever their speeds have taken them. OpenMP allows it: the loops are nonmonotonic.
 * Measured on one compiled model switching between the two (afp_set_two_ended) in alternating
 * blocks, two threads, AMD EPYC Zen 4 (AVX-512), two-ended against one-ended: ResNet-50's median
 * run 0.950-0.985 over four runs of 16-30 rounds (fastest runs 1.00), BERT-base 0.97 (0.995),
 * MobileNetV2 0.97-1.03 (1.01-1.03: its depthwise convs split channels, not the image). */
static void afp_set_workshare(afp_workshare *ws, long start, long end, long incr, long chunk, int tasks) {
  atomic_store_explicit(&ws->next, start, memory_order_relaxed);
  ws->start = start;
  ws->end = end;
  ws->incr = incr;
  ws->step = (chunk < 1 ? 1 : chunk) * incr;
  const long span = incr > 0 ? end - start : start - end, step = incr > 0 ? ws->step : -ws->step;
  const long chunks = span > 0 ? (span + step - 1) / step : 0;
  ws->two_ended = tasks == 2 && chunks < (1L << 31) && atomic_load_explicit(&afp.two_ended, memory_order_relaxed);
  atomic_store_explicit(&ws->ends, (uint64_t)chunks, memory_order_relaxed);
  atomic_store_explicit(&ws->state, 2, memory_order_release);
}

static void afp_run_inline(afp_body fn, void *data, int first_workshare, const afp_loop *loop) {
  afp_region local = {.fn = fn, .data = data, .ntasks = 1, .first_workshare = first_workshare};
  afp_reset_workshares(&local);
  if (loop) afp_set_workshare(&local.ws[0], loop->start, loop->end, loop->incr, loop->chunk, 1);
  afp_run_task(&local, 0);
}

/* `num_threads`: the team size, resolved by the entry shim (a num_threads clause, else the
 * calling thread's OpenMP setting, which the runtime steers: backend/cpu/threads.py). */
static void afp_parallel_region(afp_body fn, void *data, unsigned num_threads, const afp_loop *loop) {
  int want = (int)num_threads;
  if (want > AFP_MAX_TASKS) want = AFP_MAX_TASKS;
  const int first = loop != NULL;
  int expected = 0;
  if (want < 2 || !atomic_compare_exchange_strong(&afp.busy, &expected, 1)) {
    afp_run_inline(fn, data, first, loop); /* one thread, or nested in / beside another region */
    return;
  }
  atomic_store_explicit(&afp.caller_cpu, sched_getcpu(), memory_order_relaxed);
  if (afp.workers < want - 1 && afp_grow(want - 1) < 1) {
    atomic_store(&afp.busy, 0);
    afp_run_inline(fn, data, first, loop);
    return;
  }
  afp_region *r = &afp.region;
  r->fn = fn;
  r->data = data;
  r->ntasks = want;
  r->first_workshare = first;
  atomic_store_explicit(&r->done, 0, memory_order_relaxed);
  afp_reset_workshares(r);
  if (loop) afp_set_workshare(&r->ws[0], loop->start, loop->end, loop->incr, loop->chunk, want);
  afp.generation = (afp.generation + 1) & 0xffffffffu;
  /* task 0 is the caller's (so "thread 0" is the same core in every region), the rest claimed */
  atomic_store(&afp.claim, (uint64_t)afp.generation << 32 | (uint64_t)want << 16 | 1u);
  if (atomic_load(&afp.sleepers) > 0) {
    atomic_fetch_add(&afp.wake, 1);
    syscall(SYS_futex, &afp.wake, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
  }
  afp_run_task(r, 0);
  while (afp_claim_one()) {
  }
  for (unsigned spins = 1; atomic_load_explicit(&r->done, memory_order_acquire) < want; ++spins) {
    afp_pause();
    if (!(spins & 0xfffu)) sched_yield(); /* the worker holding the last task was descheduled */
  }
  atomic_fetch_add_explicit(&afp.regions, 1, memory_order_relaxed);
  atomic_store(&afp.busy, 0);
}

/* ---- the OpenMP entry points gcc emits, as the kernels' entry shim (entry.c) calls them ---- */

static void afp_parallel(afp_body fn, void *data, unsigned num_threads, unsigned flags) {
  (void)flags;
  afp_parallel_region(fn, data, num_threads, NULL);
}

static void afp_parallel_loop_dynamic(afp_body fn, void *data, unsigned num_threads, long start, long end,
                                      long incr, long chunk, unsigned flags) {
  (void)flags;
  const afp_loop loop = {start, end, incr, chunk};
  afp_parallel_region(fn, data, num_threads, &loop);
}

static afp_workshare *afp_current_workshare(void) {
  return &afp_now.region->ws[afp_now.workshare - 1];
}

/* The next chunk of a two-ended loop for this task (afp_set_workshare): its index, or -1. */
static long afp_claim_end(afp_workshare *ws) {
  uint64_t e = atomic_load_explicit(&ws->ends, memory_order_relaxed);
  for (;;) {
    const uint64_t front = e >> 32, back = e & 0xffffffffu;
    if (front >= back) return -1;
    const int from_back = afp_now.tid == 1;
    const uint64_t want = from_back ? e - 1 : e + (1ull << 32);
    if (atomic_compare_exchange_weak_explicit(&ws->ends, &e, want, memory_order_relaxed, memory_order_relaxed))
      return (long)(from_back ? back - 1 : front);
  }
}

static int afp_loop_dynamic_next(long *istart, long *iend) {
  afp_workshare *ws = afp_current_workshare();
  long s;
  if (ws->two_ended) {
    const long i = afp_claim_end(ws);
    if (i < 0) return 0;
    s = ws->start + i * ws->step;
  } else {
    s = atomic_fetch_add_explicit(&ws->next, ws->step, memory_order_relaxed);
  }
  long e = s + ws->step;
  if (ws->incr > 0) {
    if (s >= ws->end) return 0;
    if (e > ws->end) e = ws->end;
  } else {
    if (s <= ws->end) return 0;
    if (e < ws->end) e = ws->end;
  }
  *istart = s;
  *iend = e;
  return 1;
}

static int afp_loop_dynamic_start(long start, long end, long incr, long chunk, long *istart, long *iend) {
  afp_region *r = afp_now.region;
  if (r == NULL || afp_now.workshare >= AFP_MAX_WORKSHARES) {
    fprintf(stderr, "graph-autofusion: worksharing loop outside a pool region, or more than %d in one\n",
            AFP_MAX_WORKSHARES);
    abort();
  }
  afp_workshare *ws = &r->ws[afp_now.workshare++];
  int unset = 0;
  if (atomic_compare_exchange_strong(&ws->state, &unset, 1)) {
    afp_set_workshare(ws, start, end, incr, chunk, afp_now.nthreads);
  } else {
    while (atomic_load_explicit(&ws->state, memory_order_acquire) != 2) afp_pause();
  }
  return afp_loop_dynamic_next(istart, iend);
}

static void afp_loop_end_nowait(void) {}

static void afp_barrier(void) {
  if (afp_now.nthreads > 1) {
    fprintf(stderr, "graph-autofusion: a barrier inside a parallel region of the thread pool "
                    "(its tasks may run one after another on one thread); build this kernel with "
                    "AUTOFUSION_THREAD_POOL=openmp\n");
    abort();
  }
}

static int afp_thread_num(void) { return afp_now.tid; }
static int afp_num_threads(void) { return afp_now.nthreads; }
static void afp_atomic_start(void) { pthread_mutex_lock(&afp.atomic_lock); }
static void afp_atomic_end(void) { pthread_mutex_unlock(&afp.atomic_lock); }

/* The table every kernel unit's entry shim calls through (api.h). */

const afp_api_t afp_api = {
    afp_parallel,
    afp_parallel_loop_dynamic,
    afp_loop_dynamic_start,
    afp_loop_dynamic_next,
    afp_loop_end_nowait,
    afp_barrier,
    afp_thread_num,
    afp_num_threads,
    afp_atomic_start,
    afp_atomic_end,
};

/* ---- control and statistics, for the runtime (threadpool/__init__.py) ---- */

void afp_set_spin_ns(long ns) { atomic_store(&afp.spin_ns, ns < 0 ? LONG_MAX : ns); }
long afp_spin_ns(void) { return atomic_load(&afp.spin_ns); }
int afp_workers(void) { return afp.workers; }
long afp_regions(void) { return atomic_load(&afp.regions); }
long afp_tasks_by_workers(void) { return atomic_load(&afp.tasks_by_workers); }
long afp_step_asides(void) { return atomic_load(&afp.step_asides); }
void afp_hold_workers(int on) { atomic_store(&afp.hold, on); }
/* Off: every dynamic loop handed out from the front (a measurement's other side). */
void afp_set_two_ended(int on) { atomic_store(&afp.two_ended, on); }
