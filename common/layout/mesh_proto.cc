#include "common/layout/mesh_proto.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace cohort::layout {

MeshShape ShapeOf(const v1::Mesh& mesh) {
  return {std::max(1, mesh.data_parallel()), std::max(1, mesh.tensor_parallel()),
          std::max(1, mesh.pipeline_parallel())};
}

MeshShape SourceShapeOf(const v1::RecoveryPlan& plan) {
  return {std::max(1, plan.source_data_parallel()), std::max(1, plan.source_tensor_parallel()),
          std::max(1, plan.source_pipeline_parallel())};
}

MeshCoords CoordsOf(const v1::MeshCoordinates& coordinates) {
  return {coordinates.data(), coordinates.tensor(), coordinates.pipeline()};
}

void SetCoordinates(const MeshShape& shape, const MeshCoords& coords, v1::MeshCoordinates* out) {
  out->set_data(coords.data);
  out->set_tensor(coords.tensor);
  out->set_pipeline(coords.pipeline);
  out->set_rank(RankOf(shape, coords));
}

std::string DegreesText(const v1::Mesh& mesh) {
  return absl::StrCat(mesh.data_parallel(), "x", mesh.tensor_parallel(), "x",
                      mesh.pipeline_parallel());
}

}  // namespace cohort::layout
