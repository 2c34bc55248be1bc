#include "tools/cohortctl/cohortctl.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/api_client.h"
#include "common/job_spec/io.h"
#include "tools/cohortctl/checkpoint_export.h"
#include "tools/cohortctl/checkpoint_format.h"
#include "tools/cohortctl/command_line.h"
#include "tools/cohortctl/job_format.h"
#include "tools/cohortctl/loss_plot.h"
#include "tools/cohortctl/progress_bar.h"
#include "tools/cohortctl/spec_builder.h"

namespace cohort::cohortctl {
namespace {

// Prints a failed call's status and returns the exit code it maps to.
int ReportError(const absl::Status& status, const std::string& command, std::ostream& err) {
  if (client::IsUnreachable(status)) {
    err << "cohortctl: " << status.message() << "\n";
    return kExitUnreachable;
  }
  err << "cohortctl: " << command << ": " << absl::StatusCodeToString(status.code()) << ": "
      << status.message() << "\n";
  return kExitFailure;
}

// Writes a reply as JSON or with `format_table`, and returns kExitOk.
template <typename Message, typename Format>
int PrintReply(const CtlConfig& config, const Message& reply, Format format_table,
               std::ostream& out) {
  if (config.output == OutputFormat::kJson) {
    out << ToJson(reply, /*multiline=*/true) << "\n";
  } else {
    out << format_table(reply);
  }
  return kExitOk;
}

int RunSubmit(client::ApiClient& client, const CtlConfig& config, const Command& command, std::ostream& out,
              std::ostream& err) {
  absl::StatusOr<v1::JobSpec> spec = BuildSubmitSpec(command.operand, config.spec);
  if (!spec.ok()) {
    err << "cohortctl: " << spec.status().message() << "\n";
    return kExitFailure;
  }
  v1::SubmitJobRequest request;
  *request.mutable_spec() = *std::move(spec);
  request.set_validate_only(config.validate_only);
  absl::StatusOr<v1::Job> job = client.Submit(request);
  if (!job.ok()) return ReportError(job.status(), command.name, err);
  return PrintReply(
      config, *job,
      [&](const v1::Job& j) {
        if (config.validate_only) {
          return absl::StrCat("job spec \"", request.spec().name(), "\" is valid\n");
        }
        return FormatJobSummary(j) + "\n";
      },
      out);
}

int RunWatch(client::ApiClient& client, const CtlConfig& config, const Command& command, std::ostream& out,
             std::ostream& err) {
  const bool json = config.output == OutputFormat::kJson;
  const bool live = !json && config.stdout_is_terminal;
  std::optional<v1::Job> last;
  bool bar_drawn = false;
  LossSparkline sparkline;
  const absl::Status status = client.Watch(command.operand, [&](const v1::JobEvent& event) {
    const std::optional<v1::Job> before = std::exchange(last, event.job());
    if (json) {
      out << ToJson(event, /*multiline=*/false) << "\n";
    } else if (live) {
      // State and mesh changes, recoveries and checkpoint failures stay on
      // screen as lines above the bar.
      if (KeepsALine(event, before.has_value() ? &*before : nullptr)) {
        out << "\r\x1b[K" << FormatEventLine(event) << "\n";
      }
      if (event.job().progress().step() > 0) {
        sparkline.Add(event.job().progress().step(), event.job().progress().loss());
      }
      out << RedrawProgressBar(event.job(), config.terminal_width, &sparkline);
      bar_drawn = true;
    } else {
      out << FormatEventLine(event) << "\n";
    }
    out.flush();
    return !IsTerminal(event.job().state());
  });
  if (bar_drawn) out << "\n";
  if (!status.ok()) return ReportError(status, command.name, err);
  if (!last.has_value() || !IsTerminal(last->state())) {
    err << "cohortctl: watch: the stream ended before the job finished\n";
    return kExitFailure;
  }
  if (!json) out << FormatFinalLine(*last) << "\n";
  return last->state() == v1::JOB_STATE_COMPLETED ? kExitOk : kExitFailure;
}

int RunCheckpoints(client::ApiClient& client, const CtlConfig& config, const Command& command,
                   std::ostream& out, std::ostream& err) {
  client::CheckpointClient& checkpoints = client.checkpoints();
  const std::string name = "checkpoints";
  const int64_t step = command.step.value_or(-1);
  switch (command.checkpoints) {
    case CheckpointsCommand::kList: {
      auto reply = checkpoints.List(command.operand, client.timeout());
      if (!reply.ok()) return ReportError(client.Classify(reply.status()), name, err);
      return PrintReply(config, *reply, FormatCheckpointTable, out);
    }
    case CheckpointsCommand::kShow: {
      auto reply = checkpoints.GetManifest(command.operand, step, client.timeout());
      if (!reply.ok()) return ReportError(client.Classify(reply.status()), name, err);
      return PrintReply(config, *reply, FormatManifest, out);
    }
    case CheckpointsCommand::kDelete: {
      // Deleting compacts the store, which can take longer than a lookup.
      absl::Status deleted =
          checkpoints.Delete(command.operand, step, std::max(client.timeout(), absl::Minutes(2)));
      if (!deleted.ok()) return ReportError(client.Classify(deleted), name, err);
      out << "deleted the checkpoint of job " << command.operand << " at step " << step << "\n";
      return kExitOk;
    }
    case CheckpointsCommand::kExport: {
      auto manifest = checkpoints.GetManifest(command.operand, step, client.timeout());
      if (!manifest.ok()) return ReportError(client.Classify(manifest.status()), name, err);
      const absl::Time start = absl::Now();
      absl::Time last_line = start;
      // ParseCommand accepted the name; ParseExportFormat is the one list of them.
      const absl::StatusOr<ExportFormat> format =
          ParseExportFormat(config.format.value_or("safetensors"));
      if (!format.ok()) return ReportError(format.status(), name, err);
      const ExportOptions options{.format = *format, .timeout = absl::Hours(1)};
      absl::Status exported = ExportSafetensors(
          checkpoints, *manifest, *config.out, options, [&](const ExportProgress& p) {
            // A bar in place on a terminal, else a line every few seconds.
            const double fraction =
                p.bytes == 0 ? 1.0 : static_cast<double>(p.bytes_done) / static_cast<double>(p.bytes);
            if (config.stdout_is_terminal) {
              const int width = 30;
              const int filled = static_cast<int>(fraction * width);
              out << "\r\x1b[K[" << std::string(filled, '#') << std::string(width - filled, ' ')
                  << "] " << p.tensors_done << "/" << p.tensors << " tensors, "
                  << FormatBytes(p.bytes_done) << " of " << FormatBytes(p.bytes);
              out.flush();
            } else if (absl::Now() - last_line > absl::Seconds(5) || p.tensors_done == p.tensors) {
              last_line = absl::Now();
              out << "exported " << p.tensors_done << "/" << p.tensors << " tensors, "
                  << FormatBytes(p.bytes_done) << " of " << FormatBytes(p.bytes) << "\n";
            }
          });
      if (config.stdout_is_terminal) out << "\n";
      if (!exported.ok()) return ReportError(client.Classify(exported), name, err);
      out << "wrote " << *config.out << ": the weights of job " << manifest->job_id() << " step "
          << manifest->step() << " (" << ExportFormatName(*format) << ", "
          << absl::FormatDuration(absl::Trunc(absl::Now() - start, absl::Milliseconds(1)))
          << ")\n";
      return kExitOk;
    }
  }
  return kExitUsage;
}

// Writes `contents` to `path` through a temporary file renamed into place,
// so a reader never sees half a file. Errors name the path.
absl::Status WriteFileAtomically(const std::string& path, const std::string& contents) {
  const std::string temporary = path + ".partial";
  {
    std::ofstream file(temporary, std::ios::binary | std::ios::trunc);
    file << contents;
    file.flush();
    if (!file) {
      std::remove(temporary.c_str());
      return absl::InternalError(absl::StrCat("cannot write ", temporary, ": ",
                                              std::strerror(errno)));
    }
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    const absl::Status status = absl::InternalError(
        absl::StrCat("cannot rename ", temporary, " to ", path, ": ", std::strerror(errno)));
    std::remove(temporary.c_str());
    return status;
  }
  return absl::OkStatus();
}

int RunPlot(client::ApiClient& client, const CtlConfig& config, const Command& command,
            std::ostream& out, std::ostream& err) {
  auto job = client.Get(command.operand);
  if (!job.ok()) return ReportError(job.status(), command.name, err);
  auto history = client.GetLossHistory(command.operand);
  if (!history.ok()) return ReportError(history.status(), command.name, err);
  const std::string svg = RenderLossPlotSvg(
      *history, LossPlotOptions{.title = absl::StrCat("job ", job->job_id(), " (",
                                                      job->spec().name(), "): loss")});
  if (absl::Status written = WriteFileAtomically(*config.out, svg); !written.ok()) {
    err << "cohortctl: " << written.message() << "\n";
    return kExitFailure;
  }
  out << "wrote " << *config.out << ": " << history->training_size() << " training and "
      << history->validation_size() << " validation points of job " << job->job_id() << "\n";
  return kExitOk;
}

int RunCommand(client::ApiClient& client, const CtlConfig& config, const Command& command,
               std::ostream& out, std::ostream& err) {
  auto summary = [](const v1::Job& job) { return FormatJobSummary(job) + "\n"; };
  switch (command.kind) {
    case CommandKind::kSubmit:
      return RunSubmit(client, config, command, out, err);
    case CommandKind::kList: {
      auto reply = client.List(config.all);
      if (!reply.ok()) return ReportError(reply.status(), command.name, err);
      return PrintReply(config, *reply, FormatJobTable, out);
    }
    case CommandKind::kGet: {
      auto reply = client.Get(command.operand);
      if (!reply.ok()) return ReportError(reply.status(), command.name, err);
      return PrintReply(
          config, *reply, [](const v1::Job& job) { return FormatJobDetails(job, absl::Now()); },
          out);
    }
    case CommandKind::kWatch:
      return RunWatch(client, config, command, out, err);
    case CommandKind::kCancel: {
      auto reply = client.Cancel(command.operand);
      if (!reply.ok()) return ReportError(reply.status(), command.name, err);
      return PrintReply(config, *reply, summary, out);
    }
    case CommandKind::kDelete: {
      absl::Status deleted = client.Delete(command.operand);
      if (!deleted.ok()) return ReportError(deleted, command.name, err);
      out << "deleted job " << command.operand << "\n";
      return kExitOk;
    }
    case CommandKind::kScale: {
      v1::ScaleJobRequest request;
      request.set_job_id(command.operand);
      request.set_min_workers(command.min_workers);
      request.set_max_workers(command.max_workers);
      auto reply = client.Scale(request);
      if (!reply.ok()) return ReportError(reply.status(), command.name, err);
      return PrintReply(config, *reply, summary, out);
    }
    case CommandKind::kWorkers: {
      auto reply = client.ListWorkers();
      if (!reply.ok()) return ReportError(reply.status(), command.name, err);
      return PrintReply(config, *reply, FormatWorkerTable, out);
    }
    case CommandKind::kDrain: {
      auto reply = client.Drain(command.operand, config.reason.value_or(""));
      if (!reply.ok()) return ReportError(reply.status(), command.name, err);
      return PrintReply(
          config, *reply,
          [](const v1::WorkerInfo& worker) { return FormatDrainedWorker(worker) + "\n"; }, out);
    }
    case CommandKind::kCheckpoints:
      return RunCheckpoints(client, config, command, out, err);
    case CommandKind::kPlot:
      return RunPlot(client, config, command, out, err);
    case CommandKind::kHelp:
      break;
  }
  out << UsageText();
  return kExitOk;
}

}  // namespace

int RunCohortctl(const CtlConfig& config, std::ostream& out, std::ostream& err) {
  const absl::StatusOr<Command> command = ParseCommand(config);
  if (!command.ok()) return ReportUsageError(command.status().message(), err);
  if (command->kind == CommandKind::kHelp) {
    out << UsageText();
    return kExitOk;
  }
  absl::StatusOr<std::unique_ptr<client::ApiClient>> client = client::ApiClient::Create(
      {.address = config.coordinator, .timeout = config.timeout, .tls = config.tls,
       .token = config.token});
  if (!client.ok()) return ReportUsageError(client.status().message(), err);
  return RunCommand(**client, config, *command, out, err);
}

int ReportUsageError(absl::string_view message, std::ostream& err) {
  err << "cohortctl: " << message << "\n\n" << UsageText();
  return kExitUsage;
}

}  // namespace cohort::cohortctl
