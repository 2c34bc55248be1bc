#pragma once
// Transparent huge pages for malloc, for the processes that move checkpoint
// and training state through host memory (coordinator, worker).
//
// Memory a process touches for the first time is zeroed page by page. With
// 4 KiB pages that runs at 0.4-1.5 GB/s on the development VMs (slower
// still for memory the balloon driver gave back to the host), so the first
// checkpoint after a start spent most of its time faulting in RocksDB
// memtables and chunk buffers; with 2 MiB pages the same faults run at
// about 6 GB/s (docs/architecture.md, "Checkpoints"). Where the kernel's
// transparent huge pages are in "madvise" mode (Debian's default), malloc
// must ask for them, which glibc does under the tunable
// glibc.malloc.hugetlb=1. glibc reads tunables only when a process starts,
// so the process re-executes itself once with the tunable set.
//
// Operators opt out with COHORT_HUGE_PAGE_MALLOC=0, or choose for
// themselves by setting glibc.malloc.hugetlb in GLIBC_TUNABLES (any value
// of it is left alone).

#include <optional>
#include <string>
#include <string_view>

namespace cohort {

// The GLIBC_TUNABLES value to re-execute with, or nullopt to go on as is.
// `tunables` and `opt_out` are the values of GLIBC_TUNABLES and
// COHORT_HUGE_PAGE_MALLOC (nullptr when unset); `thp_enabled` is the text of
// /sys/kernel/mm/transparent_hugepage/enabled ("always [madvise] never"),
// empty when it cannot be read.
std::optional<std::string> HugePageTunables(const char* tunables, const char* opt_out,
                                            std::string_view thp_enabled);

// Whether the GLIBC_TUNABLES value `tunables` (nullptr when unset) sets
// `name` (e.g. "glibc.malloc.arena_max"), so that the process leaves it to
// the operator.
bool TunableIsSet(const char* tunables, std::string_view name);

// Call first thing in main(): re-executes the program (same pid, arguments
// and environment plus the tunable) when HugePageTunables says so. Returns
// when there is nothing to do, and when the re-execution fails (after
// saying why on stderr), in which case the process runs without them.
void ReexecWithHugePageMalloc(char** argv);

}  // namespace cohort
