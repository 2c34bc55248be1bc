#pragma once
// cohortctl plot: a job's loss history (v1::LossHistory) drawn as a
// standalone SVG file, written by hand (no plotting dependency): training
// loss as a line, validation loss as a line with a dot per result, against
// step, with ticks at round numbers, a legend and the job as title.
//
// The plot area is the rectangle <rect id="plot-area" x y width height> and
// carries its data ranges as data-step-min/-max and data-loss-min/-max, so a
// reader (the test) can map every point back: a series is a <polyline
// class="series" data-series="training|validation" points="x,y ...">.
//
// Pure functions; thread-safe.

#include <string>

#include "cohort/v1/job.pb.h"

namespace cohort::cohortctl {

struct LossPlotOptions {
  std::string title;  // e.g. "job demo-1 (demo)"
  int width = 900;    // pixels of the whole image
  int height = 500;
};

// The SVG document. A history without points draws the axes and says so.
std::string RenderLossPlotSvg(const v1::LossHistory& history, const LossPlotOptions& options);

// "Nice" tick values (1, 2 or 5 times a power of ten apart) covering
// [lo, hi] with about `count` of them; lo < hi.
std::vector<double> NiceTicks(double lo, double hi, int count);

}  // namespace cohort::cohortctl
