#include "tools/cohortctl/progress_bar.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/proto_time.h"
#include "tools/cohortctl/job_format.h"

namespace cohort::cohortctl {
namespace {

constexpr int kMaxBarCells = 40;
constexpr int kMinBarCells = 5;
constexpr int kDefaultWidth = 80;

double Fraction(const v1::Job& job) {
  const int64_t steps = job.spec().steps();
  if (steps <= 0) return 0.0;
  return std::clamp(static_cast<double>(job.progress().step()) / static_cast<double>(steps), 0.0,
                    1.0);
}

std::string Loss(const v1::Job& job) {
  // Before the first step there is no loss to show.
  if (job.progress().step() == 0) return "-";
  return absl::StrFormat("%.4f", job.progress().loss());
}

// The windowed rate where the worker reports one (steadier on a redrawn
// line), else the last step's.
double BarRate(const v1::Job& job) {
  return job.progress().tokens_per_second_average() > 0
             ? job.progress().tokens_per_second_average()
             : job.progress().tokens_per_second();
}

}  // namespace

std::string FormatRate(double per_second) {
  if (!std::isfinite(per_second) || per_second < 0) return "-";
  if (per_second < 999.5) return absl::StrFormat("%.0f", per_second);
  if (per_second < 99'950) return absl::StrFormat("%.1fk", per_second / 1e3);
  if (per_second < 999'500) return absl::StrFormat("%.0fk", per_second / 1e3);
  if (per_second < 99'950'000) return absl::StrFormat("%.2fM", per_second / 1e6);
  return absl::StrFormat("%.0fM", per_second / 1e6);
}

std::string RenderProgressBar(const v1::Job& job, int width) {
  if (width <= 0) width = kDefaultWidth;
  const double fraction = Fraction(job);
  // Fixed-width fields keep the bar from jumping as the numbers change.
  const int step_width = 2 * static_cast<int>(absl::StrCat(job.spec().steps()).size()) + 1;
  // The newest validation loss, where the job has one, after the training loss.
  const std::string validation =
      job.progress().validation().empty()
          ? ""
          : absl::StrFormat(
                "  val %7.4f",
                job.progress().validation(job.progress().validation_size() - 1).loss());
  const std::string text = absl::StrFormat(
      " %*s %3d%%  loss %7s%s  %5s tok/s  gen %d  %-13s", step_width, StepProgress(job),
      static_cast<int>(std::floor(fraction * 100.0)), Loss(job), validation,
      FormatRate(BarRate(job)), job.generation(), JobStateName(job.state()));
  const int limit = width - 1;  // writing the last column makes terminals wrap
  const int cells = std::min(kMaxBarCells, limit - static_cast<int>(text.size()) - 2);
  std::string line;
  if (cells >= kMinBarCells) {
    const int filled = static_cast<int>(std::floor(fraction * cells));
    line = absl::StrCat("[", std::string(filled, '#'), std::string(cells - filled, '.'), "]", text);
  } else {
    line = std::string(absl::StripLeadingAsciiWhitespace(text));
  }
  if (static_cast<int>(line.size()) > limit) line.resize(std::max(limit, 0));
  while (!line.empty() && line.back() == ' ') line.pop_back();
  return line;
}

void LossSparkline::Add(int64_t step, double loss) {
  if (step <= newest_step_ || !std::isfinite(loss)) return;
  newest_step_ = step;
  losses_.push_back(loss);
  if (losses_.size() > kKeep) losses_.erase(losses_.begin());
}

std::string LossSparkline::Render(int cells) const {
  if (losses_.size() < 2 || cells <= 0) return "";
  static const char* const kBlocks[8] = {"\u2581", "\u2582", "\u2583", "\u2584",
                                         "\u2585", "\u2586", "\u2587", "\u2588"};
  const size_t shown = std::min(losses_.size(), static_cast<size_t>(cells));
  const auto first = losses_.end() - static_cast<std::ptrdiff_t>(shown);
  const auto [low, high] = std::minmax_element(first, losses_.end());
  std::string out;
  for (auto it = first; it != losses_.end(); ++it) {
    int level = 0;
    if (*high > *low) {
      level = static_cast<int>(std::lround((*it - *low) / (*high - *low) * 7.0));
    }
    out += kBlocks[std::clamp(level, 0, 7)];
  }
  return out;
}

std::string RedrawProgressBar(const v1::Job& job, int width, const LossSparkline* sparkline) {
  if (width <= 0) width = kDefaultWidth;
  const std::string spark = sparkline != nullptr && width >= 100
                                ? sparkline->Render(kSparklineCells)
                                : std::string();
  if (spark.empty()) return absl::StrCat("\r", RenderProgressBar(job, width), "\x1b[K");
  // The chart takes kSparklineCells columns and a space; the bar the rest.
  return absl::StrCat("\r", RenderProgressBar(job, width - kSparklineCells - 1), " ", spark,
                      "\x1b[K");
}

std::string FormatEventLine(const v1::JobEvent& event) {
  const v1::Job& job = event.job();
  std::string time = "-";
  if (event.has_time()) {
    time =
        absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", FromProtoTime(event.time()), absl::UTCTimeZone());
  }
  if (event.kind() == v1::JOB_EVENT_KIND_RECOVERED) {
    return absl::StrCat(time, " RECOVERED job=", job.job_id(), " ", FormatRecovered(job));
  }
  if (event.kind() == v1::JOB_EVENT_KIND_CHECKPOINT) {
    // Ages as of the event (the coordinator's clock), so a line means the
    // same whenever it is read.
    const absl::Time at = event.has_time() ? FromProtoTime(event.time()) : absl::Now();
    return absl::StrCat(time, " CHECKPOINT job=", job.job_id(), " ",
                        FormatCheckpointStatus(job.checkpoint_status(), at));
  }
  std::string line = absl::StrFormat(
      "%s %s job=%s state=%s gen=%d step=%s loss=%s tok/s=%.0f mesh=%s "
      "workers=%d",
      time, JobEventKindName(event.kind()), job.job_id(), JobStateName(job.state()),
      job.generation(), StepProgress(job), Loss(job), job.progress().tokens_per_second(),
      MeshShape(job.mesh()), job.mesh().members_size());
  if (!job.progress().validation().empty()) {
    const v1::LossPoint& last = job.progress().validation(job.progress().validation_size() - 1);
    absl::StrAppendFormat(&line, " val_loss=%.4f@%d", last.loss(), last.step());
  }
  if (!job.message().empty()) {
    absl::StrAppend(
        &line, " message=\"",
        absl::StrReplaceAll(job.message(), {{"\\", "\\\\"}, {"\"", "\\\""}, {"\n", " "}}), "\"");
  }
  return line;
}

bool KeepsALine(const v1::JobEvent& event, const v1::Job* before) {
  switch (event.kind()) {
    case v1::JOB_EVENT_KIND_STATE_CHANGED:
    case v1::JOB_EVENT_KIND_MESH_CHANGED:
    case v1::JOB_EVENT_KIND_RECOVERED:
      return true;
    case v1::JOB_EVENT_KIND_CHECKPOINT: {
      const v1::CheckpointStatus& now = event.job().checkpoint_status();
      if (before == nullptr) return CheckpointsFailing(now);
      const v1::CheckpointStatus& was = before->checkpoint_status();
      // A new failure, or the commit that ends a run of them.
      return now.failed_attempts() > was.failed_attempts() ||
             (CheckpointsFailing(was) && !CheckpointsFailing(now));
    }
    default:
      return false;
  }
}

std::string FormatFinalLine(const v1::Job& job) {
  std::string line = absl::StrCat("job ", job.job_id(), " ", JobStateName(job.state()), " at step ",
                                  StepProgress(job));
  if (!job.message().empty()) absl::StrAppend(&line, ": ", job.message());
  return line;
}

}  // namespace cohort::cohortctl
