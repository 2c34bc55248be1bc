#include "common/layout/mesh_hosts.h"

#include <algorithm>
#include <string>

namespace cohort::layout {

std::vector<CopyRing> CopyRingsOf(const v1::Mesh& mesh) {
  const MeshShape shape{std::max(1, mesh.data_parallel()), std::max(1, mesh.tensor_parallel()),
                        std::max(1, mesh.pipeline_parallel())};
  const int groups = GroupsOnAxis(shape, Axis::kData);
  // A hole's label no host can have (host names hold no NUL).
  std::vector<std::vector<std::string>> hosts(static_cast<size_t>(groups));
  for (int g = 0; g < groups; ++g) {
    for (int d = 0; d < shape.data; ++d) {
      std::string& hole = hosts[static_cast<size_t>(g)].emplace_back(1, '\0');
      hole.append(std::to_string(d));
    }
  }
  for (const v1::MeshMember& m : mesh.members()) {
    const v1::MeshCoordinates& c = m.coordinates();
    const MeshCoords coords{c.data(), c.tensor(), c.pipeline()};
    if (!InMesh(shape, coords)) continue;
    const int g = coords.pipeline * shape.tensor + coords.tensor;
    hosts[static_cast<size_t>(g)][static_cast<size_t>(coords.data)] = m.host();
  }
  std::vector<CopyRing> rings;
  rings.reserve(static_cast<size_t>(groups));
  for (const std::vector<std::string>& group : hosts) rings.push_back(CopyRing::AcrossHosts(group));
  return rings;
}

CopyRing CopyRingOf(const v1::Mesh& mesh, const MeshCoords& coords) {
  std::vector<CopyRing> rings = CopyRingsOf(mesh);
  const int g = coords.pipeline * std::max(1, mesh.tensor_parallel()) + coords.tensor;
  if (g < 0 || g >= static_cast<int>(rings.size())) return CopyRing(mesh.data_parallel());
  return std::move(rings[static_cast<size_t>(g)]);
}

}  // namespace cohort::layout
