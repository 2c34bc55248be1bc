# Every dependency comes from a Debian package (tools/dev installs them).
find_package(Threads REQUIRED)
find_package(Protobuf REQUIRED)
find_package(absl CONFIG REQUIRED)
find_package(gRPC CONFIG REQUIRED)
find_package(RocksDB CONFIG REQUIRED)
find_package(prometheus-cpp CONFIG REQUIRED)
find_package(yaml-cpp CONFIG REQUIRED)
find_package(ucx CONFIG REQUIRED)
find_package(OpenBLAS CONFIG REQUIRED)
find_package(OpenMP REQUIRED COMPONENTS CXX)
# TLS material checks (common/tls_credentials.cc) and token digests.
find_package(OpenSSL REQUIRED)
# Unicode general categories and White_Space for GPT-2's pre-tokenizer
# (worker/data/gpt2_pretokenizer.cc): the ICU::uc target.
find_package(ICU REQUIRED COMPONENTS uc)
# Debian's OpenBLAS config sets variables, not a target.
add_library(cohort_openblas INTERFACE)
target_include_directories(cohort_openblas INTERFACE ${OpenBLAS_INCLUDE_DIRS})
target_link_libraries(cohort_openblas INTERFACE ${OpenBLAS_LIBRARIES})
find_package(GTest CONFIG REQUIRED)

find_program(GRPC_CPP_PLUGIN grpc_cpp_plugin REQUIRED)

# Debian's yaml-cpp config names its target differently across versions.
if(TARGET yaml-cpp::yaml-cpp)
  set(COHORT_YAML_TARGET yaml-cpp::yaml-cpp)
else()
  set(COHORT_YAML_TARGET yaml-cpp)
endif()
