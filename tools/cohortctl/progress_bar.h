#pragma once
// Renderings of Jobs.Watch events: the one-line progress bar cohortctl
// redraws in place on a terminal, and the plain line it prints per event
// otherwise. Pure functions, thread-safe.

#include <cstdint>
#include <string>
#include <vector>

#include "cohort/v1/jobs.pb.h"

namespace cohort::cohortctl {

// "950", "12.3k", "4.56M": a rate in at most five characters.
std::string FormatRate(double per_second);

// The job's progress in at most `width` - 1 columns (so the terminal never
// wraps), with no line ending:
//   [#########.........] 120/200  60%  loss  3.2104  12.3k tok/s  gen 3  RUNNING
// Fields have fixed widths so the bar does not move as numbers change; the
// bar shrinks, then disappears, on narrow terminals.
std::string RenderProgressBar(const v1::Job& job, int width);

// The recent training loss as a one-line chart of block characters
// (U+2581..U+2588, lowest to highest loss of the window shown), from the
// steps watch has seen. Not thread-safe.
class LossSparkline {
 public:
  // Records the loss of `step`; a step at or below the newest recorded one
  // is ignored (repeated progress, or a recovery redoing steps). Keeps the
  // newest kKeep.
  void Add(int64_t step, double loss);
  // The newest `cells` losses, one character (one terminal column) each;
  // "" before two are known. A flat window draws the lowest block.
  std::string Render(int cells) const;
  size_t size() const { return losses_.size(); }

  static constexpr size_t kKeep = 64;

 private:
  int64_t newest_step_ = -1;
  std::vector<double> losses_;
};

// What watch writes to a terminal for `job`: carriage return, the bar, and
// "erase to end of line", so it overwrites the previous one. With a
// sparkline (and room: width >= 100) the bar is followed by the recent loss
// in kSparklineCells columns, the whole still within width - 1 columns.
inline constexpr int kSparklineCells = 16;
std::string RedrawProgressBar(const v1::Job& job, int width,
                              const LossSparkline* sparkline = nullptr);

// One line (no line ending) per event for pipes and logs:
//   2024-05-01T10:00:00Z PROGRESS job=j1 state=RUNNING gen=3 step=120/200
//   loss=3.2104 tok/s=12345 mesh=2x2x1 workers=4 val_loss=3.3012@100
//   message="..."  (val_loss: the newest validation, where the job has one)
// except RECOVERED events, which say how the new generation got its state:
//   2024-05-01T10:00:00Z RECOVERED job=j1 generation 3: PEER at step 120,
//   0 steps lost, 0.184 s from detection to running
// and CHECKPOINT events, which give the job's checkpoints as of the event
// (FormatCheckpointStatus):
//   2024-05-01T10:00:00Z CHECKPOINT job=j1 step 1200 committed 3m07s ago;
//   FAILING: step 1400 failed 0ms ago (storage: <reason>), 7 attempts failed
std::string FormatEventLine(const v1::JobEvent& event);

// Whether watch on a terminal keeps `event` as a line above the bar
// (`before`: the job as the previous event had it; null for the first):
// state and mesh changes, recoveries, a checkpoint failure, and the first
// commit after failures. A routine commit only redraws the bar.
bool KeepsALine(const v1::JobEvent& event, const v1::Job* before);

// The line watch ends with: "job j1 COMPLETED at step 200/200" or
// "job j1 FAILED at step 120/200: <message>".
std::string FormatFinalLine(const v1::Job& job);

}  // namespace cohort::cohortctl
