#pragma once
// cohortctl's entry point as a library: runs one command described by a
// CtlConfig against the coordinator and returns the process exit code
// (kExitOk, kExitFailure, kExitUnreachable, kExitUsage in command_line.h).
//
// Results go to `out`; diagnostics go to `err`, one line each, as
//   cohortctl: cannot reach the coordinator at ADDR (reason)     exit 2
//   cohortctl: <command>: <CODE_NAME>: <coordinator's message>   exit 1
//   cohortctl: FILE: <reason>                                    exit 1
//   cohortctl: <usage problem>, then the help text               exit 64
//
// Thread-compatible: concurrent runs need their own streams.

#include <ostream>

#include "absl/strings/string_view.h"
#include "tools/cohortctl/ctl_config.h"

namespace cohort::cohortctl {

int RunCohortctl(const CtlConfig& config, std::ostream& out, std::ostream& err);

// Writes "cohortctl: <message>", a blank line and the help text to `err`;
// returns kExitUsage. For usage problems found before a CtlConfig exists.
int ReportUsageError(absl::string_view message, std::ostream& err);

}  // namespace cohort::cohortctl
