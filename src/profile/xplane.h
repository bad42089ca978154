/* xplane: writes a trace as an XProf XSpace (<host>.xplane.pb), the file XProf and the
 * TensorBoard profile plugin open. Layout: hostnames=[host]; one plane, id 0, "/host:CPU";
 * one XLine per non-empty lane (id = tid, name = lane name, timestamp_ns = epoch ns of the
 * earliest written event, the same for every line), lines sorted by name; events sorted by
 * start, then longer first, so parents precede children; offsets and durations in ps. Root
 * step spans carry stats _r = 1 and step_num = N (int64, which XProf's IntValue needs), so
 * XProf shows them as steps "train N"; other spans with flops > 0 carry "flops" (uint64) and
 * with bytes > 0 "bytes_accessed" (uint64), XProf's cost-model stats. Where the compute lane's
 * kernels have rates, a last line "_counters_" (id INT64_MAX) holds the two rate counters of
 * chrome_trace.h, one zero-length event a sample with a double stat "GFLOP/s" or "GB/s", which
 * XProf's trace viewer draws as counter tracks. The compute lane's kernel spans (the op summary's)
 * carry "tf_op" = "<part>/<name>:<category>" as a ref_value (one interned string a name), which
 * XProf's host op table (framework_op_stats) counts; the data wait also carries
 * "_ipl_stage_name", so XProf's step breakdown counts it as input time.
 * Fields are written in field-number order and map entries by key, so the bytes equal
 * protobuf's deterministic serialization. */
#ifndef STEPSCOPE_XPLANE_H
#define STEPSCOPE_XPLANE_H

#include <stddef.h>
#include <stdint.h>

#include "profile/pb.h"
#include "profile/trace.h"

/* Step window: with 0 <= first_step <= last_step, only events overlapping the time from the
 * start of the first root step numbered in [first_step, last_step] to the end of the last
 * such step are written (data-thread spans that straddle the edge included). With
 * first_step < 0, or no root step in range, every recorded event is written. */

/* The memory plan's buffers, for XProf's memory profile (NULL: none). The arena is mapped at set-up
 * and nothing is allocated while stepping, so the XPlane carries one "MemoryAllocation" event a
 * buffer at the start of the written window, on a line of their own ("memory plan"), with the
 * stats XProf's memory profile reads: allocator_name, tf_op (the buffer's name), region_type,
 * data_type (TensorFlow's DataType enum; left out for a buffer of several), requested_bytes and
 * allocation_bytes, addr (its offset in the plan), and the running bytes_allocated,
 * peak_bytes_in_use and bytes_available. XProf's tools then show the plan as the memory in use
 * through the profiled steps, with a breakdown by buffer. */
enum { XPLANE_DT_MIXED = 0, XPLANE_DT_FLOAT = 1, XPLANE_DT_INT32 = 3, XPLANE_DT_BFLOAT16 = 14 };
typedef struct xplane_buffer {
    const char *name;
    uint64_t bytes;
    int data_type;          /* XPLANE_DT_* */
    const char *region;     /* "persist" (kept across steps) or "temp" (a step's working memory) */
} xplane_buffer_t;
typedef struct xplane_memory {
    const char *allocator;
    const xplane_buffer_t *buffers;
    size_t count;
    uint64_t capacity_bytes; /* the memory the run may use; bytes_available is this less the allocated */
} xplane_memory_t;

/* Serialize to out (appended). The epoch base is the earliest written event's start plus
 * t->wall_minus_mono_ns, so tests pin timestamp_ns by setting that field. 0, or -1 + err. */
int xplane_encode(const trace_t *t, const char *hostname, int64_t first_step, int64_t last_step,
                  const xplane_memory_t *memory, pb_buf_t *out, char *err, size_t errlen);
/* Encode and write path atomically (whole file or none). 0, or -1 + err. */
int xplane_write(const trace_t *t, const char *path, const char *hostname, int64_t first_step,
                 int64_t last_step, const xplane_memory_t *memory, char *err, size_t errlen);

#endif
