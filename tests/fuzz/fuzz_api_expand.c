/* Fuzz target: fuzz_api (the public API against a model; see fuzz_api.c)
 * with expandable_segments:true, so the large pool lives in one reserved
 * range per stream with 2 MiB pages mapped and unmapped under it
 * (lib/cache/expand.c), and the injected backend failures hit the map calls. */
#define CONF                                                                                                       \
    "backend:host,host_devices:3,host_capacity:96MiB,host_mode:virtual,expandable_segments:true,"                  \
    "max_split_size_mb:24,garbage_collection_threshold:0.7,timeline_events:64,leak_report:off,stage_report:true"
#include "fuzz_api.c"
