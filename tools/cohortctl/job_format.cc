#include "tools/cohortctl/job_format.h"

#include "tools/cohortctl/checkpoint_format.h"

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "common/enum_names.h"
#include "common/layout/mesh_proto.h"
#include "common/proto_time.h"
#include "tools/cohortctl/text_table.h"

namespace cohort::cohortctl {
namespace {

std::string FormatTime(const google::protobuf::Timestamp& time) {
  if (time.seconds() == 0 && time.nanos() == 0) return "-";
  return absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", FromProtoTime(time), absl::UTCTimeZone());
}

// Shortest decimal that reads back the same for human eyes: 0.001, 1e-05.
std::string Number(double value) { return absl::StrFormat("%g", value); }

std::string OrDash(const std::string& text) { return text.empty() ? "-" : text; }

void AddLine(std::string* out, absl::string_view key, absl::string_view value) {
  absl::StrAppendFormat(out, "%-13s%s\n", absl::StrCat(key, ":"), value);
}

std::string DescribeData(const v1::DataConfig& data) {
  switch (data.source_case()) {
    case v1::DataConfig::kSynthetic:
      return absl::StrCat("synthetic order-", data.synthetic().order(), " Markov (source seed ",
                          data.synthetic().seed(), ", alphabet ", data.synthetic().alphabet_size(),
                          ", branching ", data.synthetic().branching(), ", floor ",
                          absl::StrFormat("%.3f", std::log(std::max(1, data.synthetic().branching()))),
                          " nats), data seed ", data.seed());
    case v1::DataConfig::kShards:
      return absl::StrCat("shards ", data.shards().pattern(), ", data seed ", data.seed());
    default:
      return absl::StrCat("unset, data seed ", data.seed());
  }
}

// "held-out shards GLOB" or "the last 10% of the data", with when and how much.
std::string DescribeValidation(const v1::ValidationConfig& v) {
  const std::string what =
      v.pattern().empty()
          ? absl::StrFormat("the last %g%% of the data", 100 * v.held_out_fraction())
          : absl::StrCat("shards ", v.pattern());
  const std::string when = v.interval_steps() > 0
                               ? absl::StrCat("every ", v.interval_steps(), " steps and the last")
                               : "after the last step";
  return absl::StrCat(what, ", ", when, ", ", v.batches(), " batches");
}

// "1 step", "20 steps".
std::string Count(int64_t n, absl::string_view singular, absl::string_view plural) {
  return absl::StrCat(n, " ", n == 1 ? singular : plural);
}

std::string StepsLost(int64_t n) { return absl::StrCat(Count(n, "step", "steps"), " lost"); }

std::string Seconds(double seconds) { return absl::StrFormat("%.3f s", seconds); }

// "PEER at step 120", "CHECKPOINT step 100", "NONE, fresh start at step 0".
std::string RecoveryHeadline(const v1::RecoveryPlan& plan) {
  switch (plan.kind()) {
    case v1::RECOVERY_KIND_PEER:
      return absl::StrCat("PEER at step ", plan.step());
    case v1::RECOVERY_KIND_CHECKPOINT:
      return absl::StrCat("CHECKPOINT step ", plan.checkpoint_step());
    case v1::RECOVERY_KIND_NONE:
      return absl::StrCat("NONE, fresh start at step ", plan.step());
    default:
      return absl::StrCat(RecoveryKindName(plan.kind()), " at step ", plan.step());
  }
}

// `text` within `max` characters: its start and its end around " ... ",
// cut between words where a word boundary is near.
std::string CutInTheMiddle(absl::string_view text, size_t max) {
  constexpr absl::string_view kGap = " ... ";
  if (text.size() <= max) return std::string(text);
  if (max <= kGap.size()) return std::string(text.substr(0, max));
  size_t head = (max - kGap.size()) / 3;  // the end says why: keep more of it
  size_t tail_start = text.size() - (max - kGap.size() - head);
  if (const size_t space = text.rfind(' ', head);
      space != absl::string_view::npos && space >= head / 2) {
    head = space;
  }
  if (const size_t space = text.find(' ', tail_start);
      space != absl::string_view::npos && space - tail_start < (text.size() - tail_start) / 2) {
    tail_start = space + 1;
  }
  return absl::StrCat(text.substr(0, head), kGap, text.substr(tail_start));
}

}  // namespace

std::string JobStateName(v1::JobState state) { return ShortEnumName(state); }

std::string WorkerStateName(v1::WorkerState state) { return ShortEnumName(state); }

std::string JobEventKindName(v1::JobEventKind kind) { return ShortEnumName(kind); }

std::string RecoveryKindName(v1::RecoveryKind kind) { return ShortEnumName(kind); }

bool IsTerminal(v1::JobState state) {
  return state == v1::JOB_STATE_COMPLETED || state == v1::JOB_STATE_FAILED ||
         state == v1::JOB_STATE_CANCELLED;
}

std::string MeshShape(const v1::Mesh& mesh) {
  if (mesh.data_parallel() == 0 && mesh.members().empty()) return "-";
  return layout::DegreesText(mesh);
}

std::string DeviceLabel(v1::DeviceKind kind, int32_t index) {
  return absl::StrCat(kind == v1::DEVICE_KIND_GPU ? "gpu:" : "cpu:", index);
}

std::string StepProgress(const v1::Job& job) {
  return absl::StrCat(job.progress().step(), "/", job.spec().steps());
}

std::string FormatAge(absl::Duration age) {
  if (age < absl::ZeroDuration()) age = absl::ZeroDuration();
  if (age < absl::Seconds(1)) {
    return absl::StrCat(absl::ToInt64Milliseconds(age), "ms");
  }
  if (age < absl::Minutes(1)) {
    return absl::StrFormat("%.1fs", absl::ToDoubleSeconds(age));
  }
  const int64_t seconds = absl::ToInt64Seconds(age);
  if (age < absl::Hours(1)) {
    return absl::StrFormat("%dm%02ds", seconds / 60, seconds % 60);
  }
  return absl::StrFormat("%dh%02dm", seconds / 3600, (seconds / 60) % 60);
}

std::string FormatJobTable(const v1::ListJobsResponse& response) {
  TextTable table({"JOB", "NAME", "STATE", "GEN", "WORKERS", "MESH", "STEP/STEPS", "MESSAGE"});
  for (const v1::Job& job : response.jobs()) {
    table.AddRow({job.job_id(), job.spec().name(), JobStateName(job.state()),
                  absl::StrCat(job.generation()), absl::StrCat(job.mesh().members_size()),
                  MeshShape(job.mesh()), StepProgress(job), job.message()});
  }
  return table.Render();
}

std::string FormatRecoveryPlan(const v1::Job& job) {
  const v1::RecoveryPlan& plan = job.recovery();
  if (plan.kind() == v1::RECOVERY_KIND_UNSPECIFIED) return "";
  std::string line = RecoveryHeadline(plan);
  if (plan.kind() == v1::RECOVERY_KIND_PEER) {
    absl::StrAppend(&line, " (generation ", job.generation(), " from generation ",
                    plan.source_generation(), "'s memory, ");
    if (plan.donors_size() > 0) {
      absl::StrAppend(&line, Count(plan.donors_size(), "donor", "donors"), ", ");
    }
    absl::StrAppend(&line, StepsLost(plan.lost_steps()), ")");
  } else {
    absl::StrAppend(&line, ", ", StepsLost(plan.lost_steps()));
  }
  if (!plan.reason().empty()) {
    absl::StrAppend(&line, ": ", absl::StrReplaceAll(plan.reason(), {{"\n", " "}}));
  }
  return line;
}

std::string FormatRecoveryStats(const v1::RecoveryStats& stats) {
  if (stats.peer() == 0 && stats.checkpoint() == 0 && stats.spare() == 0 &&
      stats.lost_steps() == 0 && stats.last_detect_to_running_seconds() == 0) {
    return "";
  }
  std::string line = absl::StrCat(stats.peer(), " peer");
  if (stats.spare() > 0) absl::StrAppend(&line, " (", stats.spare(), " with a spare)");
  absl::StrAppend(&line, ", ", stats.checkpoint(), " from checkpoint, ",
                  StepsLost(stats.lost_steps()));
  if (stats.last_detect_to_running_seconds() > 0) {
    absl::StrAppend(&line, "; last took ", Seconds(stats.last_detect_to_running_seconds()),
                    " from detection to running (suspend ", Seconds(stats.last_suspend_seconds()),
                    ", prepare ", Seconds(stats.last_prepare_seconds()));
    if (stats.last_build_seconds() > 0 || stats.last_restore_seconds() > 0) {
      absl::StrAppend(&line, ": build ", Seconds(stats.last_build_seconds()));
      if (stats.last_communicators_seconds() > 0 || stats.last_session_seconds() > 0) {
        absl::StrAppend(&line, " (communicators ", Seconds(stats.last_communicators_seconds()),
                        ", session ", Seconds(stats.last_session_seconds()), ")");
      }
      absl::StrAppend(&line, ", restore ", Seconds(stats.last_restore_seconds()));
      if (stats.last_transfer_seconds() > 0 || stats.last_mirrors_seconds() > 0) {
        absl::StrAppend(&line, " (transfer ", Seconds(stats.last_transfer_seconds()),
                        ", mirrors ", Seconds(stats.last_mirrors_seconds()), ")");
      }
    }
    if (stats.last_members() > 0) {
      absl::StrAppend(&line, "; ", stats.last_sessions_kept(), " of ", stats.last_members(),
                      " members kept their session");
      if (stats.last_sessions_warm() > 0) {
        absl::StrAppend(&line, ", ", stats.last_sessions_warm(), " took a warm spare's");
      }
      if (stats.last_models_kept() > 0) {
        absl::StrAppend(&line, ", ", stats.last_models_kept(), " kept their model shard");
      }
    }
    if (stats.last_detect_to_first_step_seconds() > 0) {
      absl::StrAppend(&line, "), ", Seconds(stats.last_detect_to_first_step_seconds()),
                      " to its first step");
    } else {
      absl::StrAppend(&line, ")");
    }
  }
  return line;
}

std::string FormatRecovered(const v1::Job& job) {
  const v1::RecoveryPlan& plan = job.recovery();
  std::string line = absl::StrCat("generation ", job.generation(), ": ", RecoveryHeadline(plan),
                                  ", ", StepsLost(plan.lost_steps()));
  const double seconds = job.recovery_stats().last_detect_to_running_seconds();
  if (seconds > 0) {
    absl::StrAppend(&line, ", ", Seconds(seconds), " from detection to running");
  }
  return line;
}

bool CheckpointsFailing(const v1::CheckpointStatus& status) {
  if (!status.has_last_failure()) return false;
  if (!status.has_last_commit()) return true;
  return FromProtoTime(status.last_failure().time()) > FromProtoTime(status.last_commit().time());
}

std::string FormatCheckpointStatus(const v1::CheckpointStatus& status, absl::Time now) {
  if (!status.has_last_commit() && !status.has_last_failure()) return "";
  std::string line =
      status.has_last_commit()
          ? absl::StrCat("step ", status.last_commit().step(), " committed ",
                         FormatAge(now - FromProtoTime(status.last_commit().time())), " ago")
          : std::string("none committed");
  if (status.has_last_failure()) {
    const v1::CheckpointFailure& failure = status.last_failure();
    const std::string age = FormatAge(now - FromProtoTime(failure.time()));
    // Failing now is what the user must not miss; an old failure that a
    // commit followed is history.
    if (CheckpointsFailing(status)) {
      absl::StrAppend(&line, "; FAILING: step ", failure.step(), " failed ", age, " ago");
    } else {
      absl::StrAppend(&line, "; last failure step ", failure.step(), " ", age, " ago");
    }
    // The reason is printable already (the coordinator escapes it); the
    // replacements keep a record from elsewhere on one line all the same.
    const std::string reason = CutInTheMiddle(
        absl::StrReplaceAll(failure.reason(), {{"\n", " "}, {"\r", " "}}), kCheckpointReasonShown);
    absl::StrAppend(&line, " (", absl::AsciiStrToLower(ShortEnumName(failure.kind())));
    if (!reason.empty()) absl::StrAppend(&line, ": ", reason);
    absl::StrAppend(&line, "), ",
                    Count(status.failed_attempts(), "attempt failed", "attempts failed"));
  }
  return line;
}

std::string FormatJobDetails(const v1::Job& job, absl::Time now) {
  const v1::JobSpec& spec = job.spec();
  const v1::Progress& progress = job.progress();
  std::string out;
  AddLine(&out, "Job", job.job_id());
  AddLine(&out, "Name", spec.name());
  AddLine(&out, "State", JobStateName(job.state()));
  AddLine(&out, "Message", OrDash(job.message()));
  AddLine(&out, "Generation", absl::StrCat(job.generation()));
  if (const std::string plan = FormatRecoveryPlan(job); !plan.empty()) {
    AddLine(&out, "Recovery", plan);
  }
  if (const std::string totals = FormatRecoveryStats(job.recovery_stats()); !totals.empty()) {
    AddLine(&out, "Recoveries", totals);
  }
  AddLine(&out, "Created", FormatTime(job.create_time()));
  AddLine(&out, "Updated", FormatTime(job.update_time()));
  if (progress.step() == 0) {
    AddLine(&out, "Progress", absl::StrCat("step ", StepProgress(job)));
  } else {
    const std::string average =
        progress.tokens_per_second_average() > 0
            ? absl::StrFormat(" (average %.0f)", progress.tokens_per_second_average())
            : "";
    AddLine(&out, "Progress",
            absl::StrFormat("step %s, loss %.4f, %.0f tokens/s%s, %.3f s/step", StepProgress(job),
                            progress.loss(), progress.tokens_per_second(), average,
                            progress.step_time_seconds()));
  }
  if (!progress.validation().empty()) {
    const v1::LossPoint& last = progress.validation(progress.validation_size() - 1);
    std::string line = absl::StrFormat("loss %.4f at step %d", last.loss(), last.step());
    if (progress.validation_size() > 1) {
      const v1::LossPoint& before = progress.validation(progress.validation_size() - 2);
      absl::StrAppendFormat(&line, " (%.4f at step %d)", before.loss(), before.step());
    }
    AddLine(&out, "Validation", line);
  }
  if (const std::string checkpoints = FormatCheckpointStatus(job.checkpoint_status(), now);
      !checkpoints.empty()) {
    AddLine(&out, "Checkpoints", checkpoints);
  }
  AddLine(&out, "Device", spec.device_kind() == v1::DEVICE_KIND_GPU ? "GPU" : "CPU");
  AddLine(&out, "Model",
          absl::StrFormat("%d layers, %d heads, width %d, vocab %d, context %d",
                          spec.model().layers(), spec.model().heads(), spec.model().width(),
                          spec.model().vocab_size(), spec.model().context_length()));
  AddLine(&out, "Data", DescribeData(spec.data()));
  if (spec.data().has_validation()) {
    AddLine(&out, "Held out", DescribeValidation(spec.data().validation()));
  }
  AddLine(&out, "Optimizer",
          absl::StrCat("lr ", Number(spec.optimizer().learning_rate()), " -> ",
                       Number(spec.optimizer().min_learning_rate()), ", warmup ",
                       spec.optimizer().warmup_steps(), ", weight decay ",
                       Number(spec.optimizer().weight_decay()), ", grad clip ",
                       Number(spec.optimizer().grad_clip())));
  AddLine(&out, "Batch",
          absl::StrCat("global ", spec.batch().global_batch_size(), ", micro ",
                       spec.batch().micro_batch_size()));
  AddLine(&out, "Parallelism",
          absl::StrCat("tensor ", spec.parallelism().tensor(), ", pipeline ",
                       spec.parallelism().pipeline(), ", zero1 ",
                       spec.parallelism().zero1() ? "on" : "off"));
  AddLine(
      &out, "Elastic",
      absl::StrCat(spec.elastic().min_workers(), "..", spec.elastic().max_workers(), " workers"));
  AddLine(&out, "Checkpoint",
          spec.checkpoint().interval_steps() == 0
              ? std::string("off")
              : absl::StrCat("every ", spec.checkpoint().interval_steps(), " steps, keep last ",
                             spec.checkpoint().keep_last()));
  const v1::Mesh& mesh = job.mesh();
  if (MeshShape(mesh) == "-") {
    AddLine(&out, "Mesh", "none yet");
    return out;
  }
  AddLine(&out, "Mesh",
          absl::StrCat(MeshShape(mesh), " (data x tensor x pipeline), ", mesh.members_size(),
                       " members, ", job.ready_workers(), " ready"));
  if (mesh.micro_batches_size() > 0) {
    // How the step's micro-batches split over the data ranks (uneven where
    // dp does not divide them).
    AddLine(&out, "Split",
            absl::StrCat(absl::StrJoin(mesh.micro_batches(), "+"), " micro-batches per data rank (",
                         spec.parallelism().reduction() ==
                                 v1::ParallelismConfig::REDUCTION_TRANSPORT
                             ? "transport reduction"
                             : "deterministic reduction",
                         ")"));
  }
  TextTable table({"RANK", "WORKER", "HOST", "DEVICE", "DATA", "TENSOR", "PIPELINE"});
  for (const v1::MeshMember& member : mesh.members()) {
    const v1::MeshCoordinates& c = member.coordinates();
    table.AddRow({absl::StrCat(c.rank()), member.worker_id(), member.host(),
                  DeviceLabel(spec.device_kind(), member.device_index()), absl::StrCat(c.data()),
                  absl::StrCat(c.tensor()), absl::StrCat(c.pipeline())});
  }
  absl::StrAppend(&out, "\n", table.Render());
  return out;
}

// "warm JOB:RANK 1.9 GiB", "warming JOB:RANK", "cold JOB:RANK" (why: JSON
// output), or "-".
std::string FormatWarmSpare(const v1::WarmSpare& warm) {
  const std::string place = absl::StrCat(warm.job_id(), ":", warm.rank());
  switch (warm.state()) {
    case v1::WARM_SPARE_STATE_WARM:
      return absl::StrCat("warm ", place, " ", FormatBytes(warm.bytes()));
    case v1::WARM_SPARE_STATE_WARMING:
      return absl::StrCat("warming ", place);
    case v1::WARM_SPARE_STATE_COLD:
      return absl::StrCat("cold ", place);
    default:
      return "-";
  }
}

std::string FormatWorkerTable(const v1::ListWorkersResponse& response) {
  TextTable table({"WORKER", "HOST", "DEVICE", "STATE", "JOB", "RANK", "SPARE", "HEARTBEAT AGE",
                   "METRICS"});
  for (const v1::WorkerInfo& worker : response.workers()) {
    const bool in_job = !worker.job_id().empty();
    table.AddRow({worker.worker_id(), worker.host(),
                  DeviceLabel(worker.device_kind(), worker.device_index()),
                  WorkerStateName(worker.state()), in_job ? worker.job_id() : "-",
                  in_job ? absl::StrCat(worker.coordinates().rank()) : "-",
                  FormatWarmSpare(worker.warm()),
                  FormatAge(absl::Milliseconds(worker.last_heartbeat_age_ms())),
                  OrDash(worker.metrics_address())});
  }
  return table.Render();
}

std::string FormatDrainedWorker(const v1::WorkerInfo& worker) {
  std::string line =
      absl::StrCat("worker ", worker.worker_id(), ": ", WorkerStateName(worker.state()));
  if (worker.state() == v1::WORKER_STATE_DRAINING) {
    if (worker.job_id().empty()) {
      absl::StrAppend(&line, " (in no job; it exits now)");
    } else {
      absl::StrAppend(&line, " (its job ", worker.job_id(),
                      " is re-planned without it; it exits once its state is handed over)");
    }
  }
  return line;
}

std::string FormatJobSummary(const v1::Job& job) {
  std::string line = absl::StrCat(job.job_id(), " ", JobStateName(job.state()));
  if (!job.message().empty()) {
    absl::StrAppend(&line, " (", absl::StrReplaceAll(job.message(), {{"\n", " "}}), ")");
  }
  return line;
}

}  // namespace cohort::cohortctl
