#pragma once
// What a planned mesh (v1::Mesh, with each member's host) says about the
// layout math's host-aware parts. Used by the coordinator's recovery planner
// and by the worker, which must derive the same answers from the same mesh.

#include <vector>

#include "cohort/v1/job.pb.h"
#include "common/layout/mesh_layout.h"

namespace cohort::layout {

// The optimizer copy ring of every data group of `mesh`, indexed by the data
// group index (GroupIndex(shape, Axis::kData, coords)): CopyRing::AcrossHosts
// over its members' hosts in data order. A data rank with no member (a
// hole) counts as a host of its own. One pass over the members.
std::vector<CopyRing> CopyRingsOf(const v1::Mesh& mesh);
// The ring of the data group at `coords`.
CopyRing CopyRingOf(const v1::Mesh& mesh, const MeshCoords& coords);

}  // namespace cohort::layout
