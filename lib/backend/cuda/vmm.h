/* The cuda backend's address-space functions for expandable segments, on
 * CUDA's virtual memory management API (lib/backend/cuda/vmm.c; the contract is
 * backend.h's reserve / map / unmap / unreserve). */
#ifndef TALLY_CUDA_VMM_H
#define TALLY_CUDA_VMM_H

#include "backend/cuda/cu.h"

/* cuMemAddressReserve of size rounded up to 2 MiB pages; the first call on
 * a device checks that it supports virtual memory management. */
int tally__cu_vmm_reserve(int device, size_t size, void **ptr, char *why, size_t whylen);
/* Map [ptr, ptr + size) of a reservation in handles of `handle` bytes (the
 * last may be shorter): per handle cuMemCreate (or a kept one-page handle,
 * tally__cu_vmm_keep), cuMemMap, and cuMemRelease once unmapped; one
 * cuMemSetAccess. TALLY_ENOMEM when the device is full (nothing stays
 * mapped). */
int tally__cu_vmm_map(int device, void *ptr, size_t size, size_t handle, char *why, size_t whylen);
/* Wait for the device, then unmap the mapped pages of [ptr, ptr + size);
 * refused if that would cut a handle. */
int tally__cu_vmm_unmap(int device, void *ptr, size_t size);
/* on: one-page handles unmapped from now on are kept unreleased, and maps
 * take them before making new ones; off: the ones left are released. */
void tally__cu_vmm_keep(int device, bool on);
/* Unmap what is left of a reservation and free its addresses. */
int tally__cu_vmm_unreserve(int device, void *ptr, size_t size);
/* Let peer read and write device's pages: those mapped now (one
 * cuMemSetAccess per run) and every later one. Refused when
 * cuDeviceCanAccessPeer says the peer cannot. */
int tally__cu_vmm_peer_access(int device, int peer, char *why, size_t whylen);
/* Bytes mapped in the device's reservations (tests). */
size_t tally__cu_vmm_mapped_bytes(int device);

/* host_copy.c: pinned host memory and copies for a sleep with offload. */
int tally__cu_host_alloc(int device, size_t size, void **ptr, char *why, size_t whylen);
void tally__cu_host_free(int device, void *ptr, size_t size);
int tally__cu_copy_to_host(int device, void *host, const void *dev, size_t size, char *why, size_t whylen);
int tally__cu_copy_to_device(int device, void *dev, const void *host, size_t size, char *why, size_t whylen);

#define TALLY_CU_BACKEND_VMM                                                                                       \
    .reserve = tally__cu_vmm_reserve, .map = tally__cu_vmm_map, .unmap = tally__cu_vmm_unmap,                      \
    .unreserve = tally__cu_vmm_unreserve, .keep_handles = tally__cu_vmm_keep,                                       \
    .pool_peer_access = tally__cu_vmm_peer_access

#endif
