#include "tools/cohortctl/command_line.h"

#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "common/flag_checks.h"
#include "common/job_spec/defaults.h"
#include "common/tls_credentials.h"
#include "tools/cohortctl/spec_builder.h"
#include "tools/cohortctl/spec_fields.h"

namespace cohort::cohortctl {
namespace {

constexpr char kGlobal[] = "Global flags (any command):";
constexpr char kList[] = "list flags:";
constexpr char kSubmit[] =
    "submit flags (override FILE's fields; without a FILE, the demo job's\n"
    "values shown in parentheses apply):";
constexpr char kElastic[] = "Elastic bounds (submit and scale):";
constexpr char kScale[] = "scale flags:";
constexpr char kDrain[] = "drain flags:";
constexpr char kExport[] = "checkpoints export flags:";

constexpr std::array<FlagDoc, 40> kFlags = {{
    {"coordinator", FlagKind::kValue, "HOST:PORT", kGlobal,
     "coordinator gRPC address (default: $COHORT_COORDINATOR, else "
     "localhost:7070)", nullptr},
    {"output", FlagKind::kValue, "table|json", kGlobal,
     "table for people; json prints protobuf's JSON mapping of the reply "
     "(watch: one JSON object per line) (default: table)", nullptr},
    {"timeout", FlagKind::kValue, "SECONDS", kGlobal,
     "deadline of each request, and how long watch waits to connect "
     "(default: 10)", nullptr},
    {"tls_ca", FlagKind::kValue, "FILE", kGlobal,
     "PEM bundle that signed the coordinator's certificate; set: connect "
     "with TLS (default: $COHORT_TLS_CA, else plaintext)", nullptr},
    {"tls_cert", FlagKind::kValue, "FILE", kGlobal,
     "PEM client certificate, if the cluster wants one (needs --tls_ca)", nullptr},
    {"tls_key", FlagKind::kValue, "FILE", kGlobal, "PEM private key of --tls_cert", nullptr},
    {"tls_server_name", FlagKind::kValue, "NAME", kGlobal,
     "name the coordinator's certificate must carry when it differs from "
     "the host of --coordinator", nullptr},
    {"token_file", FlagKind::kValue, "FILE", kGlobal,
     "file holding the bearer token sent with every request (needs TLS) "
     "(default: $COHORT_TOKEN_FILE; the token itself may be given in "
     "$COHORT_TOKEN)", nullptr},
    // Help is handled by the scanner; listed so the text documents it.
    {"help", FlagKind::kBool, "", kGlobal, "print this text (also: -h, help)", nullptr},
    {"all", FlagKind::kBool, "", kList, "also list COMPLETED, FAILED and CANCELLED jobs", nullptr},
    {"validate_only", FlagKind::kBool, "", kSubmit,
     "have the coordinator check the spec without creating a job", nullptr},
    {"name", FlagKind::kValue, "NAME", kSubmit,
     "job name, [a-z0-9][a-z0-9-]{0,62}", "name"},
    {"device", FlagKind::kValue, "cpu|gpu", kSubmit,
     "kind of device the workers train on", "device_kind"},
    {"precision", FlagKind::kValue, "fp32|tf32|bf16", kSubmit,
     "arithmetic of the matmuls and activations; tf32 and bf16 need --device=gpu (unset: bf16 "
     "on GPU, fp32 on CPU)", "model.precision"},
    {"layers", FlagKind::kValue, "N", kSubmit,
     "transformer blocks", "model.layers"},
    {"heads", FlagKind::kValue, "N", kSubmit,
     "attention heads", "model.heads"},
    {"width", FlagKind::kValue, "N", kSubmit,
     "embedding width d_model", "model.width"},
    {"vocab", FlagKind::kValue, "N", kSubmit,
     "vocabulary size", "model.vocab_size"},
    {"context", FlagKind::kValue, "N", kSubmit,
     "context length, tokens per sample", "model.context_length"},
    {"seed", FlagKind::kValue, "N", kSubmit,
     "data seed; with synthetic data also the source's seed", "data.seed"},
    {"data_shards", FlagKind::kValue, "GLOB", kSubmit,
     "train on the llm.c token shards matching GLOB instead of synthetic data", "data.shards.pattern"},
    {"lr", FlagKind::kValue, "X", kSubmit,
     "peak learning rate", "optimizer.learning_rate"},
    {"min_lr", FlagKind::kValue, "X", kSubmit,
     "learning rate at the end of the cosine decay", "optimizer.min_learning_rate"},
    {"warmup", FlagKind::kValue, "N", kSubmit,
     "warmup steps", "optimizer.warmup_steps"},
    {"weight_decay", FlagKind::kValue, "X", kSubmit,
     "AdamW weight decay", "optimizer.weight_decay"},
    {"grad_clip", FlagKind::kValue, "X", kSubmit,
     "global gradient norm clip, 0 disables", "optimizer.grad_clip"},
    {"global_batch", FlagKind::kValue, "N", kSubmit,
     "sequences per optimizer step", "batch.global_batch_size"},
    {"micro_batch", FlagKind::kValue, "N", kSubmit,
     "sequences per micro-batch, divides --global_batch", "batch.micro_batch_size"},
    {"tensor", FlagKind::kValue, "N", kSubmit,
     "tensor parallel degree", "parallelism.tensor"},
    {"pipeline", FlagKind::kValue, "N", kSubmit,
     "pipeline parallel degree", "parallelism.pipeline"},
    {"zero1", FlagKind::kBool, "", kSubmit,
     "shard optimizer state across the data parallel group", "parallelism.zero1"},
    {"steps", FlagKind::kValue, "N", kSubmit,
     "optimizer steps to run", "steps"},
    {"checkpoint_interval", FlagKind::kValue, "N", kSubmit,
     "checkpoint every N steps, 0 disables", "checkpoint.interval_steps"},
    {"keep_last", FlagKind::kValue, "N", kSubmit,
     "checkpoints to retain, 0 means 3", "checkpoint.keep_last"},
    {"min_workers", FlagKind::kValue, "N", kElastic,
     "fewest workers the job runs with; scale needs it or --workers", "elastic.min_workers"},
    {"max_workers", FlagKind::kValue, "N", kElastic,
     "most workers the job grows to; scale: defaults to --min_workers", "elastic.max_workers"},
    {"workers", FlagKind::kValue, "N", kScale,
     "run the job on exactly N workers: --min_workers=N --max_workers=N "
     "(not with either of them)", nullptr},
    {"reason", FlagKind::kValue, "TEXT", kDrain,
     "why the worker leaves; the coordinator logs it and gives it as the "
     "reason its job is re-planned (default: drained by an operator)", nullptr},
    {"out", FlagKind::kValue, "FILE", kExport,
     "file to write (required; also plot's SVG file)", nullptr},
    {"format", FlagKind::kValue, "safetensors|hf-gpt2", kExport,
     "file layout: safetensors (Cohort's tensor names) or hf-gpt2 (Hugging Face "
     "GPT-2's, for transformers' GPT2LMHeadModel) (default: safetensors)", nullptr},
}};

static_assert(kDefaultKeepLast == 3, "--keep_last's help says what 0 means");

constexpr char kCommandsText[] =
    R"(cohortctl: command-line client of the Cohort coordinator.

Usage: cohortctl [flags] COMMAND [OPERAND] [flags]

Commands:
  submit FILE             submit the job spec in FILE (.yaml, .yml or .json: a
                          cohort.v1.JobSpec, e.g. deploy/local/jobs/demo.yaml);
                          prints the job id and state
  submit --name=NAME ...  submit a job built from the submit flags
  list [--all]            table of jobs: JOB, NAME, STATE, GEN, WORKERS,
                          MESH (data x tensor x pipeline), STEP/STEPS, MESSAGE
  get JOB                 a job's spec, progress, recoveries and mesh (RANK,
                          WORKER, HOST, DEVICE, DATA, TENSOR, PIPELINE)
  watch JOB               follow a job until it finishes: a live progress line
                          on a terminal, else one line per event; exit status
                          0 when it COMPLETED, 1 when it FAILED or was
                          CANCELLED
  cancel JOB              cancel a job
  delete JOB              delete a finished job's record (its checkpoints
                          stay); finished jobs are also deleted after the
                          coordinator's --finished_job_retention (7 days)
  scale JOB --workers=N   run a job on exactly N workers (both bounds N)
  scale JOB --min_workers=A [--max_workers=B]
                          change a job's elastic bounds
  workers                 table of workers: WORKER, HOST, DEVICE, STATE, JOB,
                          RANK, SPARE (what an idle worker prepared ahead
                          as a warm spare: warm/warming/cold JOB:RANK),
                          HEARTBEAT AGE, METRICS
  drain WORKER [--reason=TEXT]
                          take a worker out of service: it gets no new work,
                          its job is re-planned without it (it hands its
                          state over first), then it exits
  checkpoints list JOB    a job's committed checkpoints: STEP, GENERATION,
                          LAYOUT, TENSORS, CHUNKS, SIZE, COMMITTED
  checkpoints show JOB [STEP]
                          a checkpoint's manifest (default: the newest):
                          layout, objects, and every tensor's shape, chunks
                          and writers
  checkpoints delete JOB STEP
                          delete a committed checkpoint and free its bytes
  checkpoints export JOB [STEP] --out=FILE [--format=safetensors|hf-gpt2]
                          write a checkpoint's model weights, unsharded, as
                          one safetensors file (default: the newest) in
                          Cohort's layout or Hugging Face GPT-2's
  plot JOB --out=FILE.svg draw the job's training and validation loss against
                          step (the coordinator's history of it) as an SVG
                          image
  sample JOB [STEP] --prompt=TEXT --tokens=N [--temperature=T --top_k=K
         --seed=S --tokenizer=byte|gpt2 --vocab=F --merges=F]
                          generate text on this machine's CPU from a committed
                          checkpoint (default: the newest); runs the
                          cohort-sample program installed beside cohortctl
                          with these arguments (cohort-sample --help)
  help                    print this text
)";

constexpr char kExitText[] =
    R"(Exit status: 0 success; 1 the coordinator refused the request, the job
failed or was cancelled (watch), or FILE is unreadable; 2 the coordinator
cannot be reached; 64 usage error.
)";

constexpr size_t kTextWidth = 79;
constexpr int kHelpColumn = 27;

// Splits `text` into lines of at most `width` characters at spaces (a longer
// word gets a line of its own).
std::vector<std::string> WrapWords(absl::string_view text, size_t width) {
  std::vector<std::string> lines;
  std::string line;
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (!line.empty() && line.size() + 1 + word.size() > width) {
      lines.push_back(std::move(line));
      line.clear();
    }
    if (!line.empty()) line.push_back(' ');
    absl::StrAppend(&line, word);
  }
  if (!line.empty()) lines.push_back(std::move(line));
  return lines;
}

absl::Status UsageError(absl::string_view message) { return absl::InvalidArgumentError(message); }

const FlagDoc* FindIn(absl::Span<const FlagDoc> flags, absl::string_view name) {
  for (const FlagDoc& flag : flags) {
    if (name == flag.name) return &flag;
  }
  return nullptr;
}

}  // namespace

absl::Span<const FlagDoc> FlagDocs() { return kFlags; }

const FlagDoc* FindFlagDoc(absl::string_view name) { return FindIn(kFlags, name); }

std::string FlagHelp(const FlagDoc& flag) {
  if (flag.spec_field == nullptr) return flag.help;
  return absl::StrCat(flag.help, " (", SpecFieldText(DemoJobSpec(), flag.spec_field), ")");
}

std::string UsageText() {
  std::string text = kCommandsText;
  const char* section = nullptr;
  for (const FlagDoc& flag : kFlags) {
    if (section == nullptr || absl::string_view(section) != flag.section) {
      section = flag.section;
      absl::StrAppend(&text, "\n", section, "\n");
    }
    std::string left = absl::StrCat("  --", flag.name);
    if (flag.kind == FlagKind::kValue) {
      absl::StrAppend(&left, "=", flag.value_name);
    }
    // Two columns: the flag, then its help wrapped to kTextWidth.
    std::vector<std::string> lines = WrapWords(FlagHelp(flag), kTextWidth - kHelpColumn);
    if (left.size() + 2 > kHelpColumn) {
      absl::StrAppend(&text, left, "\n");
      left.clear();
    }
    for (const std::string& line : lines) {
      absl::StrAppendFormat(&text, "%-*s%s\n", kHelpColumn, left, line);
      left.clear();
    }
  }
  absl::StrAppend(&text, "\n", kExitText);
  return text;
}

absl::StatusOr<ScannedCommandLine> ScanCommandLine(const std::vector<std::string>& args) {
  return ScanCommandLine(args, kFlags);
}

absl::StatusOr<ScannedCommandLine> ScanCommandLine(const std::vector<std::string>& args,
                                                   absl::Span<const FlagDoc> flags) {
  ScannedCommandLine scanned;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      scanned.positional.insert(scanned.positional.end(), args.begin() + i + 1, args.end());
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') {
      scanned.positional.push_back(arg);
      continue;
    }
    absl::string_view body = arg;
    body.remove_prefix(absl::StartsWith(body, "--") ? 2 : 1);
    const size_t eq = body.find('=');
    const absl::string_view name = body.substr(0, eq);
    const bool has_value = eq != absl::string_view::npos;
    const absl::string_view inline_value = has_value ? body.substr(eq + 1) : absl::string_view();
    if (name == "help" || name == "h") {
      scanned.help = true;
      continue;
    }
    const FlagDoc* flag = FindIn(flags, name);
    if (flag == nullptr && !has_value && absl::StartsWith(name, "no")) {
      const FlagDoc* negated = FindIn(flags, name.substr(2));
      if (negated != nullptr && negated->kind == FlagKind::kBool) {
        scanned.flags.emplace_back(negated->name, "false");
        continue;
      }
    }
    if (flag == nullptr) {
      return UsageError(absl::StrCat("unknown flag --", name));
    }
    if (flag->kind == FlagKind::kBool) {
      scanned.flags.emplace_back(flag->name, has_value ? std::string(inline_value) : "true");
      continue;
    }
    if (has_value) {
      scanned.flags.emplace_back(flag->name, std::string(inline_value));
    } else if (i + 1 < args.size()) {
      scanned.flags.emplace_back(flag->name, args[++i]);
    } else {
      return UsageError(
          absl::StrCat("flag --", name, " needs a value (--", name, "=", flag->value_name, ")"));
    }
  }
  return scanned;
}

std::vector<std::string> SetSpecFlagNames(const SpecFlags& spec) {
  std::vector<std::string> names;
  for (const auto& [name, value] : spec) {
    std::string flag = absl::StrCat("--", name);
    if (std::find(names.begin(), names.end(), flag) == names.end()) names.push_back(std::move(flag));
  }
  return names;
}

namespace {

// Flags that belong to one command only, as "--name" for each one set.
std::vector<std::string> CommandFlagNames(const CtlConfig& config) {
  std::vector<std::string> flags = SetSpecFlagNames(config.spec);
  if (config.all) flags.push_back("--all");
  if (config.validate_only) flags.push_back("--validate_only");
  if (config.out.has_value()) flags.push_back("--out");
  if (config.format.has_value()) flags.push_back("--format");
  if (config.workers.has_value()) flags.push_back("--workers");
  if (config.reason.has_value()) flags.push_back("--reason");
  return flags;
}

// Sets command->min_workers and max_workers from --workers=N or from
// --min_workers=A [--max_workers=B] (their values are in `given`, the spec
// flags applied to an empty spec); a usage error when neither form is given,
// or when --workers is mixed with the other two.
absl::Status ResolveScaleBounds(const CtlConfig& config, const v1::JobSpec& given,
                                Command* command) {
  const std::vector<std::string> set = SetSpecFlagNames(config.spec);
  auto is_set = [&set](const char* flag) {
    return std::find(set.begin(), set.end(), flag) != set.end();
  };
  if (config.workers.has_value()) {
    std::vector<std::string> conflicting;
    if (is_set("--min_workers")) conflicting.push_back("--min_workers");
    if (is_set("--max_workers")) conflicting.push_back("--max_workers");
    if (!conflicting.empty()) {
      return UsageError(absl::StrCat("scale: --workers cannot be combined with ",
                                     absl::StrJoin(conflicting, ", "),
                                     " (--workers=N sets both bounds)"));
    }
    command->min_workers = command->max_workers = *config.workers;
    return absl::OkStatus();
  }
  if (!is_set("--min_workers")) {
    return UsageError(
        "scale needs --workers=N, or --min_workers=A (and optionally --max_workers=B)");
  }
  command->min_workers = given.elastic().min_workers();
  command->max_workers =
      is_set("--max_workers") ? given.elastic().max_workers() : command->min_workers;
  return absl::OkStatus();
}

absl::StatusOr<Command> ParseCheckpointsCommand(const CtlConfig& config, Command command,
                                                const std::vector<std::string>& operands) {
  command.kind = CommandKind::kCheckpoints;
  const std::string usage =
      "checkpoints needs a subcommand: list JOB, show JOB [STEP], delete JOB STEP, or export "
      "JOB [STEP] --out=FILE";
  if (operands.empty()) return UsageError(usage);
  const std::string& sub = operands[0];
  size_t max_operands = 2;  // JOB [STEP]
  bool step_required = false;
  if (sub == "list") {
    command.checkpoints = CheckpointsCommand::kList;
    max_operands = 1;
  } else if (sub == "show") {
    command.checkpoints = CheckpointsCommand::kShow;
  } else if (sub == "delete") {
    command.checkpoints = CheckpointsCommand::kDelete;
    step_required = true;
  } else if (sub == "export") {
    command.checkpoints = CheckpointsCommand::kExport;
  } else {
    return UsageError(absl::StrCat("unknown checkpoints subcommand \"", sub, "\"; ", usage));
  }
  const std::vector<std::string> rest(operands.begin() + 1, operands.end());
  if (rest.empty() || rest[0].empty()) {
    return UsageError(absl::StrCat("checkpoints ", sub, " needs a JOB operand"));
  }
  if (rest.size() > max_operands) {
    return UsageError(absl::StrCat("checkpoints ", sub, ": unexpected operand \"",
                                   rest[max_operands], "\""));
  }
  command.operand = rest[0];
  if (rest.size() == 2) {
    int64_t step = 0;
    if (!absl::SimpleAtoi(rest[1], &step) || step < 0) {
      return UsageError(absl::StrCat("checkpoints ", sub, ": STEP must be a step number, not \"",
                                     rest[1], "\""));
    }
    command.step = step;
  } else if (step_required) {
    return UsageError(absl::StrCat("checkpoints ", sub, " needs a STEP operand"));
  }
  std::vector<std::string> misplaced;
  for (const std::string& flag : CommandFlagNames(config)) {
    const bool allowed = command.checkpoints == CheckpointsCommand::kExport &&
                         (flag == "--out" || flag == "--format");
    if (!allowed) misplaced.push_back(flag);
  }
  if (!misplaced.empty()) {
    return UsageError(
        absl::StrCat("checkpoints ", sub, " does not take ", absl::StrJoin(misplaced, ", ")));
  }
  if (command.checkpoints == CheckpointsCommand::kExport) {
    if (!config.out.has_value() || config.out->empty()) {
      return UsageError("checkpoints export needs --out=FILE");
    }
    if (config.format.has_value() && *config.format != "safetensors" &&
        *config.format != "hf-gpt2") {
      return UsageError(
          absl::StrCat("--format must be safetensors or hf-gpt2, not \"", *config.format, "\""));
    }
  }
  return command;
}

}  // namespace

absl::StatusOr<Command> ParseCommand(const CtlConfig& config) {
  if (config.args.empty()) return UsageError("no command given");
  Command command;
  command.name = config.args[0];
  const std::vector<std::string> operands(config.args.begin() + 1, config.args.end());
  // How many operands the command takes: [min, max].
  size_t min_operands = 0;
  size_t max_operands = 0;
  const char* operand_name = "";
  if (command.name == "help") {
    command.kind = CommandKind::kHelp;
    max_operands = operands.size();  // `help anything` still prints the help
  } else if (command.name == "submit") {
    command.kind = CommandKind::kSubmit;
    max_operands = 1;
    operand_name = "FILE";
  } else if (command.name == "list") {
    command.kind = CommandKind::kList;
  } else if (command.name == "get" || command.name == "watch" || command.name == "cancel" ||
             command.name == "delete" || command.name == "scale" || command.name == "plot") {
    command.kind = command.name == "get"      ? CommandKind::kGet
                   : command.name == "watch"  ? CommandKind::kWatch
                   : command.name == "cancel" ? CommandKind::kCancel
                   : command.name == "delete" ? CommandKind::kDelete
                   : command.name == "plot"   ? CommandKind::kPlot
                                              : CommandKind::kScale;
    min_operands = max_operands = 1;
    operand_name = "JOB";
  } else if (command.name == "workers") {
    command.kind = CommandKind::kWorkers;
  } else if (command.name == "drain") {
    command.kind = CommandKind::kDrain;
    min_operands = max_operands = 1;
    operand_name = "WORKER";
  } else if (command.name == "checkpoints") {
    return ParseCheckpointsCommand(config, std::move(command), operands);
  } else {
    return UsageError(absl::StrCat("unknown command \"", command.name, "\""));
  }
  if (operands.size() < min_operands) {
    return UsageError(absl::StrCat(command.name, " needs a ", operand_name, " operand"));
  }
  if (operands.size() > max_operands) {
    return UsageError(
        absl::StrCat(command.name, ": unexpected operand \"", operands[max_operands], "\""));
  }
  if (!operands.empty() && command.kind != CommandKind::kHelp) {
    command.operand = operands[0];
    if (command.operand.empty()) {
      return UsageError(absl::StrCat(command.name, ": empty ", operand_name));
    }
  }

  // Command flags go with their command only, so a typo such as
  // `cohortctl list --tensor 2` is reported instead of ignored.
  const std::vector<std::string> flags = CommandFlagNames(config);
  const std::vector<std::string> spec_flags = SetSpecFlagNames(config.spec);
  std::vector<std::string> misplaced;
  for (const std::string& flag : flags) {
    bool allowed = command.kind == CommandKind::kHelp;
    switch (command.kind) {
      case CommandKind::kSubmit:
        allowed = flag == "--validate_only" ||
                  std::find(spec_flags.begin(), spec_flags.end(), flag) != spec_flags.end();
        break;
      case CommandKind::kList:
        allowed = flag == "--all";
        break;
      case CommandKind::kScale:
        allowed = flag == "--min_workers" || flag == "--max_workers" || flag == "--workers";
        break;
      case CommandKind::kDrain:
        allowed = flag == "--reason";
        break;
      case CommandKind::kPlot:
        allowed = flag == "--out";
        break;
      default:
        break;
    }
    if (!allowed) misplaced.push_back(flag);
  }
  if (!misplaced.empty()) {
    return UsageError(
        absl::StrCat(command.name, " does not take ", absl::StrJoin(misplaced, ", ")));
  }
  // Each spec flag's value must be one of its field's type (an integer in
  // range, true/false, cpu|gpu, ...): checked here, so a bad one is a usage
  // error before anything is sent.
  v1::JobSpec given;
  if (absl::Status values = ApplySpecFlags(config.spec, &given); !values.ok()) {
    return UsageError(values.message());
  }
  if (command.kind == CommandKind::kScale) {
    absl::Status bounds = ResolveScaleBounds(config, given, &command);
    if (!bounds.ok()) return bounds;
  }
  if (command.kind == CommandKind::kPlot && (!config.out.has_value() || config.out->empty())) {
    return UsageError("plot needs --out=FILE.svg");
  }
  if (command.kind == CommandKind::kSubmit && command.operand.empty() &&
      SetSpecFlagNames(config.spec).empty()) {
    return UsageError("submit needs a FILE or spec flags (e.g. cohortctl submit --name=demo)");
  }
  return command;
}

absl::StatusOr<std::string> ResolveBearerToken(const std::optional<std::string>& flag,
                                               const char* file_env, const char* token_env) {
  std::string token_file = flag.value_or("");
  if (!flag.has_value() && file_env != nullptr) token_file = file_env;
  if (!token_file.empty()) {
    absl::StatusOr<std::string> token = ReadSecretFile("--token_file", token_file);
    if (!token.ok()) return UsageError(token.status().message());
    std::string stripped(absl::StripAsciiWhitespace(*token));
    if (stripped.empty()) return UsageError(absl::StrCat("--token_file ", token_file, ": is empty"));
    return stripped;
  }
  if (token_env == nullptr) return std::string();
  return std::string(absl::StripAsciiWhitespace(token_env));
}

absl::StatusOr<std::string> ResolveCoordinatorAddress(const std::optional<std::string>& flag,
                                                      const char* env) {
  std::string address = "localhost:7070";
  std::string source = "coordinator";
  if (flag.has_value() && !flag->empty()) {
    address = *flag;
  } else if (env != nullptr && env[0] != '\0') {
    address = env;
    source = "coordinator (from $COHORT_COORDINATOR)";
  }
  const absl::Status valid = CheckHostPort(source, address, PortZero::kRefused);
  if (!valid.ok()) return UsageError(valid.message());
  return address;
}

absl::StatusOr<absl::Duration> ParseTimeout(double seconds) {
  if (!(seconds > 0) || !(seconds <= kMaxTimeoutSeconds)) {
    return UsageError(absl::StrCat("--timeout must be a number of seconds above 0 and at most ",
                                   kMaxTimeoutSeconds, " (a week), not ", seconds));
  }
  return absl::Seconds(seconds);
}

absl::StatusOr<OutputFormat> ParseOutputFormat(absl::string_view text) {
  if (text == "table") return OutputFormat::kTable;
  if (text == "json") return OutputFormat::kJson;
  return UsageError(absl::StrCat("--output must be table or json, not \"", text, "\""));
}

}  // namespace cohort::cohortctl
