/* The backend contract: where device memory comes from. The cache calls
 * nothing else to reach a device. Every function returns 0 on success;
 * alloc returns TALLY_ENOMEM (positive) when the device is out of memory and
 * TALLY_EBACKEND for any other failure, with a reason in `why`.
 *
 * Preconditions: device is in [0, device_count). Functions that touch a
 * device make it current around the call and restore the caller's current
 * device (context); none creates anything on a device that tally has not
 * allocated on, except alloc and event_create.
 * alloc / free / event functions are called with the device's lock held,
 * except shutdown. None of them may be called from an exit handler when the
 * backend says can_exit_call is false (CUDA may already be torn down). */
#ifndef TALLY_BACKEND_H
#define TALLY_BACKEND_H

#include "core/internal.h"

typedef struct tally_backend {
    const char *name;
    bool can_exit_call;
    /* The backend caches by itself (async): the cache layer keeps one record
     * per allocation and never splits, merges or holds freed blocks. */
    bool passthrough;
    /* Prepare; fill why on failure. */
    int (*init)(const tally_options_t *opt, char *why, size_t whylen);
    int (*device_count)(void);
    int (*alloc)(int device, size_t size, void *stream, void **ptr, char *why, size_t whylen);
    int (*free)(int device, void *ptr, size_t size, void *stream);
    int (*mem_info)(int device, size_t *free_bytes, size_t *total_bytes);
    /* The device's memory size without starting the device (may be NULL:
     * mem_info is used). */
    int (*capacity)(int device, size_t *total_bytes);
    /* The device a stream belongs to; fallback for the default-stream
     * handles when no device is current (may be NULL: always fallback).
     * -1 when it cannot be told. */
    int (*stream_device)(void *stream, int fallback);
    /* Wait for the work queued on a stream of device (may be NULL:
     * synchronize(device) instead). */
    int (*stream_sync)(int device, void *stream);
    /* 1 while stream (of device) is being captured into a CUDA graph, 0 if
     * not, negative on error (may be NULL: never). */
    int (*stream_capturing)(int device, void *stream);
    /* Events: created on a device, recorded on a stream of that device;
     * query returns 0 when complete, 1 while pending, negative on error. */
    int (*event_create)(int device, void **event);
    int (*event_record)(int device, void *event, void *stream);
    int (*event_query)(int device, void *event);
    int (*event_sync)(int device, void *event);
    int (*event_destroy)(int device, void *event);
    /* Make stream wait for event (pass-through backends; may be NULL). */
    int (*stream_wait)(int device, void *stream, void *event);
    /* A stream of device on which frees of blocks used on several streams
     * are queued (pass-through backends; may be NULL, or return NULL). */
    void *(*free_stream)(int device);
    /* Let device peer read and write device's pool memory (pool backends;
     * may be NULL: memory follows the program's peer access). */
    int (*pool_peer_access)(int device, int peer, char *why, size_t whylen);
    /* Wait for all work on device. */
    int (*synchronize)(int device);
    /* Pool backends (may be NULL): give cached memory back down to keep
     * bytes; read reserved current/high and used current/high; reset highs. */
    int (*trim)(int device, size_t keep);
    int (*pool_usage)(int device, uint64_t usage[4]);
    int (*pool_reset_peak)(int device);
    /* Address space and page mapping, for expandable segments (may be NULL):
     * reserve size bytes of addresses without memory; map / unmap memory
     * at an address inside a reservation (map counts against capacity and
     * can fail with TALLY_ENOMEM); give a reservation back. Sizes are whole
     * 2 MiB pages. map lays the range out in physical handles of `handle`
     * bytes each (a multiple of 2 MiB; the last one may be shorter): 2 MiB
     * is a handle per page, handle >= size one handle for the whole call
     * (on CUDA: one cuMemCreate and one cuMemMap per handle). An unmap
     * covers whole handles only, of one or several map calls (CUDA unmaps a
     * mapping only whole); both backends refuse any other unmap
     * (docs/architecture.md). unmap waits for no work: the caller first
     * waits for the stream that used the pages (stream_sync). */
    int (*reserve)(int device, size_t size, void **ptr, char *why, size_t whylen);
    int (*map)(int device, void *ptr, size_t size, size_t handle, char *why, size_t whylen);
    int (*unmap)(int device, void *ptr, size_t size);
    int (*unreserve)(int device, void *ptr, size_t size);
    /* A move of pages (may be NULL): with on, the one-page handles that
     * unmap takes down are kept, and map uses them before making new ones
     * (on CUDA no cuMemRelease there and no cuMemCreate here); off releases
     * those left. The memory of a kept handle is still the device's, so the
     * cache turns it on only around one move, under the device's lock. */
    void (*keep_handles)(int device, bool on);
    /* Sleep and wake of private tags (may be NULL: offload refused). Host
     * memory for backups (pinned on CUDA) and copies between it and mapped
     * device memory; each copy is complete when it returns. TALLY_ENOMEM
     * when host memory runs out, TALLY_EBACKEND otherwise, with why. */
    int (*host_alloc)(int device, size_t size, void **ptr, char *why, size_t whylen);
    void (*host_free)(int device, void *ptr, size_t size);
    int (*copy_to_host)(int device, void *host, const void *dev, size_t size, char *why, size_t whylen);
    int (*copy_to_device)(int device, void *dev, const void *host, size_t size, char *why, size_t whylen);
    void (*shutdown)(void);
} tally_backend_t;

extern const tally_backend_t tally__backend_host;
/* lib/backend/cuda/: CUDA's driver API, loaded at run time (always compiled). */
extern const tally_backend_t tally__backend_cuda;
extern const tally_backend_t tally__backend_async;
/* Load the CUDA driver (once) for backend:auto; the device count (> 0) or 0
 * with why set (lib/backend/cuda/loader.c). */
int tally__cu_load(char *why, size_t whylen);
bool tally__cu_loaded(void); /* libcuda.so.1 was found (it may still be unusable) */

/* Host backend controls (backend_host.c), reached through the public API. */
int tally__host_stream_hold(void *stream, int hold);
int tally__host_fail_alloc(uint64_t nth, uint64_t every);
int tally__host_calls(int device, tally_host_calls_t *out);
/* host_arena.c: a segment of size bytes at the lowest free address of the
 * device's range (reserved at first use, 4 x capacity); 0, or -1 when the
 * range cannot be had or is full (the caller then maps the segment alone).
 * give returns whether ptr was the arena's (then it is given back). */
int tally__host_arena_take(int device, size_t size, uint64_t capacity, bool backed, void **out);
bool tally__host_arena_give(int device, void *ptr, size_t size, bool backed);

#endif
