/* chrome_trace: writes a trace as Chrome Trace Event JSON, gzipped (<host>.trace.json.gz),
 * which Perfetto (ui.perfetto.dev) and chrome://tracing open directly. Object form starting
 * exactly with {"traceEvents":[ (older Perfetto sniffs that prefix); process_name and
 * thread_name metadata events; every span a complete event ("ph":"X") with ts and dur in
 * microseconds, 3 decimals, relative to the earliest event (small numbers keep ns precision
 * in a JSON double); pid 1, tid = the lane's tid; root steps carry "args":{"step_num":N},
 * spans with flops or bytes "args":{"flops":F,"bytes_accessed":B} (each only when > 0); two
 * counter tracks, "compute lane GFLOP/s" and "compute lane GB/s" ("ph":"C"), give each
 * outermost kernel span's rate on the compute lane from its start, and 0 from its end where no
 * kernel follows at once;
 * displayTimeUnit comes after the array so no Perfetto version reads it as the unit of ts. The
 * gzip stream is one member (catapult chokes on concatenated ones) and the file is written
 * atomically. */
#ifndef STEPSCOPE_CHROME_TRACE_H
#define STEPSCOPE_CHROME_TRACE_H

#include <stddef.h>

#include "profile/trace.h"

/* 0, or -1 with err set; on failure nothing is left at path_json_gz. */
int chrome_trace_write(const trace_t *t, const char *path_json_gz, char *err, size_t errlen);

#endif
