/* api.h - the table through which every kernel unit's entry shim (entry.c) calls the process's
 * thread pool (pool.c). Both are compiled with this text in front of them (threadpool/__init__.py),
 * so the two sides cannot disagree on its layout. */
typedef void (*afp_body)(void *);

typedef struct {
  void (*parallel)(afp_body, void *, unsigned, unsigned);
  void (*parallel_loop_dynamic)(afp_body, void *, unsigned, long, long, long, long, unsigned);
  int (*loop_dynamic_start)(long, long, long, long, long *, long *);
  int (*loop_dynamic_next)(long *, long *);
  void (*loop_end_nowait)(void);
  void (*barrier)(void);
  int (*thread_num)(void);
  int (*num_threads)(void);
  void (*atomic_start)(void);
  void (*atomic_end)(void);
} afp_api_t;
