#include "common/huge_page_malloc.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace cohort {
namespace {

constexpr char kTunable[] = "glibc.malloc.hugetlb";

}  // namespace

bool TunableIsSet(const char* tunables, std::string_view name) {
  if (tunables == nullptr) return false;
  // GLIBC_TUNABLES is `name=value` pairs separated by colons.
  std::string_view rest = tunables;
  while (!rest.empty()) {
    const size_t colon = rest.find(':');
    const std::string_view pair = rest.substr(0, colon);
    if (pair.substr(0, pair.find('=')) == name) return true;
    if (colon == std::string_view::npos) break;
    rest.remove_prefix(colon + 1);
  }
  return false;
}

std::optional<std::string> HugePageTunables(const char* tunables, const char* opt_out,
                                            std::string_view thp_enabled) {
  if (opt_out != nullptr && std::string_view(opt_out) == "0") return std::nullopt;
  // The selected mode is the bracketed one; under "never" (or an unknown
  // kernel) there is nothing to ask for.
  if (thp_enabled.find("[madvise]") == std::string_view::npos &&
      thp_enabled.find("[always]") == std::string_view::npos) {
    return std::nullopt;
  }
  // Already set, by an earlier start of this process or by the operator.
  if (TunableIsSet(tunables, kTunable)) return std::nullopt;
  const std::string current = tunables == nullptr ? "" : tunables;
  const std::string setting = absl::StrCat(kTunable, "=1");
  if (current.empty()) return setting;
  return absl::StrCat(current, ":", setting);
}

void ReexecWithHugePageMalloc(char** argv) {
  std::string thp;
  {
    std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
    std::getline(in, thp);
  }
  const std::optional<std::string> tunables =
      HugePageTunables(std::getenv("GLIBC_TUNABLES"), std::getenv("COHORT_HUGE_PAGE_MALLOC"), thp);
  if (!tunables) return;
  if (setenv("GLIBC_TUNABLES", tunables->c_str(), /*overwrite=*/1) != 0) return;
  // The binary's own path rather than /proc/self/exe, which would rename
  // the process (and every thread) "exe" in ps, top and perf.
  char path[4096];
  const ssize_t length = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (length > 0) {
    path[length] = '\0';
    execv(path, argv);  // fails when the binary was replaced or removed since
  }
  execv("/proc/self/exe", argv);
  // Still here: this process runs with 4 KiB pages (its children would
  // start with the tunable).
  const int error = errno;
  std::fprintf(stderr,
               "%s: cannot re-execute with transparent huge pages for malloc (%s); going on "
               "without them\n",
               argv[0], std::strerror(error));
}

}  // namespace cohort
