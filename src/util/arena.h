/* arena: the few large allocations of a run (parameters, gradients, optimizer state,
 * activations, scratch), each made once from the plan and touched before step 1, so no step
 * ever takes a page fault (≈ 20 µs each in this VM) or calls the allocator. */
#ifndef STEPSCOPE_ARENA_H
#define STEPSCOPE_ARENA_H

#include <stddef.h>

/* Zero-filled, 2 MiB-aligned, transparent huge pages requested, every page touched.
 * NULL (and one line in err) when the memory is not there. */
void *arena_alloc(size_t bytes, const char *what, char *err, size_t errlen);
void arena_free(void *p, size_t bytes);

#endif
