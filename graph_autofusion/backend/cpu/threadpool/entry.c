/* Linked into every OpenMP kernel unit, with `-Wl,--wrap=<symbol>` for each entry point below
 * (threadpool/__init__.py: WRAPPED): gcc's calls to libgomp land here and go to the process's thread
 * pool (pool.c) once the runtime has attached it (`af_pool_api`), to libgomp before that. The team
 * size is resolved here, where libgomp is linked: a num_threads clause, else the calling thread's
 * omp_get_max_threads(). */
#include <stddef.h>

int omp_get_max_threads(void);

/* Set once by the runtime right after it loads the unit; NULL: libgomp's own teams. */
const afp_api_t *af_pool_api = NULL;

#define AFP_HIDDEN __attribute__((visibility("hidden")))

void __real_GOMP_parallel(afp_body, void *, unsigned, unsigned);
void __real_GOMP_parallel_loop_nonmonotonic_dynamic(afp_body, void *, unsigned, long, long, long, long,
                                                    unsigned);
_Bool __real_GOMP_loop_nonmonotonic_dynamic_start(long, long, long, long, long *, long *);
_Bool __real_GOMP_loop_nonmonotonic_dynamic_next(long *, long *);
void __real_GOMP_loop_end_nowait(void);
void __real_GOMP_barrier(void);
void __real_GOMP_loop_end(void);
int __real_omp_get_thread_num(void);
int __real_omp_get_num_threads(void);
void __real_GOMP_atomic_start(void);
void __real_GOMP_atomic_end(void);

AFP_HIDDEN void __wrap_GOMP_parallel(afp_body fn, void *data, unsigned n, unsigned flags) {
  if (af_pool_api) af_pool_api->parallel(fn, data, n ? n : (unsigned)omp_get_max_threads(), flags);
  else __real_GOMP_parallel(fn, data, n, flags);
}

AFP_HIDDEN void __wrap_GOMP_parallel_loop_nonmonotonic_dynamic(afp_body fn, void *data, unsigned n, long start,
                                                               long end, long incr, long chunk,
                                                               unsigned flags) {
  if (af_pool_api)
    af_pool_api->parallel_loop_dynamic(fn, data, n ? n : (unsigned)omp_get_max_threads(), start, end, incr, chunk,
                                       flags);
  else __real_GOMP_parallel_loop_nonmonotonic_dynamic(fn, data, n, start, end, incr, chunk, flags);
}

AFP_HIDDEN _Bool __wrap_GOMP_loop_nonmonotonic_dynamic_start(long start, long end, long incr, long chunk,
                                                             long *istart, long *iend) {
  if (af_pool_api) return af_pool_api->loop_dynamic_start(start, end, incr, chunk, istart, iend);
  return __real_GOMP_loop_nonmonotonic_dynamic_start(start, end, incr, chunk, istart, iend);
}

AFP_HIDDEN _Bool __wrap_GOMP_loop_nonmonotonic_dynamic_next(long *istart, long *iend) {
  if (af_pool_api) return af_pool_api->loop_dynamic_next(istart, iend);
  return __real_GOMP_loop_nonmonotonic_dynamic_next(istart, iend);
}

AFP_HIDDEN void __wrap_GOMP_loop_end_nowait(void) {
  if (af_pool_api) af_pool_api->loop_end_nowait();
  else __real_GOMP_loop_end_nowait();
}

AFP_HIDDEN void __wrap_GOMP_barrier(void) {
  if (af_pool_api) af_pool_api->barrier();
  else __real_GOMP_barrier();
}

AFP_HIDDEN void __wrap_GOMP_loop_end(void) {
  if (af_pool_api) af_pool_api->barrier();
  else __real_GOMP_loop_end();
}

AFP_HIDDEN int __wrap_omp_get_thread_num(void) {
  return af_pool_api ? af_pool_api->thread_num() : __real_omp_get_thread_num();
}

AFP_HIDDEN int __wrap_omp_get_num_threads(void) {
  return af_pool_api ? af_pool_api->num_threads() : __real_omp_get_num_threads();
}

AFP_HIDDEN void __wrap_GOMP_atomic_start(void) {
  if (af_pool_api) af_pool_api->atomic_start();
  else __real_GOMP_atomic_start();
}

AFP_HIDDEN void __wrap_GOMP_atomic_end(void) {
  if (af_pool_api) af_pool_api->atomic_end();
  else __real_GOMP_atomic_end();
}
