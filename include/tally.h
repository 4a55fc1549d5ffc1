/*
 * tally: a caching GPU memory allocator that knows who owns every byte.
 *
 * This is the one public header. Every function returns promptly and never
 * prints except through the diagnostics sink (tally_set_sink). Functions that
 * return int use 0 for success and a negative TALLY_E* code for failure; the
 * reason is then available from tally_last_error() on the calling thread.
 *
 * The library initialises itself on first use (reading TALLY_CONF once);
 * tally_init() does it explicitly. Every function is thread-safe.
 */
#ifndef TALLY_H
#define TALLY_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TALLY_VERSION_MAJOR 0
#define TALLY_VERSION_MINOR 1
#define TALLY_VERSION_PATCH 0
#define TALLY_VERSION "0.1.0"

#if defined(TALLY_BUILDING_LIBRARY)
#define TALLY_API __attribute__((visibility("default")))
#else
#define TALLY_API
#endif

/* Error codes (returned negated by int functions). */
enum {
    TALLY_OK = 0,
    TALLY_EINVAL = 1,   /* bad argument: size, device, pointer, name */
    TALLY_ENOMEM = 2,   /* device (or metadata) memory exhausted */
    TALLY_ECONF = 3,    /* bad configuration key or value */
    TALLY_EBACKEND = 4, /* the backend failed for a reason other than memory */
    TALLY_ESTATE = 5,   /* call not valid in the current state */
    TALLY_EIO = 6       /* a file could not be read or written */
};

/* ---- Version, set-up, errors, diagnostics ------------------------------ */

/* The library's version string, e.g. "0.1.0" (equal to TALLY_VERSION). */
TALLY_API const char *tally_version(void);

/* Initialise explicitly: read TALLY_CONF, pick the backend. Called implicitly
 * by every other function; returns 0, or a negative code if the configuration
 * or backend is unusable (the message says which). */
TALLY_API int tally_init(void);

/* Set configuration keys, in TALLY_CONF syntax ("key:value,key:value").
 * Before initialisation any key may be set; afterwards only keys marked
 * "runtime" in docs/configuration.md (memory fraction, gc threshold, leak
 * report, ...). Every key and value is validated; on error nothing changes. */
TALLY_API int tally_configure(const char *conf);

/* The configuration in effect, one "key:value    # help" line per key, the
 * values as configured (home_device:auto, sizes with units): the text before
 * each "    #", joined with commas, is a TALLY_CONF that configures the same.
 * write(arg, text, len) receives the text in pieces. */
typedef void (*tally_write_fn)(void *arg, const char *text, size_t len);
TALLY_API int tally_write_options(tally_write_fn write, void *arg);

/* The message of the last failed call on this thread ("" if none), of at
 * most 511 characters: a longer one is cut there. */
TALLY_API const char *tally_last_error(void);

/* Where diagnostics go (one line per message, ending in '\n'). NULL restores
 * the default, stderr. */
TALLY_API void tally_set_sink(tally_write_fn write, void *arg);

/* Name of the backend in use: "host", "cuda" or "async" (initialises). */
TALLY_API const char *tally_backend_name(void);

/* Number of devices the backend exposes (initialises); negative on error. */
TALLY_API int tally_device_count(void);

/* 1 once tally has initialised and started its backend (for cuda / async:
 * once CUDA is in use), 0 before; never starts it. The backend starts at the
 * first call that needs a device (an allocation, tally_init, the PyTorch init
 * hook), so a program can still set CUDA_VISIBLE_DEVICES after loading tally
 * and configuring it. Stays 1 in a forked child of a started parent. */
TALLY_API int tally_backend_started(void);

/* ---- Allocation --------------------------------------------------------- */

/* Allocate size bytes on device for use on stream (NULL: the default
 * stream). Returns NULL for size 0 (not an error), and NULL with an error for
 * a bad device, a size that is negative when read as ssize_t, or when the
 * device is out of memory after freeing the cache (the OOM report is written
 * to the sink). The memory is 512-byte aligned. */
TALLY_API void *tally_malloc(size_t size, int device, void *stream);

/* Return a block. NULL is ignored. A pointer tally never returned, or one
 * already freed, is reported on the sink and ignored. */
TALLY_API void tally_free(void *ptr);

/* As tally_free, and also check that size and device agree with the record
 * (size is the size asked for at allocation, device its device). A mismatch
 * is reported; the block is still freed from the record's facts. Returns 0, or
 * -TALLY_EINVAL for an unknown pointer / double free / mismatch. */
TALLY_API int tally_free_checked(void *ptr, size_t size, int device);

/* Mark the block as used on stream: it will be reused only after the work
 * queued on stream at the time of its free has completed. With the cuda and
 * async backends the stream may belong to another device than the block
 * (its event is made on the stream's device); NULL, CU_STREAM_LEGACY (1) and
 * CU_STREAM_PER_THREAD (2) mean that default stream of the device whose
 * context is current on the calling thread, or of the block's device when
 * none is current. */
TALLY_API int tally_record_stream(void *ptr, void *stream);

/* Under the async backend, let device peer read and write the memory of
 * device's pool (cuMemPoolSetAccess), now or when the pool is set up at the
 * device's first allocation; under the cuda backend with
 * expandable_segments, the pages mapped now and later (cuMemSetAccess; a
 * peer that cuDeviceCanAccessPeer says cannot is refused). Such memory
 * ignores the program's cudaDeviceEnablePeerAccess, so call this where the
 * program enables peer access between the two devices and uses tally's
 * memory across them. Otherwise it does nothing (the memory follows the
 * program's peer access). 0, -TALLY_EINVAL (bad device, peer == device) or
 * -TALLY_EBACKEND naming the CUDA call and error. */
TALLY_API int tally_pool_peer_access(int device, int peer);

/* CUDA graph pools (PyTorch's begin_allocate_to_pool / end_allocate_to_pool
 * / release_pool; its MempoolId_t is the pair id_hi, id_lo, not both 0).
 * Between begin and end, allocations on device for which filter(arg,
 * stream) is non-zero (every allocation when filter is NULL) come from the
 * pool's own segments; their blocks, once freed, serve only later
 * allocations to the same pool, never other ones, so memory a graph uses on
 * replay is never handed to eager code. begin on a pool that exists (and is
 * not allocating) reuses it, counting one more use; release drops one use,
 * and a pool with no use left gives its free segments back now and at each
 * empty_cache. filter is called with the device's lock held and must not
 * call tally. Between begin and end a capture is taken to be under way, on
 * every device: tally queries and synchronises no event, releases nothing
 * (empty_cache and the out-of-memory path free no segment) and unmaps no
 * page; once any begin was seen, tally relies on these calls to learn of
 * captures, so a program that calls them for some captures must call them
 * for all. Under the async backend the driver's pools handle graph memory:
 * the pools serve nothing, and frees of blocks allocated outside a capture
 * wait for its end. 0, or -TALLY_EINVAL (bad device, id (0, 0), unknown pool
 * on release), -TALLY_ESTATE (begin twice, end without begin). */
TALLY_API int tally_graph_pool_begin(int device, uint64_t id_hi, uint64_t id_lo,
                                     int (*filter)(void *arg, void *stream), void *arg);
TALLY_API int tally_graph_pool_end(int device, uint64_t id_hi, uint64_t id_lo);
TALLY_API int tally_graph_pool_release(int device, uint64_t id_hi, uint64_t id_lo);
/* Promise that every CUDA graph capture of this process will be announced
 * with tally_graph_pool_begin before it starts (as PyTorch does once its
 * begin/end/release hooks are installed: tally.install() calls this). From
 * then on the cached malloc/free path asks the driver nothing about
 * captures; before it, and before any begin, each allocation on the cuda
 * backend checks its stream with one or more driver calls. Starts nothing
 * (no backend, no CUDA); may be called before tally_init. */
TALLY_API void tally_graph_captures_announced(void);

/* Release every fully free cached segment of device (-1: every device) to the
 * backend, after waiting for pending stream events. Returns bytes released
 * (0 while a CUDA graph capture may be under way: tally_graph_pool_begin). */
TALLY_API size_t tally_empty_cache(int device);

/* Limit device's reserved memory to fraction of its capacity, as
 * torch.cuda.set_per_process_memory_fraction: fraction in [0, 1]; 1 removes
 * the cap, 0 allows no new segments. Outside [0, 1] is an error. */
TALLY_API int tally_set_memory_fraction(double fraction, int device);

/* The fraction device is limited to (torch.cuda.get_per_process_memory_fraction):
 * 1.0 when uncapped, else the last fraction set for it. */
TALLY_API int tally_get_memory_fraction(int device, double *fraction);

/* Free and total memory of the device as the backend reports it. */
TALLY_API int tally_mem_get_info(int device, size_t *free_bytes, size_t *total_bytes);

/* Facts about one live block: its device, stream, requested and rounded size. */
typedef struct tally_block_info {
    int device;
    void *stream;
    size_t requested_size;
    size_t size;
    uint32_t tag;    /* interned tag id (tally_tag_name gives the text) */
    uint32_t stage;  /* interned stage id */
    uint64_t seq;    /* allocation sequence number on its device */
} tally_block_info_t;
TALLY_API int tally_block_info(const void *ptr, tally_block_info_t *info);

/* Walk every device's segments and blocks and verify the invariants (block
 * chains, sizes, free index, pointer map, statistics against a recount).
 * Returns 0, or -TALLY_ESTATE with the first violation in tally_last_error(). */
TALLY_API int tally_check(void);

/* ---- Statistics (torch.cuda.memory_stats, same definitions) -------------- */

typedef struct tally_stat {
    int64_t current, peak, allocated, freed;
} tally_stat_t;

/* Index into the per-pool arrays below. */
enum { TALLY_POOL_ALL = 0, TALLY_POOL_SMALL = 1, TALLY_POOL_LARGE = 2, TALLY_POOL_COUNT = 3 };

/* The pool-indexed statistics, in PyTorch's order. X(name) */
#define TALLY_POOL_STATS(X) \
    X(allocation) X(segment) X(active) X(inactive_split) X(allocated_bytes) \
    X(reserved_bytes) X(active_bytes) X(inactive_split_bytes) X(requested_bytes)

typedef struct tally_stats {
#define TALLY_X_(name) tally_stat_t name[TALLY_POOL_COUNT];
    TALLY_POOL_STATS(TALLY_X_)
#undef TALLY_X_
    tally_stat_t oversize_allocations;
    tally_stat_t oversize_segments;
    int64_t num_alloc_retries;
    int64_t num_ooms;
    int64_t max_split_size;       /* -1 when unlimited */
    int64_t num_sync_all_streams;
    int64_t num_device_alloc;
    int64_t num_device_free;
    /* Fragmentation figures PyTorch lacks. */
    int64_t largest_free_block;   /* bytes, largest cached free block */
    int64_t cached_free_bytes;    /* reserved - active */
    double utilisation;           /* peak allocated / peak reserved (0 if none) */
} tally_stats_t;

/* Fill *out with device's statistics (a consistent snapshot). */
TALLY_API int tally_get_stats(int device, tally_stats_t *out);

/* Set every peak to its current value (torch.cuda.reset_peak_memory_stats). */
TALLY_API int tally_reset_peak_stats(int device);

/* Zero allocated / freed counts and the num_* scalars
 * (torch.cuda.reset_accumulated_memory_stats). */
TALLY_API int tally_reset_accumulated_stats(int device);

/* The statistics as one flat JSON object with torch.cuda.memory_stats keys
 * ("allocation.all.current": 3, ...), sorted as PyTorch sorts them. */
TALLY_API int tally_write_stats_json(int device, tally_write_fn write, void *arg);

/* ---- Ownership ledger: tags and stages ----------------------------------- */

/* Push tag onto the calling thread's tag stack: blocks this thread allocates
 * belong to the innermost tag (untagged blocks show as "untagged"). Names are
 * 1-200 printable characters, interned once. */
TALLY_API int tally_tag_push(const char *tag);

/* Pop the calling thread's innermost tag; an empty stack is an error. */
TALLY_API int tally_tag_pop(void);

/* Begin a stage (process-wide stack): blocks allocated from now on, by any
 * thread, record it as their stage until it ends or a nested one begins. */
TALLY_API int tally_stage_begin(const char *name);

/* End the innermost stage, which must be called name (else an error naming
 * the innermost). Reports the stage's survivors (blocks allocated during it,
 * nested stages included, still live; persistent tags left out) to the sink
 * when stage_report is on, and releases cached segments when
 * release_at_stage_end is on. */
TALLY_API int tally_stage_end(const char *name);

/* The text of an interned tag or stage id (as in tally_block_info_t). */
TALLY_API const char *tally_tag_name(uint32_t id);
TALLY_API const char *tally_stage_name(uint32_t id);

/* ---- Reports ------------------------------------------------------------ */

/* device's statistics as the table torch.cuda.memory_summary(device,
 * abbreviated) returns, byte for byte: lines of 75 columns between '|' bars,
 * each ending in '\n' (a number too wide for its cell widens its line, as in
 * PyTorch). abbreviated != 0 leaves out the "from large pool" and "from small
 * pool" rows. The text reaches write(arg, text, len) in pieces. Returns 0, or
 * the negative code of tally_get_stats (e.g. for a bad device). */
TALLY_API int tally_write_summary(int device, int abbreviated, tally_write_fn write, void *arg);

/* The ledger by tag x stage x device (current, peak, blocks; foreign rows
 * marked) and the stage history, as text. */
TALLY_API int tally_write_ledger(tally_write_fn write, void *arg);

/* Flags of tally_write_leaks. */
#define TALLY_LEAKS_FULL 1    /* every group of live blocks, not only the SUMMARY line */
#define TALLY_LEAKS_AT_EXIT 2 /* worded as the report at exit: "still live at exit", "leaked" */

/* The report of every live block, grouped by (tag, stage, device, site),
 * sites with the most bytes first, each site's frames printed once
 * (TALLY_LEAKS_FULL), or only its SUMMARY line. Mid-run it says what is
 * live now ("N blocks still live now", "SUMMARY: B bytes still live in N
 * blocks"); with TALLY_LEAKS_AT_EXIT, as at exit ("still live at exit",
 * "SUMMARY: B bytes leaked in N blocks"). Leaks matched by
 * leak_suppressions and blocks passed to tally_ignore are counted apart,
 * not as leaked. */
TALLY_API int tally_write_leaks(int flags, tally_write_fn write, void *arg);

/* Mark the live block at ptr as kept on purpose: it stays live but the leak
 * report counts it apart ("ignored") and it never sets leak_exitcode.
 * Returns 0, or -TALLY_EINVAL when ptr is not a live block of tally. */
TALLY_API int tally_ignore(void *ptr);

/* Write the JSON report (docs/reports.md) to path; NULL uses report_path.
 * %p in the path becomes the pid, %r the rank (RANK, else 0). The file is
 * replaced atomically. */
TALLY_API int tally_write_report(const char *path);

/* ---- PyTorch pluggable-allocator entry points ---- */

/* The functions torch.cuda.memory.CUDAPluggableAllocator(path,
 * "tally_torch_alloc", "tally_torch_free") calls, and the hooks its
 * allocator object's set_*_fn setters take (docs/pytorch.md).
 *
 * alloc: size bytes on device for stream; NULL for size 0. When it fails it
 * calls the raiser set with tally_torch_set_oom_raiser (c10::OutOfMemoryError
 * when the Python package built its shim), else, when the library was linked
 * with lib/torch/torch_oom.cc, throws std::runtime_error ("CUDA out of memory.
 * Tried to allocate ...", a Python RuntimeError); otherwise returns NULL. */
TALLY_API void *tally_torch_alloc(size_t size, int device, void *stream);

/* free: frees by tally's own record; size and device are hints that may be
 * wrong (the first disagreement of each kind is reported), and the current
 * device does not matter. Safe at any time, also after the exit report. */
TALLY_API void tally_torch_free(void *ptr, size_t size, int device, void *stream);

/* Hooks: CUDA lazy init, torch.cuda.empty_cache(),
 * torch.cuda.set_per_process_memory_fraction(), Tensor.record_stream(). */
TALLY_API void tally_torch_init(int device_count);
TALLY_API void tally_torch_empty_cache(void);
TALLY_API void tally_torch_memory_fraction(double fraction, int device);
TALLY_API void tally_torch_record_stream(void *ptr, void *stream);

/* 1 when tally_torch_alloc raises a C++ exception on failure (a raiser is set,
 * or lib/torch/torch_oom.cc is linked in), 0 when it returns NULL. */
TALLY_API int tally_torch_oom_raises(void);

/* The function tally_torch_alloc calls when an allocation fails, with oom
 * non-zero for out-of-memory (else another failure, e.g. a bad device) and
 * the message ("CUDA out of memory. Tried to allocate ..."). It must throw a
 * C++ exception; if it returns, alloc returns NULL. The Python package sets
 * one compiled against the installed PyTorch that throws
 * c10::OutOfMemoryError (Python: torch.cuda.OutOfMemoryError), so cuDNN's
 * smaller-workspace fallback works (docs/pytorch.md). NULL restores the
 * default: lib/torch/torch_oom.cc's std::runtime_error. */
typedef void (*tally_torch_raise_fn)(int oom, const char *message);
TALLY_API void tally_torch_set_oom_raiser(tally_torch_raise_fn raise);

/* base_alloc hook (PyTorch's set_base_alloc_fn, used for CUDA IPC handles):
 * the start of the segment holding ptr, with its size in *size. NULL (and
 * *size 0) with an error when ptr is in no segment of tally or an argument
 * is NULL, and when ptr's memory is of a kind cudaIpcGetMemHandle cannot
 * share (it takes cudaMalloc memory only): pages of CUDA's virtual memory
 * API (expandable segments, a private tag's segments) or the async
 * backend's stream-ordered pool. */
TALLY_API void *tally_torch_base_alloc(void *ptr, size_t *size);

/* ---- Private tags: sleep and wake (docs/sleep.md) ------------------------- */

/* Mark tag private: its blocks from now on get pages no other tag shares
 * (a pool of its own per device and stream, on the backend's virtual-memory
 * path), so the tag can sleep and wake. The same as listing it in the
 * private_tags key. Refused with the reason on the async backend (no pages
 * of its own) and for "untagged"; at most 64 tags can be private
 * (-TALLY_ESTATE for the 65th). Blocks the tag took before stay where
 * they are (and a sleep of the tag is then refused). 0 or -TALLY_E*. */
TALLY_API int tally_tag_set_private(const char *tag);
/* 1 when tag is private, 0 when not, -TALLY_EINVAL for a bad name. */
TALLY_API int tally_tag_is_private(const char *tag);

#define TALLY_SLEEP_DISCARD 0     /* the contents are lost */
#define TALLY_SLEEP_OFFLOAD 1     /* copied to (pinned) host memory first, restored by wake */
#define TALLY_SLEEP_SYNC_DEVICE 2 /* wait for the whole device, not only the tag's streams */

/* Put ntags private tags to sleep: wait for the work tally knows uses their
 * blocks (their allocation streams and the streams given to
 * tally_record_stream; with TALLY_SLEEP_SYNC_DEVICE the whole device), with
 * TALLY_SLEEP_OFFLOAD copy their live blocks to host memory, then unmap
 * their pages and keep the addresses: reserved memory drops by those bytes.
 * Every tag is checked before any sleeps: one that is not private, has
 * blocks in a CUDA graph's pool or outside its private pool, has a capture
 * under way on its device or a block exported for IPC fails the call with
 * one line and nothing changes. A tag already asleep is left as it is, with
 * a diagnostic. While asleep its blocks must not be used; they may be
 * freed (a backup goes with them). 0 or -TALLY_E*. */
TALLY_API int tally_sleep(const char *const *tags, int ntags, int flags);
/* Wake ntags sleeping tags: map their pages back at the same addresses and
 * restore what was offloaded, byte for byte. A tag that cannot get its
 * memory back (-TALLY_ENOMEM, the message says how many bytes were missing)
 * stays asleep with its backup intact; tags woken before it in the same
 * call stay awake. A tag that is awake is left as it is, with a diagnostic. */
TALLY_API int tally_wake(const char *const *tags, int ntags);

typedef struct tally_sleep_info {
    int is_private, asleep, offloaded;
    uint64_t reserved;        /* bytes of its pages mapped now */
    uint64_t sleeping;        /* live bytes asleep (owned, not resident) */
    uint64_t sleeping_blocks; /* live blocks asleep */
    uint64_t unmapped;        /* reserved bytes its sleep gave back */
    uint64_t offload;         /* host bytes holding its backups */
    uint64_t sleeps, wakes;   /* completed sleeps and wakes */
    uint64_t kept;            /* pinned host bytes kept after a wake for its next offload (sleep_pinned_cache) */
} tally_sleep_info_t;
/* What tag holds and did on device (-1: every device, summed; asleep and
 * offloaded when any device's pool is). 0 or -TALLY_EINVAL. */
TALLY_API int tally_tag_sleep_info(const char *tag, int device, tally_sleep_info_t *out);

/* ---- Host backend controls (simulated devices; no effect on cuda) -------- */

/* While held (hold != 0), events recorded on stream stay pending, as if the
 * stream had queued work; releasing completes them. Lets tests and replays
 * model cross-stream reuse without a GPU. */
TALLY_API int tally_host_stream_hold(void *stream, int hold);

/* Make the Nth backend allocation from now fail with out-of-memory (1 = the
 * next one); 0 cancels. every != 0 repeats the failure every `every` calls. */
TALLY_API int tally_host_fail_alloc(uint64_t nth, uint64_t every);

/* The calls the host backend has had for a device since it started, so a
 * replay can count what the same calls cost on CUDA (docs/benchmarks.md).
 * Pages are 2 MiB; unmap_runs: runs of neighbouring mapped pages among the
 * pages unmapped (the cuda backend makes one cuMemUnmap per run). */
typedef struct tally_host_calls {
    uint64_t alloc, free;          /* segment allocations and frees */
    uint64_t reserve, unreserve;   /* address ranges (expandable segments) */
    uint64_t map, map_pages;       /* map calls, pages they mapped */
    uint64_t unmap, unmap_pages, unmap_runs;
    uint64_t map_handles;          /* physical handles the map calls laid out (one per page, or larger) */
    uint64_t unmap_handles;        /* physical handles the unmap calls took down (each one cuMemRelease on CUDA) */
    uint64_t reused_handles;       /* of map_handles, one-page handles a move took down and mapped again (with
                                    * expandable_move_budget:-1): on CUDA no cuMemCreate for them, and no
                                    * cuMemRelease where they were taken down */
} tally_host_calls_t;
TALLY_API int tally_host_calls(int device, tally_host_calls_t *out);

#ifdef __cplusplus
}
#endif

#ifdef __cplusplus
/* C++ only: PyTorch's CUDA graph pool hooks for a pluggable allocator
 * (lib/torch/torch_graph.cc, in libtally.so only), with the exact types PyTorch
 * calls them with: the pool id is c10::cuda::MempoolId_t and the filter a
 * std::function<bool(cudaStream_t)> (cudaStream_t is CUstream_st *). Pass
 * their addresses to the allocator object's set_begin_allocate_to_pool,
 * set_end_allocate_to_pool_fn and set_release_pool (tally.install() does).
 * They forward to tally_graph_pool_begin / _end / _release, keeping a copy
 * of the filter until end; failures are reported on the diagnostics sink. */
#include <functional>
#include <utility>
struct CUstream_st;
typedef std::pair<unsigned long long, unsigned long long> tally_mempool_id_t;
extern "C" {
TALLY_API void tally_torch_begin_allocate_to_pool(int device, tally_mempool_id_t pool,
                                                  std::function<bool(CUstream_st *)> filter);
TALLY_API void tally_torch_end_allocate_to_pool(int device, tally_mempool_id_t pool);
TALLY_API void tally_torch_release_pool(int device, tally_mempool_id_t pool);
}
#endif
#endif /* TALLY_H */
