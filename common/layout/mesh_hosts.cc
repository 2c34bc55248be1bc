#include "common/layout/mesh_hosts.h"

#include <string>

#include "common/layout/mesh_proto.h"

namespace cohort::layout {

std::vector<CopyRing> CopyRingsOf(const v1::Mesh& mesh) {
  const MeshShape shape = ShapeOf(mesh);
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
    const MeshCoords coords = CoordsOf(m.coordinates());
    if (!InMesh(shape, coords)) continue;
    hosts[static_cast<size_t>(GroupIndex(shape, Axis::kData, coords))]
         [static_cast<size_t>(coords.data)] = m.host();
  }
  std::vector<CopyRing> rings;
  rings.reserve(static_cast<size_t>(groups));
  for (const std::vector<std::string>& group : hosts) rings.push_back(CopyRing::AcrossHosts(group));
  return rings;
}

CopyRing CopyRingOf(const v1::Mesh& mesh, const MeshCoords& coords) {
  std::vector<CopyRing> rings = CopyRingsOf(mesh);
  const MeshShape shape = ShapeOf(mesh);
  if (!InMesh(shape, coords)) return CopyRing(shape.data);
  const int g = GroupIndex(shape, Axis::kData, coords);
  return std::move(rings[static_cast<size_t>(g)]);
}

}  // namespace cohort::layout
