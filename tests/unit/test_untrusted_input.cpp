// Every file strata reads is untrusted: a checkpoint edited and re-checksummed, a foreign
// safetensors file, a FIFO or a device in place of a file. Each case below once crashed, hung,
// wrote past a buffer or was silently accepted; now each is one strata::error naming the file and
// the field. Only public reader entry points are used, so the same file builds against older
// headers to show the failure.
#include <doctest/doctest.h>

#include <sys/stat.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <strata/parallel/sequential_model.hpp>
#include <strata/train/checkpoint.hpp>
#include <strata/train/safetensors.hpp>
#include <strata/train/token_data.hpp>

#include "strata/models/gpt2.hpp"

namespace st = strata;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

using P32 = st::policy<st::host, st::serial, st::fp32>;
const strata::models::gpt2::dims tiny{.vocab = 256, .seq = 16, .layers = 1, .heads = 2, .d_model = 32};

// A fresh scratch directory under the build tree.
std::string scratch(const std::string& name) {
  const auto dir = fs::current_path() / ("untrusted_test_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}
std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A safetensors file with this header text and these data bytes (no checks: that is the point).
std::string file_with(const std::string& header, const std::string& data) {
  std::string len(8, '\0');
  for (int i = 0; i < 8; ++i) len[std::size_t(i)] = char((header.size() >> (8 * i)) & 0xff);
  return len + header + data;
}

// One rank's model, optimizer and checkpointer: a tiny checkpoint to damage, and a run to load it.
struct tiny_run {
  st::memory_ledger ledger;
  st::sequential_model<strata::models::gpt2::model<P32>> model{ledger, tiny, st::seed{3}};
  st::adamw<P32> opt{model, {.lr = 3e-3}};
  st::checkpointer ckpt;
  explicit tiny_run(const std::string& dir)
      : ckpt({dir, 0}, st::group_ref(), {{"world", 1}}, {{"layers", tiny.layers}, {"d_model", tiny.d_model}}) {}
  st::train_state_ref<P32> state() { return {model.parameters(), opt, {}}; }
  std::string save() { return ckpt.save(st::train_progress{1, 1, {}, 5, 1}, state()); }
  void load(const std::string& step_dir) { ckpt.load(step_dir, state()); }
};

// Rewrites the manifest's size and CRC-32 of rank 0's file and the COMPLETE marker, as a writer
// that means it would: what is left to refuse the checkpoint is the reader's own checks.
void rechecksum(const std::string& step_dir, const std::string& manifest_text_with_placeholder = "",
                const std::string& placeholder = "", const std::string& replacement = "") {
  const std::string rank_file = step_dir + "/rank-00000.safetensors";
  const std::string bytes = read_text(rank_file);
  json m = json::parse(read_text(step_dir + "/manifest.json"));
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  m["files"][0]["bytes"] = bytes.size();
  m["files"][0]["crc32"] = st::checkpoint_files::hex32(st::crc32_of({p, bytes.size()}));
  std::string text = manifest_text_with_placeholder.empty() ? m.dump(1) + "\n" : manifest_text_with_placeholder;
  if (!placeholder.empty()) text.replace(text.find(placeholder), placeholder.size(), replacement);
  write_bytes(step_dir + "/manifest.json", text);
  const auto* t = reinterpret_cast<const unsigned char*>(text.data());
  write_bytes(step_dir + "/COMPLETE", "crc32 " + st::checkpoint_files::hex32(st::crc32_of({t, text.size()})) + "\n");
}

// Edits rank 0's piece list (and, for a piece whose start moves, its tensors' names), then
// re-checksums.
void edit_pieces(const std::string& step_dir, const std::function<void(json&, std::vector<st::named_tensor>&)>& edit) {
  const std::string path = step_dir + "/rank-00000.safetensors";
  std::map<std::string, std::string> meta;
  auto tensors = st::read_safetensors(path, &meta);
  json pieces = json::parse(meta.at("pieces"));
  edit(pieces, tensors);
  meta["pieces"] = pieces.dump();
  const auto bytes = st::encode_safetensors(tensors, meta);
  write_bytes(path, std::string(bytes.begin(), bytes.end()));
  rechecksum(step_dir);
}

// The first piece of a matrix with an even number of columns (the token embedding).
std::size_t matrix_piece(const json& pieces) {
  for (std::size_t k = 0; k < pieces.size(); ++k)
    if (pieces[k]["full"].size() == 2 && pieces[k]["full"][1].get<std::int64_t>() % 2 == 0) return k;
  FAIL("no matrix piece");
  return 0;
}

// Copies the saved checkpoint to a fresh step directory, applies `edit`, and returns the
// message loading it ends with ("" when it loads).
std::string load_edited(const std::string& saved, const std::string& name,
                        const std::function<void(json&, std::vector<st::named_tensor>&)>& edit) {
  const std::string dir = scratch("pieces_" + name);
  const std::string step_dir = st::checkpoint_files::step_dir(dir, 1);
  fs::copy(saved, step_dir, fs::copy_options::recursive);
  edit_pieces(step_dir, edit);
  tiny_run r(dir);
  try {
    r.load(step_dir);
  } catch (const st::error& e) { return e.what(); }
  return "";
}

// Runs `f`, which must throw strata::error within `seconds` (a FIFO must not block the reader).
template <class F>
std::string error_within(double seconds, F&& f) {
  const auto start = std::chrono::steady_clock::now();
  std::string what = "(no error)";
  try {
    f();
  } catch (const st::error& e) { what = e.what(); }
  CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < seconds);
  return what;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

// Finding 1: the loader trusted each piece's shard fields once the CRCs matched.
TEST_CASE("untrusted input: a checkpoint piece's shard fields are checked against the file and the model") {
  const std::string dir = scratch("pieces");
  tiny_run writer(dir);
  const std::string saved = writer.save();
  const std::string file = "/rank-00000.safetensors";
  REQUIRE(load_edited(saved, "unchanged", [](json&, auto&) {}).empty());  // the editing itself is harmless

  // A full shape of the right element count, split so that half the piece lands past the
  // parameter: the old loader wrote past its buffer.
  std::string why = load_edited(saved, "reshaped", [](json& p, auto&) {
    auto& x = p[matrix_piece(p)];
    const auto rows = x["full"][0].get<std::int64_t>(), cols = x["full"][1].get<std::int64_t>();
    x["full"] = {rows * 2, cols / 2};
    x["parts"] = 2;
    x["index"] = 1;
  });
  CHECK(contains(why, file));
  CHECK(contains(why, "fields 'full' [512, 16]"));
  CHECK(contains(why, "this model [256, 32]"));

  // A start near 2^63: begin + count overflowed and the piece was written at a wild index.
  why = load_edited(saved, "begin", [](json& p, std::vector<st::named_tensor>& tensors) {
    auto& x = p[matrix_piece(p)];
    const std::string from = "@" + std::to_string(x["begin"].get<std::int64_t>());
    const std::int64_t begin = INT64_MAX - 100;
    for (auto& t : tensors)
      if (t.name.find(x["param"].get<std::string>() + from) != std::string::npos)
        t.name = t.name.substr(0, t.name.size() - from.size()) + "@" + std::to_string(begin);
    x["begin"] = begin;
  });
  CHECK(contains(why, file));
  CHECK(contains(why, "field 'begin' is 9223372036854775707"));

  // A full shape whose element count wraps around to the parameter's: signed overflow.
  why = load_edited(saved, "wrapping", [](json& p, auto&) {
    auto& x = p[matrix_piece(p)];
    x["full"] = {(std::int64_t(1) << 62) + 2048, 4};
    x["dim"] = 1;
    x["parts"] = 2;
  });
  CHECK(contains(why, file));
  CHECK(contains(why, "field 'full[0]' is 4611686018427389952"));

  // Each split field out of range, fractional or of the wrong type is named with its value.
  const std::vector<std::pair<std::function<void(json&)>, std::string>> bad{
      {[](json& x) { x["parts"] = 0; }, "field 'parts' is 0"},
      {[](json& x) { x["blocks"] = 0; }, "field 'blocks' is 0"},
      {[](json& x) { x["dim"] = 4; }, "field 'dim' is 4"},
      {[](json& x) { x["dim"] = -1; }, "field 'dim' is -1"},
      {[](json& x) { x["dim"] = 1e300; }, "field 'dim' is 1e+300"},
      {[](json& x) { x["parts"] = 1.5; }, "field 'parts' is 1.5"},
      {[](json& x) { x["index"] = 3; }, "field 'index' is 3"},
      {[](json& x) { x["numel"] = 1 << 20; }, "field 'numel' is 1048576"},
      {[](json& x) { x["count"] = "8192"; }, "field 'count' is \"8192\""},
      {[](json& x) { x["real_rows"] = 1 << 20; }, "field 'real_rows' is 1048576"},
      {[](json& x) { x["block_parts"] = {0}; }, "field 'block_parts[0]' is 0"},
      {[](json& x) {
         x["full"] = {256, 32, 1, 1, 1};
       },
       "field 'full'"},
  };
  int n = 0;
  for (const auto& [edit, expected] : bad) {
    why = load_edited(saved, "field" + std::to_string(n++), [&](json& p, auto&) { edit(p[matrix_piece(p)]); });
    CAPTURE(expected);
    CHECK(contains(why, file));
    CHECK(contains(why, expected));
  }
}

// Finding 2: deeply nested JSON overflowed the stack (copies and dumps recurse per level), and a
// key given twice was taken from whichever came last.
TEST_CASE("untrusted input: deep nesting and duplicate keys in a manifest or a safetensors header are refused") {
  const std::string dir = scratch("nesting");
  const std::string deep = std::string(1 << 20, '[') + std::string(1 << 20, ']');

  // A safetensors header with a deeply nested metadata value.
  const std::string path = dir + "/deep.safetensors";
  write_bytes(path, file_with(R"({"__metadata__":{"x":)" + deep + "}}", ""));
  std::map<std::string, std::string> meta;
  CHECK_THROWS_WITH_AS(st::read_safetensors(path, &meta), doctest::Contains("deep.safetensors': the header"),
                       st::error);
  CHECK_THROWS_WITH_AS(st::read_safetensors(path, &meta), doctest::Contains("nests deeper than 16 levels"), st::error);
  CHECK_THROWS_WITH_AS(st::safetensors_reader{path}, doctest::Contains("nests deeper than 16 levels"), st::error);

  // A key twice: in the header, and inside an entry.
  const std::string twice = dir + "/twice.safetensors";
  write_bytes(twice, file_with(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                               R"("w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                               std::string(8, '\0')));
  CHECK_THROWS_WITH_AS(st::read_safetensors(twice), doctest::Contains("twice.safetensors': the header"), st::error);
  CHECK_THROWS_WITH_AS(st::read_safetensors(twice), doctest::Contains("has the key 'w' twice"), st::error);
  write_bytes(twice, file_with(R"({"w":{"dtype":"F32","dtype":"F16","shape":[2],"data_offsets":[0,4]}})",
                               std::string(4, '\0')));
  CHECK_THROWS_WITH_AS(st::read_safetensors(twice), doctest::Contains("has the key 'dtype' twice in the object at 'w'"),
                       st::error);

  // A manifest whose layout nests a million levels, checksummed as if written by strata.
  tiny_run writer(dir + "/ck");
  const std::string step_dir = writer.save();
  json m = json::parse(read_text(step_dir + "/manifest.json"));
  m["layout"] = "DEEP";
  rechecksum(step_dir, m.dump(1) + "\n", "\"DEEP\"", deep);
  tiny_run reader(dir + "/ck");
  const std::string nests = step_dir + "/manifest.json' nests deeper than 16 levels";
  CHECK_THROWS_WITH_AS(reader.load(step_dir), doctest::Contains(nests.c_str()), st::error);
  // And one that gives the step twice.
  m["layout"] = json::object();
  std::string text = m.dump(1) + "\n";
  text.insert(text.find('{') + 1, "\"step\": 999,");
  rechecksum(step_dir, text);
  CHECK_THROWS_WITH_AS(reader.load(step_dir), doctest::Contains("has the key 'step' twice"), st::error);
}

// Finding 3: sizes multiplied in int64 wrapped (undefined behaviour) instead of being refused.
TEST_CASE("untrusted input: element counts that overflow are refused, never wrapped") {
  const std::int64_t g = std::int64_t(1) << 31;
  CHECK_THROWS_WITH_AS(st::shape({g, g, g}).numel(), doctest::Contains("more than 2^63 elements"), st::error);
  CHECK_THROWS_WITH_AS(st::shape({4, -2}).numel(), doctest::Contains("negative dimension"), st::error);
  CHECK(st::shape({g, g}).numel() == g * g);
  const st::named_tensor t{"t", "F32", {g, g, g}, {}};
  CHECK_THROWS_WITH_AS(t.numel(), doctest::Contains("tensor 't'"), st::error);

  // A zero-element tensor whose other dimensions multiply past 2^63, with 0 bytes of data.
  const std::string dir = scratch("overflow");
  const std::string path = dir + "/huge.safetensors";
  write_bytes(
      path,
      file_with(R"({"w":{"dtype":"F32","shape":[0,4611686018427387904,4611686018427387904],"data_offsets":[0,0]}})",
                ""));
  CHECK_THROWS_WITH_AS(st::read_safetensors(path), doctest::Contains("huge.safetensors': tensor 'w': field 'shape'"),
                       st::error);
  CHECK_THROWS_WITH_AS(st::safetensors_reader{path}, doctest::Contains("more than 2^56 elements"), st::error);
  write_bytes(path, file_with(R"({"w":{"dtype":"F32","shape":[2147483648,2147483648],"data_offsets":[0,0]}})", ""));
  CHECK_THROWS_WITH_AS(st::read_safetensors(path), doctest::Contains("huge.safetensors': tensor 'w': field 'shape'"),
                       st::error);

  // AdamW's state size: a negative count is refused before any cast to size_t.
  st::memory_ledger ledger;
  st::sequential_model<strata::models::gpt2::model<P32>> model(ledger, tiny, st::seed{3});
  CHECK_THROWS_WITH_AS(st::adamw<P32>(model.parameters(), {}, {}, -1), doctest::Contains("optimizer state elements"),
                       st::error);
}

// Finding 4: a FIFO blocked the reader forever, /dev/zero filled memory.
TEST_CASE("untrusted input: only regular files are read; a FIFO or a device is refused at once") {
  const std::string dir = scratch("special");
  const std::string fifo = dir + "/fifo.safetensors";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK(contains(error_within(5, [&] { st::read_whole_file(fifo); }),
                 "'" + fifo + "' is not a readable file: it is a FIFO"));
  CHECK(contains(error_within(5, [&] { st::read_safetensors(fifo); }), "is a FIFO, not a regular file"));
  CHECK(contains(error_within(5, [&] { st::safetensors_reader{fifo}; }),
                 fifo + "' is not a readable file: it is a FIFO"));
  CHECK(contains(error_within(5, [&] { st::read_whole_file("/dev/zero"); }),
                 "'/dev/zero' is not a readable file: it is a character device"));
  CHECK(contains(error_within(5, [&] { st::read_whole_file(dir); }), "is not a readable file: it is a directory"));

  // A FIFO in place of a checkpoint's rank file.
  tiny_run writer(dir + "/ck");
  const std::string step_dir = writer.save();
  const std::string rank_file = step_dir + "/rank-00000.safetensors";
  fs::remove(rank_file);
  REQUIRE(::mkfifo(rank_file.c_str(), 0600) == 0);
  tiny_run reader(dir + "/ck");
  CHECK(
      contains(error_within(5, [&] { reader.load(step_dir); }), rank_file + "' is not a readable file: it is a FIFO"));
  CHECK(contains(st::checkpoint_files::problem(step_dir), "is a FIFO"));
}

// Finding 5: the safetensors reader accepted overlapping and gapped data offsets, duplicate keys,
// fractional or negative numbers and fields of the wrong type.
TEST_CASE("untrusted input: a safetensors header must tile the data exactly, with integer fields of the right type") {
  const std::string dir = scratch("lenient");
  const std::string path = dir + "/x.safetensors";
  const std::string f32 = R"("dtype":"F32",)";
  const auto refused = [&](const std::string& header, const std::string& data, const std::string& expected) {
    write_bytes(path, file_with(header, data));
    CAPTURE(header);
    std::string read_all = "(no error)", lazy = "(no error)";
    try {
      st::read_safetensors(path);
    } catch (const st::error& e) { read_all = e.what(); }
    try {
      st::safetensors_reader r(path);
    } catch (const st::error& e) { lazy = e.what(); }
    CHECK(contains(read_all, "x.safetensors'"));
    CHECK(contains(read_all, expected));
    CHECK(contains(lazy, expected));
  };
  const std::string eight(8, '\0'), twelve(12, '\0');
  // Two tensors over the same bytes.
  refused(
      "{\"a\":{" + f32 + R"("shape":[2],"data_offsets":[0,8]},"b":{)" + f32 + R"("shape":[2],"data_offsets":[4,12]}})",
      twelve, "tensor 'b' has data_offsets [4, 12], overlapping tensor 'a'");
  refused(
      "{\"a\":{" + f32 + R"("shape":[2],"data_offsets":[0,8]},"b":{)" + f32 + R"("shape":[2],"data_offsets":[0,8]}})",
      eight, "overlapping tensor 'a'");
  // A hole between two tensors, and bytes after the last.
  refused(
      "{\"a\":{" + f32 + R"("shape":[1],"data_offsets":[0,4]},"b":{)" + f32 + R"("shape":[1],"data_offsets":[8,12]}})",
      twelve, "leaving the data bytes [4, 8) to no tensor");
  refused("{\"a\":{" + f32 + R"("shape":[1],"data_offsets":[0,4]}})", eight, "the data bytes [4, 8) (file offset");
  // Fractional, negative and mistyped numbers and fields.
  refused("{\"a\":{" + f32 + R"("shape":[2.0],"data_offsets":[0,8]}})", eight, "tensor 'a': field 'shape[0]' is 2.0");
  refused("{\"a\":{" + f32 + R"("shape":[-2],"data_offsets":[0,8]}})", eight, "tensor 'a': field 'shape[0]' is -2");
  refused("{\"a\":{" + f32 + R"("shape":[2],"data_offsets":[0,8.0]}})", eight, "field 'data_offsets[1]' is 8.0");
  refused("{\"a\":{" + f32 + R"("shape":[2],"data_offsets":[-8,0]}})", eight, "field 'data_offsets[0]' is -8");
  refused("{\"a\":{" + f32 + R"("shape":[2],"data_offsets":[0,8,8]}})", eight, "field 'data_offsets' is [0,8,8]");
  refused(R"({"a":{"dtype":7,"shape":[2],"data_offsets":[0,8]}})", eight,
          "tensor 'a': field 'dtype' is 7, expected a string");
  refused("{\"a\":{" + f32 + R"("shape":"2","data_offsets":[0,8]}})", eight, "field 'shape' is \"2\"");
  refused("{\"a\":{" + f32 + R"("shape":[2],"data_offsets":[0,8],"offset":3}})", eight,
          "tensor 'a' has the field 'offset'");
  refused(R"({"__metadata__":{"format":["pt"]},"a":{)" + f32 + R"("shape":[2],"data_offsets":[0,8]}})", eight,
          "__metadata__: field 'format' is [\"pt\"], expected a string");
  // A key twice: the last one used to win.
  refused(
      "{\"a\":{" + f32 + R"("shape":[1],"data_offsets":[0,4]},"a":{)" + f32 + R"("shape":[2],"data_offsets":[0,8]}})",
      eight, "has the key 'a' twice");

  // What strata writes still reads, including zero-sized tensors anywhere among the others.
  st::write_safetensors(path, {st::make_tensor<float>("a", {2}, {1, 2}), st::make_tensor<float>("e", {0, 3}, {}),
                               st::make_tensor<float>("b", {1}, {3})});
  CHECK(st::read_safetensors(path).size() == 3);
  CHECK(st::safetensors_reader(path).entries().size() == 3);
}

// Finding 6: token shards - only regular files (checked on the opened descriptor, FIFOs opened
// without blocking), sizes from the file before allocation, every token against the vocabulary.
TEST_CASE("untrusted input: token shards are regular files with every header field and token checked") {
  const std::string dir = scratch("tokens");
  const std::string fifo = dir + "/train_000.bin";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK(contains(error_within(5, [&] { st::read_token_shard(fifo, 256); }),
                 "token shard '" + fifo + "' is not a readable file: it is a FIFO, not a regular file"));
  CHECK(contains(error_within(5, [&] { st::token_stream::from_glob(dir + "/train_*.bin", 256, 1); }), "it is a FIFO"));
  CHECK(contains(error_within(5, [&] { st::read_token_shard("/dev/zero", 256); }), "it is a character device"));
  CHECK(
      contains(error_within(5, [&] { st::read_token_shard(dir, 256); }), "is not a readable file: it is a directory"));

  const std::string shard = dir + "/shard.bin";
  st::write_token_shard(shard, {1, 2, 3});
  CHECK_THROWS_WITH_AS(st::read_token_shard(shard, 0), doctest::Contains("vocab 0 must be >= 1"), st::error);
  CHECK_THROWS_WITH_AS(st::read_token_shard(shard, 3), doctest::Contains("token 3 at byte offset 1028 is out of range"),
                       st::error);
  // A negative token count and a count the file does not hold.
  std::string bytes = read_text(shard);
  const auto set_count = [&](std::int32_t n) {
    std::memcpy(bytes.data() + 8, &n, 4);
    write_bytes(shard, bytes);
  };
  set_count(-1);
  CHECK_THROWS_WITH_AS(st::read_token_shard(shard, 256), doctest::Contains("negative token count -1 at offset 8"),
                       st::error);
  set_count(INT32_MAX);
  CHECK_THROWS_WITH_AS(st::read_token_shard(shard, 256), doctest::Contains("header promises 2147483647 tokens"),
                       st::error);
  // An llm.c shard cut inside its header is not a headerless shard of 2-byte tokens.
  write_bytes(shard, bytes.substr(0, 100));
  CHECK_THROWS_WITH_AS(st::read_token_shard(shard, 65536),
                       doctest::Contains("has 100 bytes, less than the 1024-byte header"), st::error);
}
