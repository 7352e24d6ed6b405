// strata/train/token_data.hpp - token shards on disk and the batches drawn from them.
//
// Two uint16 shard formats are read: llm.c's (a 256 x int32 header - magic 20240520,
// version 1, token count - then the tokens) and nanoGPT's headerless stream. A shard is
// recognised by its magic; anything else must be a whole number of uint16 tokens. Every
// failure names the file and, where it applies, the byte offset and the value.
#pragma once
#include <glob.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/core/init.hpp"
#include "strata/core/tensor.hpp"
#include "strata/train/durable_file.hpp"

namespace strata {

inline constexpr std::int32_t llmc_shard_magic = 20240520;
inline constexpr std::int32_t llmc_shard_version = 1;
inline constexpr std::size_t llmc_header_bytes = 256 * sizeof(std::int32_t);

// Reads one shard, checking every token against the vocabulary. Only a regular file is read,
// checked on the opened descriptor (train/durable_file.hpp: a FIFO or a device is refused, not
// waited on or read forever), and its size is known before anything is allocated.
inline std::vector<std::uint16_t> read_token_shard(const std::string& path, std::int64_t vocab) {
  STRATA_CHECK(vocab >= 1, "token shard '", path, "': vocab ", vocab, " must be >= 1");
  const regular_file in(path, "token shard");
  STRATA_CHECK(in.size() <= std::uint64_t(PTRDIFF_MAX), "token shard '", path, "' has ", in.size(),
               " bytes, too many to read");
  const auto file_bytes = static_cast<std::size_t>(in.size());
  std::size_t offset = 0, count = 0;
  std::int32_t header[256] = {};
  unsigned char raw[llmc_header_bytes];
  in.read_at(0, raw, std::min(file_bytes, llmc_header_bytes));
  std::memcpy(header, raw, std::min(file_bytes, llmc_header_bytes));
  // The magic with less than a header after it is an llm.c shard cut short, not 2-byte tokens
  // (which, under a large vocabulary, would all pass).
  STRATA_CHECK(file_bytes >= llmc_header_bytes || file_bytes < 4 || header[0] != llmc_shard_magic, "token shard '",
               path, "': starts with the llm.c magic ", llmc_shard_magic, " but has ", file_bytes,
               " bytes, less than the ", llmc_header_bytes, "-byte header (truncated)");
  if (file_bytes >= llmc_header_bytes && header[0] == llmc_shard_magic) {
    STRATA_CHECK(header[1] == llmc_shard_version, "token shard '", path, "': header version ", header[1],
                 " at offset 4, expected ", llmc_shard_version);
    STRATA_CHECK(header[2] >= 0, "token shard '", path, "': negative token count ", header[2], " at offset 8");
    count = static_cast<std::size_t>(header[2]);
    offset = llmc_header_bytes;
    const std::size_t expected = offset + count * 2;
    STRATA_CHECK(file_bytes == expected, "token shard '", path, "': header promises ", count, " tokens (", expected,
                 " bytes) but the file has ", file_bytes, " bytes (truncated or padded)");
  } else {
    STRATA_CHECK(file_bytes % 2 == 0, "token shard '", path, "': ", file_bytes,
                 " bytes is not a whole number of uint16 tokens (no llm.c header either)");
    count = file_bytes / 2;
  }
  STRATA_CHECK(count > 0, "token shard '", path, "' holds no tokens");
  std::vector<std::uint16_t> tokens(count);
  in.read_at(offset, reinterpret_cast<unsigned char*>(tokens.data()), count * 2);
  for (std::size_t i = 0; i < count; ++i)
    STRATA_CHECK(tokens[i] < vocab, "token shard '", path, "': token ", tokens[i], " at byte offset ", offset + 2 * i,
                 " is out of range for vocab ", vocab);
  return tokens;
}

// The files a glob names, sorted; none is an error that repeats the pattern.
inline std::vector<std::string> expand_glob(const std::string& pattern) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> files;
  if (rc == 0)
    for (std::size_t i = 0; i < g.gl_pathc; ++i) files.emplace_back(g.gl_pathv[i]);
  ::globfree(&g);
  STRATA_CHECK(!files.empty(), "no token shard matches '", pattern, "'");
  std::sort(files.begin(), files.end());
  return files;
}

// Writes tokens as an llm.c shard (used by tests and by tools that make shards).
inline void write_token_shard(const std::string& path, const std::vector<std::uint16_t>& tokens) {
  STRATA_CHECK(tokens.size() <= std::size_t(INT32_MAX), "token shard '", path, "': ", tokens.size(),
               " tokens do not fit the header's int32 count");
  std::ofstream out(path, std::ios::binary);
  STRATA_CHECK(out.good(), "cannot create token shard '", path, "'");
  std::int32_t header[256] = {};
  header[0] = llmc_shard_magic;
  header[1] = llmc_shard_version;
  header[2] = static_cast<std::int32_t>(tokens.size());
  out.write(reinterpret_cast<const char*>(header), sizeof header);
  out.write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(tokens.size() * 2));
  STRATA_CHECK(out.good(), "writing token shard '", path, "' failed");
}

// One batch: inputs [B, T] and next-token targets [B, T].
struct token_batch {
  std::vector<std::int32_t> inputs, targets;
  std::int64_t batch = 0, seq = 0;
  tensor_view<const std::int32_t> input_view(std::int64_t first = 0, std::int64_t rows = -1) const {
    if (rows < 0) rows = batch;
    return {inputs.data() + first * seq, {rows, seq}};
  }
  tensor_view<const std::int32_t> target_view(std::int64_t first = 0, std::int64_t rows = -1) const {
    if (rows < 0) rows = batch;
    return {targets.data() + first * seq, {rows, seq}};
  }
};

// How batches walk the stream: windows at seeded random places (each epoch-free draw independent,
// the default), or in order - row r of batch k is window k * batch + r, consecutive windows
// sharing one token as next-token targets need - wrapping at the end.
enum class data_order { shuffled, sequential };

inline data_order parse_data_order(std::string_view s) {
  if (s == "shuffled") return data_order::shuffled;
  STRATA_CHECK(s == "sequential", "data order '", s, "' is not one of shuffled, sequential");
  return data_order::sequential;
}

// A token stream and a deterministic sampler of windows from it: batch k's windows depend
// only on (seed, k), so a run is reproducible and a resumed run can continue at batch k. Every
// data-parallel rank draws the same global batch and trains on its own rows of it, so the
// ranks' slices are disjoint and the order does not depend on the layout.
class token_stream {
 public:
  token_stream(std::vector<std::uint16_t> tokens, std::uint64_t seed, data_order order = data_order::shuffled)
      : tokens_(std::move(tokens)), seed_(seed), order_(order) {}

  // All shards a glob names, concatenated in name order.
  static token_stream from_glob(const std::string& pattern, std::int64_t vocab, std::uint64_t seed,
                                data_order order = data_order::shuffled) {
    std::vector<std::uint16_t> all;
    for (const auto& f : expand_glob(pattern)) {
      auto t = read_token_shard(f, vocab);
      all.insert(all.end(), t.begin(), t.end());
    }
    return token_stream(std::move(all), seed, order);
  }

  token_batch next_batch(std::int64_t batch, std::int64_t seq) {
    STRATA_CHECK(static_cast<std::int64_t>(tokens_.size()) > seq, "token stream: ", tokens_.size(),
                 " tokens cannot fill one window of seq + 1 = ", seq + 1);
    token_batch b;
    b.batch = batch;
    b.seq = seq;
    b.inputs.resize(static_cast<std::size_t>(batch * seq));
    b.targets.resize(b.inputs.size());
    const auto starts = static_cast<std::uint64_t>(tokens_.size()) - static_cast<std::uint64_t>(seq);
    for (std::int64_t r = 0; r < batch; ++r) {
      const auto row = static_cast<std::uint64_t>(r);
      const auto start =
          order_ == data_order::sequential
              ? ((position_ * static_cast<std::uint64_t>(batch) + row) * static_cast<std::uint64_t>(seq)) % starts
              : counter_bits(seed_, 0xba7c4, position_ * 65536 + row) % starts;
      for (std::int64_t t = 0; t < seq; ++t) {
        b.inputs[static_cast<std::size_t>(r * seq + t)] = tokens_[start + static_cast<std::uint64_t>(t)];
        b.targets[static_cast<std::size_t>(r * seq + t)] = tokens_[start + static_cast<std::uint64_t>(t) + 1];
      }
    }
    ++position_;
    return b;
  }

  std::size_t size() const { return tokens_.size(); }
  // Batches drawn so far: with the seed, the whole state of the order (a checkpoint keeps both).
  std::uint64_t position() const { return position_; }
  std::uint64_t seed() const { return seed_; }
  void seek(std::uint64_t position) { position_ = position; }
  const std::vector<std::uint16_t>& tokens() const { return tokens_; }

 private:
  std::vector<std::uint16_t> tokens_;
  std::uint64_t seed_;
  data_order order_;
  std::uint64_t position_ = 0;
};

}  // namespace strata
