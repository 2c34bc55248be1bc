// make_fuzz_seeds CORPUS_DIR DICT_DIR: writes the seed corpora of the fuzz
// targets to CORPUS_DIR/<target>/ and their dictionaries to
// DICT_DIR/<target>.dict. `tools/fuzz.sh --seeds` runs it into
// fuzz/corpus/ and fuzz/dict/ (the output is committed).
//
// The seeds are valid inputs that reach deep: the job specs of
// deploy/local/jobs in each format, request sequences that submit a job,
// attach its workers, use the KeyValue service and upload, list, download
// and delete a checkpoint, a manifest whose chunks tile its tensors, and
// token shards written by WriteTokenShard.

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cohort/v1/checkpoints.pb.h"
#include "cohort/v1/jobs.pb.h"
#include "cohort/v1/kv.pb.h"
#include "cohort/v1/workers.pb.h"
#include "common/crc32c.h"
#include "common/job_spec/io.h"
#include "fuzz/coordinator_rpc_ops.h"
#include "fuzz/fuzz_support.h"
#include "google/protobuf/descriptor.h"
#include "worker/data/token_shard.h"

namespace cohort::fuzz {
namespace {

namespace fs = std::filesystem;


std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void WriteFile(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
  if (!out) {
    std::cerr << "make_fuzz_seeds: cannot write " << path << "\n";
    std::exit(1);
  }
}

std::string Selected(uint8_t selector, const std::string& bytes) {
  return std::string(1, static_cast<char>(selector)) + bytes;
}

// ---- job_spec_fuzzer ----

void JobSpecSeeds(const fs::path& out) {
  const fs::path jobs = fs::path(COHORT_SOURCE_DIR) / "deploy/local/jobs";
  std::set<fs::path> files{fs::directory_iterator(jobs), fs::directory_iterator()};
  for (const fs::path& file : files) {
    const std::string text = ReadFile(file);
    const std::string stem = file.stem().string();
    if (file.extension() == ".json") {
      WriteFile(out / (stem + "-json"), Selected(0, text));
      WriteFile(out / (stem + "-json-detected"), Selected(2, text));
    } else {
      WriteFile(out / (stem + "-yaml"), Selected(1, text));
      WriteFile(out / (stem + "-yaml-detected"), Selected(2, text));
      WriteFile(out / (stem + "-yaml-untyped"), Selected(3, text));
    }
  }
}

// Every field name (proto and JSON spelling) and enum value of JobSpec.
void Dictionary(const google::protobuf::Descriptor* type, std::set<std::string>* words,
                std::set<const google::protobuf::Descriptor*>* seen) {
  if (!seen->insert(type).second) return;
  for (int i = 0; i < type->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* field = type->field(i);
    words->insert(field->name());
    words->insert(field->json_name());
    if (const google::protobuf::EnumDescriptor* e = field->enum_type()) {
      for (int v = 0; v < e->value_count(); ++v) words->insert(e->value(v)->name());
    }
    if (const google::protobuf::Descriptor* m = field->message_type()) Dictionary(m, words, seen);
  }
}

void JobSpecDictionary(const fs::path& path) {
  std::set<std::string> words;
  std::set<const google::protobuf::Descriptor*> seen;
  Dictionary(v1::JobSpec::descriptor(), &words, &seen);
  std::string dict =
      "# libFuzzer dictionary for job_spec_fuzzer: JobSpec field names and enum values\n"
      "# (written by make_fuzz_seeds), YAML syntax and integer bounds.\n";
  for (const std::string& w : words) absl::StrAppend(&dict, "\"", w, "\"\n");
  for (const char* y : {": ", "- ", "---", "&a ", "*a", "!!str ", "? ", "{", "}", "[", "]", ".inf",
                        ".nan", "~", "null", "true", "0x", "1e9", "-0", "|", ">",
                        // Integer bounds: where validation arithmetic overflows.
                        "2147483647", "-2147483648", "4294967295", "9223372036854775807",
                        "-9223372036854775808", "18446744073709551615"}) {
    std::string escaped;
    for (char c : std::string(y)) {
      if (c == '"' || c == '\\') escaped.push_back('\\');
      escaped.push_back(c);
    }
    absl::StrAppend(&dict, "\"", escaped, "\"\n");
  }
  WriteFile(path, dict);
}

// Protobuf varints of integer bounds (int32/uint32/int64/uint64 maxima,
// -1 as int64, 2^16) for the targets whose input is serialized protos:
// where size and product arithmetic overflows.
void VarintDictionary(const fs::path& path, const char* target) {
  std::string dict = absl::StrCat("# libFuzzer dictionary for ", target,
                                  ": varints of integer bounds (written by make_fuzz_seeds).\n");
  for (uint64_t v : {uint64_t{0x7FFFFFFF}, uint64_t{0xFFFFFFFF}, uint64_t{0x7FFFFFFFFFFFFFFF},
                     ~uint64_t{0}, uint64_t{1} << 16, uint64_t{1} << 31, uint64_t{1} << 32}) {
    std::string entry = "\"";
    do {
      const uint8_t byte = static_cast<uint8_t>((v & 0x7F) | (v > 0x7F ? 0x80 : 0));
      absl::StrAppend(&entry, absl::StrFormat("\\x%02x", byte));
      v >>= 7;
    } while (v != 0);
    absl::StrAppend(&dict, entry, "\"\n");
  }
  WriteFile(path, dict);
}

// ---- coordinator_rpc_fuzzer ----

class Sequence {
 public:
  Sequence& Add(uint8_t op, const std::string& payload) {
    AppendRecord(op, payload, &bytes_);
    return *this;
  }
  Sequence& Add(uint8_t op, const google::protobuf::Message& request) {
    return Add(op, request.SerializeAsString());
  }
  Sequence& Slot(uint8_t op, uint8_t slot, const google::protobuf::Message& message) {
    return Add(op, std::string(1, static_cast<char>(slot)) + message.SerializeAsString());
  }
  Sequence& Tick(uint32_t ms) {
    std::string payload;
    for (int i = 0; i < 4; ++i) payload.push_back(static_cast<char>(ms >> (8 * i)));
    return Add(kTick, payload);
  }
  const std::string& bytes() const { return bytes_; }

 private:
  std::string bytes_;
};

v1::JobSpec DemoSpec() {
  absl::StatusOr<v1::JobSpec> spec =
      ReadJobSpecFile(std::string(COHORT_SOURCE_DIR) + "/deploy/local/jobs/demo.yaml");
  if (!spec.ok()) {
    std::cerr << "make_fuzz_seeds: " << spec.status() << "\n";
    std::exit(1);
  }
  return *spec;
}

v1::WorkerMessage HelloMessage(const std::string& id, uint64_t incarnation) {
  v1::WorkerMessage m;
  m.set_incarnation(incarnation);
  v1::Hello* hello = m.mutable_hello();
  hello->set_worker_id(id);
  hello->set_host("host-" + id);
  hello->set_device_kind(v1::DEVICE_KIND_CPU);
  hello->set_incarnation(incarnation);
  hello->mutable_capabilities()->set_cpu_cores(2);
  hello->mutable_capabilities()->add_transports("ucx");
  return m;
}

// A worker's reply record (coordinator_rpc_fuzzer kWorkerReply).
std::string Reply(uint8_t slot, uint8_t state, uint32_t step) {
  std::string p{static_cast<char>(slot), static_cast<char>(state)};
  for (int i = 0; i < 4; ++i) p.push_back(static_cast<char>(step >> (8 * i)));
  return p;
}

// The upload of a one-writer checkpoint of `job` at generation `generation`.
void Upload(Sequence& s, const std::string& job, uint64_t generation, int64_t step) {
  v1::UploadRequest header;
  v1::UploadHeader* h = header.mutable_header();
  h->set_job_id(job);
  h->set_generation(generation);
  h->set_step(step);
  h->mutable_layout()->set_data_parallel(1);
  h->mutable_layout()->set_tensor_parallel(1);
  h->mutable_layout()->set_pipeline_parallel(1);
  h->set_writer(0);
  h->set_writers(1);
  v1::TensorInfo* t = h->add_tensors();
  t->set_name("param/wte");
  t->set_dtype(v1::TENSOR_DTYPE_FLOAT32);
  t->add_global_shape(2);
  t->add_global_shape(3);
  s.Slot(kUploadMessage, 0, header);
  // Two chunks: rows 0 and 1.
  for (int row = 0; row < 2; ++row) {
    const std::string data(12, static_cast<char>('a' + row));
    v1::UploadRequest chunk;
    v1::ChunkHeader* c = chunk.mutable_chunk();
    c->set_tensor("param/wte");
    c->mutable_box()->add_start(row);
    c->mutable_box()->add_start(0);
    c->mutable_box()->add_extent(1);
    c->mutable_box()->add_extent(3);
    c->set_bytes(data.size());
    c->set_crc32c(Crc32c(data));
    s.Slot(kUploadMessage, 0, chunk);
    v1::UploadRequest bytes;
    bytes.set_data(data);
    s.Slot(kUploadMessage, 0, bytes);
  }
  v1::UploadRequest end;
  end.mutable_end()->set_chunks(2);
  (*end.mutable_end()->mutable_objects())["model"] = "gpt-2x64";
  s.Slot(kUploadMessage, 0, end);
  // A second writer's chunk of 2^63 bytes: it once passed the size check as
  // a negative number (issue 21).
  s.Slot(kUploadMessage, 1, header);
  v1::UploadRequest huge;
  huge.mutable_chunk()->set_tensor("param/wte");
  huge.mutable_chunk()->set_bytes(uint64_t{1} << 63);
  s.Slot(kUploadMessage, 1, huge);
}

void RpcSeeds(const fs::path& out) {
  v1::SubmitJobRequest submit;
  *submit.mutable_spec() = DemoSpec();
  const std::string job = "demo-1";
  v1::GetJobRequest get;
  get.set_job_id(job);
  v1::CancelJobRequest cancel;
  cancel.set_job_id(job);
  v1::WatchJobRequest watch;
  watch.set_job_id(job);
  v1::ListJobsRequest list;
  list.set_include_finished(true);
  v1::ScaleJobRequest scale;
  scale.set_job_id(job);
  scale.set_min_workers(2);
  scale.set_max_workers(3);

  // Jobs alone.
  {
    Sequence s;
    v1::SubmitJobRequest validate = submit;
    validate.set_validate_only(true);
    s.Add(kSubmit, validate).Add(kSubmit, submit).Add(kGetJob, get).Add(kListJobs, list);
    s.Add(kWatch, watch).Add(kScale, scale).Add(kCancel, cancel).Add(kGetJob, get);
    s.Add(kUnwatch, std::string(1, '\0'));
    WriteFile(out / "jobs", s.bytes());
  }
  // A job on two workers that train, use the KeyValue service, checkpoint
  // and lose a worker.
  for (uint64_t generation : {1, 2}) {
    Sequence s;
    s.Slot(kAttachMessage, 0, HelloMessage("w0", 11));
    s.Slot(kAttachMessage, 1, HelloMessage("w1", 12));
    s.Add(kSubmit, submit).Add(kWatch, watch);
    s.Add(kWorkerReply, Reply(0, 1, 0)).Add(kWorkerReply, Reply(1, 1, 0));  // READY
    s.Tick(100);
    s.Add(kWorkerReply, Reply(0, 0x80, 5)).Add(kWorkerReply, Reply(1, 0x80, 5));  // heartbeats
    v1::SetRequest set;
    set.mutable_scope()->set_job_id(job);
    set.mutable_scope()->set_generation(generation);
    set.set_key("rank0/address");
    set.set_value("127.0.0.1:1234");
    v1::GetRequest kv_get;
    *kv_get.mutable_scope() = set.scope();
    kv_get.set_key(set.key());
    v1::WaitForRequest wait;
    *wait.mutable_scope() = set.scope();
    wait.set_key("rank1/address");
    wait.set_timeout_ms(1000);
    s.Add(kKvWaitFor, wait).Add(kKvSet, set).Add(kKvGet, kv_get);
    Upload(s, job, generation, 10);
    v1::ListCheckpointsRequest list_checkpoints;
    list_checkpoints.set_job_id(job);
    v1::GetManifestRequest manifest;
    manifest.set_job_id(job);
    manifest.set_step(-1);
    v1::DownloadRequest download;
    download.set_job_id(job);
    download.set_step(10);
    v1::DownloadRequest download_one = download;
    v1::ChunkRef* ref = download_one.add_chunks();
    ref->set_tensor("param/wte");
    ref->set_index(1);
    s.Add(kListCheckpoints, list_checkpoints).Add(kGetManifest, manifest);
    s.Add(kDownload, download).Add(kDownload, download_one);
    s.Add(kListWorkers, "");
    v1::DrainWorkerRequest drain;
    drain.set_worker_id("w1");
    drain.set_reason("maintenance");
    s.Add(kDrain, drain);
    s.Add(kWorkerReply, Reply(0, 5, 5));  // SUSPENDED
    s.Tick(4000);                         // w1 is silent past the heartbeat timeout
    s.Add(kAttachClose, std::string(1, '\1'));
    s.Slot(kAttachMessage, 1, HelloMessage("w1", 13));
    s.Add(kGetJob, get);
    v1::DeleteCheckpointRequest del;
    del.set_job_id(job);
    del.set_step(10);
    s.Add(kDeleteCheckpoint, del).Add(kCancel, cancel);
    s.Add(kUploadClose, std::string(1, '\0')).Add(kQuiesce, "");
    WriteFile(out / absl::StrCat("train-generation-", generation), s.bytes());
  }
}

// ---- checkpoint_manifest_fuzzer ----

v1::CheckpointManifest SampleManifest() {
  v1::CheckpointManifest m;
  m.set_job_id("demo-1");
  m.set_step(10);
  m.set_generation(2);
  m.mutable_layout()->set_data_parallel(2);
  m.mutable_layout()->set_tensor_parallel(1);
  m.mutable_layout()->set_pipeline_parallel(1);
  m.mutable_layout()->set_zero1(true);
  m.set_writers(2);
  m.set_committed_unix_ms(1'700'000'000'000);
  (*m.mutable_objects())["model"] = "gpt-2x64";
  (*m.mutable_objects())["trainer"] = std::string("\x01\x02\x03", 3);
  int64_t total = 0;
  // param/wte [4, 3] in two row blocks; opt/m [5] in two flat ranges.
  struct Chunk {
    std::vector<int64_t> start, extent;
  };
  const std::vector<std::tuple<std::string, std::vector<int64_t>, std::vector<Chunk>>> tensors = {
      {"opt/m", {5}, {{{0}, {3}}, {{3}, {2}}}},
      {"param/wte", {4, 3}, {{{0, 0}, {2, 3}}, {{2, 0}, {2, 3}}}},
  };
  for (const auto& [name, shape, chunks] : tensors) {
    v1::TensorInfo* t = m.add_tensors();
    t->set_name(name);
    t->set_dtype(v1::TENSOR_DTYPE_FLOAT32);
    for (int64_t d : shape) t->add_global_shape(d);
    uint32_t index = 0;
    for (const Chunk& chunk : chunks) {
      v1::ChunkInfo* c = t->add_chunks();
      c->set_index(index);
      int64_t elements = 1;
      for (int64_t s : chunk.start) c->mutable_box()->add_start(s);
      for (int64_t e : chunk.extent) {
        c->mutable_box()->add_extent(e);
        elements *= e;
      }
      c->set_bytes(static_cast<uint64_t>(elements) * 4);
      // The store mode puts each chunk as bytes of its index.
      const std::string bytes(c->bytes(), static_cast<char>(index));
      c->set_crc32c(Crc32c(bytes));
      c->set_writer(index);
      total += static_cast<int64_t>(c->bytes());
      ++index;
    }
  }
  m.set_total_bytes(total);
  return m;
}

void ManifestSeeds(const fs::path& out) {
  const std::string manifest = SampleManifest().SerializeAsString();
  const char* modes[] = {"coverage", "stores", "format", "safetensors"};
  for (uint8_t mode = 0; mode < 4; ++mode) {
    WriteFile(out / absl::StrCat("manifest-", modes[mode]), Selected(mode, manifest));
  }
  v1::ListCheckpointsResponse list;
  v1::CheckpointSummary* summary = list.add_checkpoints();
  summary->set_step(10);
  summary->set_generation(2);
  summary->mutable_layout()->set_data_parallel(2);
  summary->set_total_bytes(68);
  summary->set_committed_unix_ms(1'700'000'000'000);
  summary->set_tensors(2);
  summary->set_chunks(4);
  WriteFile(out / "list-format", Selected(2, list.SerializeAsString()));
}

// ---- token_shard_fuzzer ----

void ShardSeeds(const fs::path& out) {
  const fs::path tmp = out / "shard.tmp";
  auto write = [&](const std::string& name, const std::vector<uint16_t>& tokens, uint32_t knobs) {
    absl::Status s = data::WriteTokenShard(tmp.string(), tokens);
    if (!s.ok()) {
      std::cerr << "make_fuzz_seeds: " << s << "\n";
      std::exit(1);
    }
    std::string bytes = ReadFile(tmp);
    for (int i = 0; i < 4; ++i) bytes[12 + i] = static_cast<char>(knobs >> (8 * i));
    fs::remove(tmp);
    WriteFile(out / name, bytes);
  };
  std::vector<uint16_t> ramp(100);
  for (size_t i = 0; i < ramp.size(); ++i) ramp[i] = static_cast<uint16_t>(i * 7 % 50);
  write("shard-100-tokens", ramp, 0);
  // Context 8, batch 4, vocabulary bound 49 (knobs in header int 3).
  write("shard-100-tokens-sampled", ramp, 7u | (3u << 6) | (1u << 9) | (49u << 10));
  write("shard-empty", {}, 0);
  write("shard-short", {1, 2, 3}, 16);
}

// ---- weights_file_fuzzer ----

void WeightsFileSeeds(const fs::path& out) {
  // A header of two tensors over 2 x 64 data bytes (the first byte of the
  // record sets the data size in units of 64).
  std::string header;
  AppendRecord(0,
               std::string("\x02") +
                   R"({"__metadata__":{"format":"pt"},"wte.weight":{"dtype":"F32","shape":[4,4],)"
                   R"("data_offsets":[0,64]},"ln_f.bias":{"dtype":"BF16","shape":[4],)"
                   R"("data_offsets":[64,72]}})",
               &header);
  WriteFile(out / "safetensors-header", header);
  // A vocabulary of the 256 byte tokens (GPT-2's printable stand-ins) and
  // three merges, then text through it.
  std::string encoder = "{";
  int id = 0;
  auto add = [&](const std::string& token) {
    absl::StrAppend(&encoder, id == 0 ? "" : ",", "\"", token, "\":", id);
    ++id;
  };
  // GPT-2's byte alphabet: printable Latin-1 bytes stand for themselves,
  // the others map to U+0100 upwards in byte order.
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    const int code = printable ? b : next++;
    std::string utf8;
    if (code < 0x80) {
      utf8 = std::string(1, static_cast<char>(code));
    } else {
      utf8 += static_cast<char>(0xC0 | (code >> 6));
      utf8 += static_cast<char>(0x80 | (code & 0x3F));
    }
    if (utf8 == "\"" || utf8 == "\\") utf8 = "\\" + utf8;
    add(utf8);
  }
  add("th");
  add("the");
  add("\u0120the");
  encoder += "}";
  const std::string merges = "#version: 0.2\nt h\nth e\n\u0120 the\n";
  std::string tokenizer;
  AppendRecord(1, encoder, &tokenizer);
  AppendRecord(2, merges, &tokenizer);
  AppendRecord(3, "the theory of the other thing, isn't it? 42 na\xc3\xafve \xe6\x97\xa5  \n", &tokenizer);
  WriteFile(out / "gpt2-vocabulary-and-text", tokenizer);
}

// ---- peer_input_fuzzer ----

void PeerInputSeeds(const fs::path& out) {
  std::string all;
  AppendRecord(0, HelloMessage("node-7-gpu-3", 42).hello().SerializeAsString(), &all);
  AppendRecord(1, "cohort://worker/w0\ncohort://host/h1\nhttps://example.com", &all);
  AppendRecord(1, "cohort://worker/*", &all);
  AppendRecord(2, "127.0.0.1:7070", &all);
  AppendRecord(2, "[::1]:0", &all);
  AppendRecord(3, "500ms;3s;10s;10s;10m;30s;10m", &all);
  AppendRecord(4, "w0\nI forged line\x01\xff", &all);
  WriteFile(out / "peer-inputs", all);
}

}  // namespace
}  // namespace cohort::fuzz

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  if (argc != 3) {
    std::cerr << "usage: make_fuzz_seeds CORPUS_DIR DICT_DIR\n";
    return 64;
  }
  const fs::path out = argv[1];
  fs::create_directories(argv[2]);
  for (const char* target : {"job_spec_fuzzer", "coordinator_rpc_fuzzer",
                             "checkpoint_manifest_fuzzer", "token_shard_fuzzer",
                             "peer_input_fuzzer", "weights_file_fuzzer"}) {
    fs::create_directories(out / target);
  }
  cohort::fuzz::JobSpecSeeds(out / "job_spec_fuzzer");
  cohort::fuzz::JobSpecDictionary(fs::path(argv[2]) / "job_spec_fuzzer.dict");
  for (const char* target : {"coordinator_rpc_fuzzer", "checkpoint_manifest_fuzzer"}) {
    cohort::fuzz::VarintDictionary(fs::path(argv[2]) / absl::StrCat(target, ".dict"), target);
  }
  cohort::fuzz::RpcSeeds(out / "coordinator_rpc_fuzzer");
  cohort::fuzz::ManifestSeeds(out / "checkpoint_manifest_fuzzer");
  cohort::fuzz::ShardSeeds(out / "token_shard_fuzzer");
  cohort::fuzz::PeerInputSeeds(out / "peer_input_fuzzer");
  cohort::fuzz::WeightsFileSeeds(out / "weights_file_fuzzer");
  return 0;
}
