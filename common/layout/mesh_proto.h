#pragma once
// The one conversion between the wire's mesh (v1::Mesh, v1::MeshCoordinates,
// a recovery plan's source degrees) and the layout library's MeshShape and
// MeshCoords. Everything that does rank math on a planned mesh converts here
// and then calls mesh_layout.h.
//
// A degree of 0 (a field never set: an empty mesh, a plan without a source)
// counts as 1, so the arithmetic never divides by zero; code that must refuse
// such a mesh checks the fields before it converts (comm::ValidateMesh).

#include "cohort/v1/job.pb.h"
#include "common/layout/mesh_layout.h"

namespace cohort::layout {

MeshShape ShapeOf(const v1::Mesh& mesh);
// The layout a recovery plan's source generation had.
MeshShape SourceShapeOf(const v1::RecoveryPlan& plan);
MeshCoords CoordsOf(const v1::MeshCoordinates& coordinates);
// Writes `coords` and their rank in `shape` into `out`.
void SetCoordinates(const MeshShape& shape, const MeshCoords& coords, v1::MeshCoordinates* out);
// "2x1x4" (data x tensor x pipeline, as declared: 0 stays 0).
std::string DegreesText(const v1::Mesh& mesh);

}  // namespace cohort::layout
