#include "common/clock.h"

namespace cohort {

RealClock* RealClock::Get() {
  static RealClock* clock = new RealClock();
  return clock;
}

}  // namespace cohort
