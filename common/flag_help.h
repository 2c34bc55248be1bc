#pragma once
// `--help` for the daemons: the usage message and every flag defined in
// their own sources, on stdout, then exit 0. (Abseil's --help of this
// version lists only flags of a file named like the binary and exits 1.)
// Header-only: only binaries that link absl::flags include it.

#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"

namespace cohort {

// If argv holds -h, --help, -help, --helpfull or --helpshort: prints the help
// of the flags whose source path contains `source_part` (e.g.
// "coordinator/main.cc") and exits 0.
inline void ExitWithHelpIfAsked(int argc, char** argv, absl::string_view source_part) {
  bool asked = false;
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "--") break;
    asked |= arg == "-h" || arg == "--help" || arg == "-help" || arg == "--helpfull" ||
             arg == "--helpshort";
  }
  if (!asked) return;
  std::printf("%s\n\nFlags:\n", std::string(absl::ProgramUsageMessage()).c_str());
  std::map<std::string, const absl::CommandLineFlag*> sorted;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (absl::StrContains(flag->Filename(), source_part)) sorted[std::string(name)] = flag;
  }
  for (const auto& [name, flag] : sorted) {
    std::printf("  --%s (default: %s)\n      %s\n", name.c_str(), flag->DefaultValue().c_str(),
                flag->Help().c_str());
  }
  std::fflush(stdout);
  std::exit(0);
}

}  // namespace cohort
