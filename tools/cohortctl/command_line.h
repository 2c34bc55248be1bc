#pragma once
// cohortctl's command line: the documented flag table, the help text, a scan
// of argv into flags and operands, and the check that a command got the
// operands and flags it takes. Pure functions, thread-safe.

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "cohort/v1/job.pb.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "tools/cohortctl/ctl_config.h"

namespace cohort::cohortctl {

// Process exit codes.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;      // RPC error, bad file, job failed
inline constexpr int kExitUnreachable = 2;  // no connection to the coordinator
inline constexpr int kExitUsage = 64;       // EX_USAGE

enum class FlagKind { kBool, kValue };

// One flag: its declaration, its help and, for a submit flag, the JobSpec
// field it sets. main.cc defines an absl flag of the same name for each entry
// that is not a spec flag; spec flags go to CtlConfig::spec as text.
struct FlagDoc {
  const char* name;  // without dashes
  FlagKind kind;
  const char* value_name;  // shown as --name=VALUE; empty for bools
  const char* section;     // heading it is listed under in the help text
  const char* help;        // one line; the default follows (see FlagHelp)
  // The JobSpec field (path of names, e.g. "optimizer.warmup_steps") a
  // submit flag sets (spec_fields.h), whose type is the flag's; the help
  // shows the demo job's value of it, so help and what submit sends cannot
  // disagree. Null for other flags.
  const char* spec_field;
};

// A flag's help: `help`, then for a spec flag the demo job's value of its
// field in parentheses.
std::string FlagHelp(const FlagDoc& flag);

// Every flag cohortctl accepts, in help order.
absl::Span<const FlagDoc> FlagDocs();

// The entry of flag `name` (without dashes); null when there is none.
const FlagDoc* FindFlagDoc(absl::string_view name);

// The full help text: commands, every flag, exit codes. Ends with '\n'.
std::string UsageText();

struct ScannedCommandLine {
  // (flag name, value text) in command-line order; a bool flag given bare is
  // "true", and --noNAME is "false".
  std::vector<std::pair<std::string, std::string>> flags;
  std::vector<std::string> positional;
  bool help = false;  // -h, --help or -help was given
};

// Splits `args` (argv without the program name) into flags and operands, the
// way absl flags reads them: --name=value, --name value (non-bool flags),
// -name, --noname for bools, and "--" ends the flags. Returns
// InvalidArgument (a usage error) for an unknown flag or a missing value;
// values are not checked here.
absl::StatusOr<ScannedCommandLine> ScanCommandLine(const std::vector<std::string>& args);
// The same over another tool's flags (cohort-sample's).
absl::StatusOr<ScannedCommandLine> ScanCommandLine(const std::vector<std::string>& args,
                                                   absl::Span<const FlagDoc> flags);

enum class CommandKind {
  kHelp,
  kSubmit,
  kList,
  kGet,
  kWatch,
  kCancel,
  kDelete,
  kScale,
  kWorkers,
  kDrain,
  kCheckpoints,
  kPlot,
};

enum class CheckpointsCommand { kList, kShow, kDelete, kExport };

struct Command {
  CommandKind kind = CommandKind::kHelp;
  std::string name;     // as typed, e.g. "submit"
  std::string operand;  // FILE, JOB or WORKER; empty when the command takes none
  // checkpoints: the subcommand and its STEP operand (absent: the newest).
  CheckpointsCommand checkpoints = CheckpointsCommand::kList;
  std::optional<int64_t> step;
  // scale: the bounds to set, from --workers=N (both N) or from
  // --min_workers=A [--max_workers=B] (B defaults to A).
  int32_t min_workers = 0;
  int32_t max_workers = 0;
};

// Reads the command from config.args and checks its operands and that only
// flags it takes are set. InvalidArgument with a one-line reason otherwise.
absl::StatusOr<Command> ParseCommand(const CtlConfig& config);

// The coordinator address: the flag when given, else the environment
// variable COHORT_COORDINATOR's value (`env`, may be null or empty), else
// localhost:7070. InvalidArgument unless it is HOST:PORT with a port from 1
// to 65535 (naming where the value came from).
// The bearer token sent with every request (cohortctl and cohort-sample
// alike): the contents of --token_file (`flag`) when given, else of
// $COHORT_TOKEN_FILE (`file_env`), else $COHORT_TOKEN (`token_env`), each
// stripped of surrounding whitespace; "" when none is set. InvalidArgument
// (a usage error) for a file that cannot be read or holds only whitespace.
absl::StatusOr<std::string> ResolveBearerToken(const std::optional<std::string>& flag,
                                               const char* file_env, const char* token_env);

absl::StatusOr<std::string> ResolveCoordinatorAddress(const std::optional<std::string>& flag,
                                                      const char* env);

// --timeout in seconds: positive, finite, at most kMaxTimeoutSeconds (a
// week, enough for exporting the largest checkpoint) so that every request
// has a deadline that ends.
inline constexpr double kMaxTimeoutSeconds = 7 * 24 * 3600;
absl::StatusOr<absl::Duration> ParseTimeout(double seconds);

// "table" or "json"; InvalidArgument otherwise.
absl::StatusOr<OutputFormat> ParseOutputFormat(absl::string_view text);

// "--name" for every spec flag that is set, once each, in SpecFlags order.
std::vector<std::string> SetSpecFlagNames(const SpecFlags& spec);

}  // namespace cohort::cohortctl
