#include "worker/comm/channel.h"

#include "common/layout/mesh_layout.h"

namespace cohort::comm {

std::vector<int> HostByHostRing(const std::vector<std::string>& hosts) {
  std::vector<int> ring;
  ring.reserve(hosts.size());
  for (const std::vector<int>& ranks : layout::RanksByHost(hosts)) {
    ring.insert(ring.end(), ranks.begin(), ranks.end());
  }
  return ring;
}

}  // namespace cohort::comm
