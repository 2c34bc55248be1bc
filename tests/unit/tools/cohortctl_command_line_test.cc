#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tools/cohortctl/command_line.h"
#include "tools/cohortctl/spec_builder.h"
#include "tools/cohortctl/spec_fields.h"

namespace cohort::cohortctl {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

using Flags = std::vector<std::pair<std::string, std::string>>;

TEST(ScanCommandLineTest, SplitsFlagsAndOperandsInAnyOrder) {
  absl::StatusOr<ScannedCommandLine> scanned =
      ScanCommandLine({"--coordinator=h:1", "scale", "j1", "--min_workers", "3", "-output", "json",
                       "--max_workers=5"});
  ASSERT_TRUE(scanned.ok()) << scanned.status();
  EXPECT_THAT(scanned->positional, ElementsAre("scale", "j1"));
  EXPECT_THAT(scanned->flags, ElementsAre(Pair("coordinator", "h:1"), Pair("min_workers", "3"),
                                          Pair("output", "json"), Pair("max_workers", "5")));
  EXPECT_FALSE(scanned->help);
}

TEST(ScanCommandLineTest, BoolFlagsTakeNoSeparateValue) {
  absl::StatusOr<ScannedCommandLine> scanned =
      ScanCommandLine({"list", "--all", "x", "--nozero1", "--validate_only=false"});
  ASSERT_TRUE(scanned.ok()) << scanned.status();
  // "x" after a bool flag is an operand, not the flag's value.
  EXPECT_THAT(scanned->positional, ElementsAre("list", "x"));
  EXPECT_THAT(scanned->flags, ElementsAre(Pair("all", "true"), Pair("zero1", "false"),
                                          Pair("validate_only", "false")));
}

TEST(ScanCommandLineTest, DoubleDashEndsFlagsAndNegativeValuesAreValues) {
  absl::StatusOr<ScannedCommandLine> scanned =
      ScanCommandLine({"submit", "--seed", "-1", "--", "--odd-file-name"});
  ASSERT_TRUE(scanned.ok()) << scanned.status();
  EXPECT_THAT(scanned->positional, ElementsAre("submit", "--odd-file-name"));
  EXPECT_THAT(scanned->flags, ElementsAre(Pair("seed", "-1")));
}

TEST(ScanCommandLineTest, DrainReasonAndScaleWorkersTakeValues) {
  absl::StatusOr<ScannedCommandLine> scanned =
      ScanCommandLine({"drain", "w3", "--reason", "bad disk", "--workers=2"});
  ASSERT_TRUE(scanned.ok()) << scanned.status();
  EXPECT_THAT(scanned->positional, ElementsAre("drain", "w3"));
  EXPECT_THAT(scanned->flags, ElementsAre(Pair("reason", "bad disk"), Pair("workers", "2")));
  EXPECT_EQ(ScanCommandLine({"drain", "w3", "--reason"}).status().message(),
            "flag --reason needs a value (--reason=TEXT)");
}

TEST(ScanCommandLineTest, HelpIsRecognisedInEverySpelling) {
  for (const char* spelling : {"--help", "-h", "-help", "--h"}) {
    absl::StatusOr<ScannedCommandLine> scanned = ScanCommandLine({spelling});
    ASSERT_TRUE(scanned.ok()) << spelling;
    EXPECT_TRUE(scanned->help) << spelling;
  }
}

TEST(ScanCommandLineTest, UnknownFlagAndMissingValueAreUsageErrors) {
  absl::StatusOr<ScannedCommandLine> scanned = ScanCommandLine({"list", "--al"});
  ASSERT_FALSE(scanned.ok());
  EXPECT_EQ(scanned.status().message(), "unknown flag --al");

  scanned = ScanCommandLine({"submit", "--tensor"});
  ASSERT_FALSE(scanned.ok());
  EXPECT_THAT(std::string(scanned.status().message()),
              HasSubstr("flag --tensor needs a value (--tensor=N)"));

  // --no prefix only negates bools.
  scanned = ScanCommandLine({"--notensor"});
  EXPECT_FALSE(scanned.ok());
}

CtlConfig ConfigWithArgs(std::vector<std::string> args) {
  CtlConfig config;
  config.args = std::move(args);
  return config;
}

TEST(ParseCommandTest, ReadsEveryCommand) {
  struct Case {
    std::vector<std::string> args;
    CommandKind kind;
    std::string operand;
  };
  const std::vector<Case> cases = {
      {{"submit", "job.yaml"}, CommandKind::kSubmit, "job.yaml"},
      {{"list"}, CommandKind::kList, ""},
      {{"get", "j1"}, CommandKind::kGet, "j1"},
      {{"watch", "j2"}, CommandKind::kWatch, "j2"},
      {{"cancel", "j3"}, CommandKind::kCancel, "j3"},
      {{"workers"}, CommandKind::kWorkers, ""},
      {{"drain", "w3"}, CommandKind::kDrain, "w3"},
      {{"help", "submit"}, CommandKind::kHelp, ""},
  };
  for (const Case& c : cases) {
    absl::StatusOr<Command> command = ParseCommand(ConfigWithArgs(c.args));
    ASSERT_TRUE(command.ok()) << c.args[0] << ": " << command.status();
    EXPECT_EQ(command->kind, c.kind) << c.args[0];
    EXPECT_EQ(command->operand, c.operand) << c.args[0];
    EXPECT_EQ(command->name, c.args[0]);
  }
}

TEST(ParseCommandTest, OperandCountsAreChecked) {
  EXPECT_EQ(ParseCommand(ConfigWithArgs({})).status().message(), "no command given");
  EXPECT_EQ(ParseCommand(ConfigWithArgs({"get"})).status().message(), "get needs a JOB operand");
  EXPECT_EQ(ParseCommand(ConfigWithArgs({"list", "x"})).status().message(),
            "list: unexpected operand \"x\"");
  EXPECT_EQ(ParseCommand(ConfigWithArgs({"cancel", "a", "b"})).status().message(),
            "cancel: unexpected operand \"b\"");
  EXPECT_EQ(ParseCommand(ConfigWithArgs({"drain"})).status().message(),
            "drain needs a WORKER operand");
  EXPECT_EQ(ParseCommand(ConfigWithArgs({"drain", "w1", "w2"})).status().message(),
            "drain: unexpected operand \"w2\"");
  EXPECT_EQ(ParseCommand(ConfigWithArgs({"drain", ""})).status().message(), "drain: empty WORKER");
  EXPECT_EQ(ParseCommand(ConfigWithArgs({"frobnicate"})).status().message(),
            "unknown command \"frobnicate\"");
}

TEST(ParseCommandTest, FlagsMustBelongToTheCommand) {
  CtlConfig config = ConfigWithArgs({"list"});
  config.spec = {{"tensor", "2"}};
  config.validate_only = true;
  EXPECT_EQ(ParseCommand(config).status().message(),
            "list does not take --tensor, --validate_only");

  config = ConfigWithArgs({"submit", "f.yaml"});
  config.all = true;
  EXPECT_EQ(ParseCommand(config).status().message(), "submit does not take --all");

  config = ConfigWithArgs({"scale", "j1"});
  config.spec = {{"min_workers", "2"}, {"steps", "5"}};
  EXPECT_EQ(ParseCommand(config).status().message(), "scale does not take --steps");

  config = ConfigWithArgs({"get", "j1"});
  config.spec = {{"name", "x"}};
  EXPECT_FALSE(ParseCommand(config).ok());
}

TEST(ParseCommandTest, PlotTakesAJobAndNeedsOut) {
  EXPECT_EQ(ParseCommand(ConfigWithArgs({"plot", "j1"})).status().message(),
            "plot needs --out=FILE.svg");
  EXPECT_EQ(ParseCommand(ConfigWithArgs({"plot"})).status().message(), "plot needs a JOB operand");
  CtlConfig config = ConfigWithArgs({"plot", "j1"});
  config.out = "loss.svg";
  absl::StatusOr<Command> command = ParseCommand(config);
  ASSERT_TRUE(command.ok()) << command.status();
  EXPECT_EQ(command->kind, CommandKind::kPlot);
  EXPECT_EQ(command->operand, "j1");
  config.all = true;
  EXPECT_EQ(ParseCommand(config).status().message(), "plot does not take --all");
}

TEST(ParseCommandTest, CheckpointsSubcommandsTheirOperandsAndFlags) {
  absl::StatusOr<Command> list = ParseCommand(ConfigWithArgs({"checkpoints", "list", "j-1"}));
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(list->kind, CommandKind::kCheckpoints);
  EXPECT_EQ(list->checkpoints, CheckpointsCommand::kList);
  EXPECT_EQ(list->operand, "j-1");
  EXPECT_FALSE(list->step.has_value());

  absl::StatusOr<Command> show = ParseCommand(ConfigWithArgs({"checkpoints", "show", "j-1", "20"}));
  ASSERT_TRUE(show.ok()) << show.status();
  EXPECT_EQ(show->checkpoints, CheckpointsCommand::kShow);
  EXPECT_EQ(show->step, 20);

  CtlConfig config = ConfigWithArgs({"checkpoints", "export", "j-1"});
  config.out = "w.safetensors";
  absl::StatusOr<Command> exported = ParseCommand(config);
  ASSERT_TRUE(exported.ok()) << exported.status();
  EXPECT_EQ(exported->checkpoints, CheckpointsCommand::kExport);

  EXPECT_EQ(ParseCommand(ConfigWithArgs({"checkpoints"})).status().message(),
            "checkpoints needs a subcommand: list JOB, show JOB [STEP], delete JOB STEP, or "
            "export JOB [STEP] --out=FILE");
  EXPECT_THAT(std::string(ParseCommand(ConfigWithArgs({"checkpoints", "prune", "j"})).status().message()),
              HasSubstr("unknown checkpoints subcommand \"prune\""));
  EXPECT_EQ(ParseCommand(ConfigWithArgs({"checkpoints", "delete", "j-1"})).status().message(),
            "checkpoints delete needs a STEP operand");
  EXPECT_EQ(ParseCommand(ConfigWithArgs({"checkpoints", "show"})).status().message(),
            "checkpoints show needs a JOB operand");
  EXPECT_EQ(ParseCommand(ConfigWithArgs({"checkpoints", "show", "j", "x"})).status().message(),
            "checkpoints show: STEP must be a step number, not \"x\"");
  EXPECT_EQ(ParseCommand(ConfigWithArgs({"checkpoints", "list", "j", "3"})).status().message(),
            "checkpoints list: unexpected operand \"3\"");
  EXPECT_EQ(ParseCommand(ConfigWithArgs({"checkpoints", "export", "j"})).status().message(),
            "checkpoints export needs --out=FILE");
  config = ConfigWithArgs({"checkpoints", "list", "j"});
  config.out = "x";
  EXPECT_EQ(ParseCommand(config).status().message(), "checkpoints list does not take --out");
  config = ConfigWithArgs({"checkpoints", "export", "j"});
  config.out = "x";
  config.format = "npz";
  EXPECT_EQ(ParseCommand(config).status().message(), "--format must be safetensors or hf-gpt2, not \"npz\"");
  config = ConfigWithArgs({"submit", "f.yaml"});
  config.out = "x";
  EXPECT_EQ(ParseCommand(config).status().message(), "submit does not take --out");
}

TEST(ParseCommandTest, ScaleNeedsWorkersOrMinWorkers) {
  CtlConfig config = ConfigWithArgs({"scale", "j1"});
  EXPECT_EQ(ParseCommand(config).status().message(),
            "scale needs --workers=N, or --min_workers=A (and optionally --max_workers=B)");
  config.spec = {{"max_workers", "4"}};
  EXPECT_EQ(ParseCommand(config).status().message(),
            "scale needs --workers=N, or --min_workers=A (and optionally --max_workers=B)");
  config.spec.emplace_back("min_workers", "2");
  absl::StatusOr<Command> command = ParseCommand(config);
  ASSERT_TRUE(command.ok()) << command.status();
  EXPECT_EQ(command->min_workers, 2);
  EXPECT_EQ(command->max_workers, 4);
  config.spec.emplace_back("max_workers", "2x");
  EXPECT_EQ(ParseCommand(config).status().message(),
            "--max_workers must be an integer from -2147483648 to 2147483647, not \"2x\"");
}

TEST(ParseCommandTest, ScaleMaxWorkersDefaultsToMinWorkers) {
  CtlConfig config = ConfigWithArgs({"scale", "j1"});
  config.spec = {{"min_workers", "3"}};
  absl::StatusOr<Command> command = ParseCommand(config);
  ASSERT_TRUE(command.ok()) << command.status();
  EXPECT_EQ(command->kind, CommandKind::kScale);
  EXPECT_EQ(command->operand, "j1");
  EXPECT_EQ(command->min_workers, 3);
  EXPECT_EQ(command->max_workers, 3);
}

TEST(ParseCommandTest, ScaleWorkersSetsBothBounds) {
  CtlConfig config = ConfigWithArgs({"scale", "j1"});
  config.workers = 6;
  absl::StatusOr<Command> command = ParseCommand(config);
  ASSERT_TRUE(command.ok()) << command.status();
  EXPECT_EQ(command->min_workers, 6);
  EXPECT_EQ(command->max_workers, 6);
}

TEST(ParseCommandTest, ScaleWorkersWithMinOrMaxWorkersNamesBothFlags) {
  CtlConfig config = ConfigWithArgs({"scale", "j1"});
  config.workers = 6;
  config.spec = {{"min_workers", "2"}};
  EXPECT_EQ(ParseCommand(config).status().message(),
            "scale: --workers cannot be combined with --min_workers (--workers=N sets both "
            "bounds)");
  config.spec = {{"max_workers", "8"}};
  EXPECT_EQ(ParseCommand(config).status().message(),
            "scale: --workers cannot be combined with --max_workers (--workers=N sets both "
            "bounds)");
  config.spec = {{"min_workers", "2"}, {"max_workers", "8"}};
  EXPECT_EQ(ParseCommand(config).status().message(),
            "scale: --workers cannot be combined with --min_workers, --max_workers "
            "(--workers=N sets both bounds)");
}

TEST(ParseCommandTest, WorkersFlagBelongsToScaleOnly) {
  CtlConfig config = ConfigWithArgs({"submit", "f.yaml"});
  config.workers = 2;
  EXPECT_EQ(ParseCommand(config).status().message(), "submit does not take --workers");
  config = ConfigWithArgs({"workers"});
  config.workers = 2;
  EXPECT_EQ(ParseCommand(config).status().message(), "workers does not take --workers");
}

TEST(ParseCommandTest, DrainTakesAWorkerAndReason) {
  CtlConfig config = ConfigWithArgs({"drain", "w3"});
  config.reason = "replace its disk";
  absl::StatusOr<Command> command = ParseCommand(config);
  ASSERT_TRUE(command.ok()) << command.status();
  EXPECT_EQ(command->kind, CommandKind::kDrain);
  EXPECT_EQ(command->name, "drain");
  EXPECT_EQ(command->operand, "w3");

  config.spec = {{"min_workers", "1"}};
  config.all = true;
  EXPECT_EQ(ParseCommand(config).status().message(), "drain does not take --min_workers, --all");
}

TEST(ParseCommandTest, ReasonBelongsToDrainOnly) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"list"}, "list does not take --reason"},
      {{"get", "j1"}, "get does not take --reason"},
      {{"cancel", "j1"}, "cancel does not take --reason"},
      {{"workers"}, "workers does not take --reason"},
      {{"submit", "f.yaml"}, "submit does not take --reason"},
      {{"checkpoints", "list", "j1"}, "checkpoints list does not take --reason"},
  };
  for (const Case& c : cases) {
    CtlConfig config = ConfigWithArgs(c.args);
    config.reason = "why";
    EXPECT_EQ(ParseCommand(config).status().message(), c.message) << c.args[0];
  }
  CtlConfig config = ConfigWithArgs({"scale", "j1"});
  config.workers = 2;
  config.reason = "why";
  EXPECT_EQ(ParseCommand(config).status().message(), "scale does not take --reason");
}

TEST(ParseCommandTest, SubmitNeedsAFileOrSpecFlags) {
  CtlConfig config = ConfigWithArgs({"submit"});
  EXPECT_THAT(std::string(ParseCommand(config).status().message()),
              HasSubstr("submit needs a FILE or spec flags"));
  config.spec = {{"name", "quick"}};
  absl::StatusOr<Command> command = ParseCommand(config);
  ASSERT_TRUE(command.ok()) << command.status();
  EXPECT_EQ(command->operand, "");
}

TEST(ParseCommandTest, DeviceMustBeCpuOrGpu) {
  CtlConfig config = ConfigWithArgs({"submit"});
  config.spec = {{"device", "tpu"}};
  EXPECT_EQ(ParseCommand(config).status().message(), "--device must be cpu or gpu, not \"tpu\"");
  config.spec = {{"device", "GPU"}};
  EXPECT_TRUE(ParseCommand(config).ok());
}

TEST(CommandLineTest, CoordinatorAddressPrefersFlagThenEnvironment) {
  EXPECT_EQ(*ResolveCoordinatorAddress(std::string("a:1"), "b:2"), "a:1");
  EXPECT_EQ(*ResolveCoordinatorAddress(std::nullopt, "b:2"), "b:2");
  EXPECT_EQ(*ResolveCoordinatorAddress(std::string(""), "b:2"), "b:2");
  EXPECT_EQ(*ResolveCoordinatorAddress(std::nullopt, ""), "localhost:7070");
  EXPECT_EQ(*ResolveCoordinatorAddress(std::nullopt, nullptr), "localhost:7070");
  EXPECT_EQ(*ResolveCoordinatorAddress(std::string("[::1]:7070"), nullptr), "[::1]:7070");
}

TEST(CommandLineTest, ACoordinatorAddressThatIsNotHostAndPortIsAUsageError) {
  EXPECT_EQ(ResolveCoordinatorAddress(std::string("a b:1"), nullptr).status().message(),
            "--coordinator=a b:1: the host has a character outside [A-Za-z0-9._-] (or brackets)");
  EXPECT_THAT(ResolveCoordinatorAddress(std::string("host"), nullptr).status().message(),
              HasSubstr("must be host:port"));
  EXPECT_THAT(ResolveCoordinatorAddress(std::string("host:0"), nullptr).status().message(),
              HasSubstr("from 1 to 65535"));
  EXPECT_THAT(ResolveCoordinatorAddress(std::nullopt, "host:99999").status().message(),
              HasSubstr("--coordinator (from $COHORT_COORDINATOR)=host:99999: the port"));
  // A client connects: port 0 picks nothing, and the message does not offer it.
  EXPECT_EQ(ResolveCoordinatorAddress(std::string("host:99999"), nullptr).status().message(),
            "--coordinator=host:99999: the port must be a number from 1 to 65535");
}

TEST(CommandLineTest, TimeoutIsPositiveFiniteAndAtMostAWeek) {
  EXPECT_EQ(*ParseTimeout(10), absl::Seconds(10));
  EXPECT_EQ(*ParseTimeout(kMaxTimeoutSeconds), absl::Hours(7 * 24));
  for (double bad : {0.0, -1.0, 1e99, kMaxTimeoutSeconds + 1, std::nan(""),
                     std::numeric_limits<double>::infinity()}) {
    EXPECT_THAT(ParseTimeout(bad).status().message(), HasSubstr("--timeout must be")) << bad;
  }
}

TEST(CommandLineTest, OutputFormat) {
  EXPECT_EQ(*ParseOutputFormat("table"), OutputFormat::kTable);
  EXPECT_EQ(*ParseOutputFormat("json"), OutputFormat::kJson);
  EXPECT_EQ(ParseOutputFormat("yaml").status().message(),
            "--output must be table or json, not \"yaml\"");
}

TEST(CommandLineTest, SetSpecFlagNamesListsOnlySetFlags) {
  SpecFlags spec;
  EXPECT_TRUE(SetSpecFlagNames(spec).empty());
  spec = {{"zero1", "false"}, {"steps", "10"}, {"zero1", "true"}};  // set, even though false
  EXPECT_THAT(SetSpecFlagNames(spec), ElementsAre("--zero1", "--steps"));
}

TEST(CommandLineTest, UsageDocumentsEveryCommandAndFlag) {
  const std::string usage = UsageText();
  for (const char* command :
       {"submit FILE", "list", "get JOB", "watch JOB", "cancel JOB", "scale JOB --workers=N",
        "scale JOB --min_workers=A", "workers", "drain WORKER [--reason=TEXT]", "help"}) {
    EXPECT_THAT(usage, HasSubstr(command));
  }
  for (const FlagDoc& flag : FlagDocs()) {
    EXPECT_THAT(usage, HasSubstr(std::string("--") + flag.name)) << flag.name;
  }
  EXPECT_THAT(usage, HasSubstr("COHORT_COORDINATOR"));
  EXPECT_THAT(usage, HasSubstr("64 usage error"));
  // Fits an 80-column terminal.
  size_t start = 0;
  while (start < usage.size()) {
    size_t end = usage.find('\n', start);
    if (end == std::string::npos) end = usage.size();
    EXPECT_LE(end - start, 79u) << usage.substr(start, end - start);
    start = end + 1;
  }
}

TEST(CommandLineTest, EverySpecFlagSetsAFieldOfItsType) {
  // One table declares the submit flags: each names a JobSpec field, and a
  // value of the field's type given to the flag lands in that field.
  int spec_flags = 0;
  for (const FlagDoc& flag : FlagDocs()) {
    if (flag.spec_field == nullptr) continue;
    ++spec_flags;
    v1::JobSpec spec;
    const std::string value = flag.kind == FlagKind::kBool                     ? "true"
                              : absl::string_view(flag.name) == "device"    ? "gpu"
                              : absl::string_view(flag.name) == "precision" ? "bf16"
                                                                            : "7";
    absl::StatusOr<ScannedCommandLine> scanned =
        ScanCommandLine({absl::StrCat("--", flag.name, "=", value)});
    ASSERT_TRUE(scanned.ok()) << flag.name;
    ASSERT_TRUE(ApplySpecFlags(scanned->flags, &spec).ok()) << flag.name;
    const std::string shown = flag.kind == FlagKind::kBool ? "on" : value;
    EXPECT_EQ(SpecFieldText(spec, flag.spec_field), shown) << flag.name;
  }
  EXPECT_EQ(spec_flags, 25);
}

TEST(CommandLineTest, ASpecFlagValueOfTheWrongTypeNamesTheFlag) {
  struct Case {
    SpecFlags flags;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{{"layers", "twelve"}},
       "--layers must be an integer from -2147483648 to 2147483647, not \"twelve\""},
      {{{"layers", "4294967296"}},
       "--layers must be an integer from -2147483648 to 2147483647, not \"4294967296\""},
      {{{"seed", "-1"}}, "--seed must be an integer from 0 to 18446744073709551615, not \"-1\""},
      {{{"lr", "nan"}}, "--lr must be a finite number, not \"nan\""},
      {{{"lr", "1e999"}}, "--lr must be a finite number, not \"1e999\""},
      {{{"zero1", "maybe"}}, "--zero1 must be true or false, not \"maybe\""},
      {{{"device", "abacus"}}, "--device must be cpu or gpu, not \"abacus\""},
      {{{"precision", "fp16"}}, "--precision must be fp32, tf32 or bf16, not \"fp16\""},
      {{{"reason", "x"}}, "--reason is not a job spec flag"},
  };
  for (const Case& c : cases) {
    v1::JobSpec spec;
    const absl::Status status = ApplySpecFlags(c.flags, &spec);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(status.message(), c.message);
  }
}

}  // namespace
}  // namespace cohort::cohortctl

namespace cohort::cohortctl {
namespace {

// Issue 22: the help once advertised defaults (lr, warmup, micro_batch,
// tensor, zero1, steps, checkpoint_interval) that differed from what
// submit sends. Each spec flag's help now shows the value submit sends
// without a file or flags.
TEST(CommandLineTest, TheHelpShowsTheValuesSubmitSendsWithoutFlags) {
  absl::StatusOr<v1::JobSpec> sent = BuildSubmitSpec("", SpecFlags());
  ASSERT_TRUE(sent.ok()) << sent.status();
  int spec_flags = 0;
  const std::string usage = UsageText();
  for (const FlagDoc& flag : FlagDocs()) {
    if (flag.spec_field == nullptr) continue;
    ++spec_flags;
    const std::string value = SpecFieldText(*sent, flag.spec_field);
    EXPECT_TRUE(absl::EndsWith(FlagHelp(flag), absl::StrCat("(", value, ")")))
        << "--" << flag.name << ": " << FlagHelp(flag) << " but submit sends " << value;
  }
  EXPECT_EQ(spec_flags, 25);
  // Spot checks against deploy/local/jobs/demo.yaml.
  EXPECT_EQ(SpecFieldText(*sent, "optimizer.learning_rate"), "0.003");
  EXPECT_EQ(SpecFieldText(*sent, "optimizer.warmup_steps"), "20");
  EXPECT_EQ(SpecFieldText(*sent, "parallelism.zero1"), "on");
  EXPECT_EQ(SpecFieldText(*sent, "device_kind"), "cpu");
  EXPECT_EQ(SpecFieldText(*sent, "data.shards.pattern"), "synthetic");
  EXPECT_THAT(usage, HasSubstr("(0.003)"));
}

}  // namespace
}  // namespace cohort::cohortctl
