// Fuzzes the token shard reader (train/token_data.hpp): llm.c shards (a 1 KB header of int32s -
// magic, version, token count - then uint16 tokens) and headerless uint16 streams, read with
// GPT-2's vocabulary and with a byte-level one, then drawn from as training batches, so a count
// the reader got wrong shows as an out-of-bounds read under the sanitizers.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <strata/train/corpus.hpp>
#include <strata/train/token_data.hpp>

#include "mutate.hpp"

namespace st = strata;
namespace fz = strata_fuzz;

namespace {

void run(const fz::input& in, const fz::fs::path& work, fz::tally& tl) {
  const std::string path = (work / "shard_000.bin").string();
  fz::write_bytes(path, in[0].data);
  for (const std::int64_t vocab : {50257, 256}) {
    tl.attempt("vocab " + std::to_string(vocab), [&] {
      auto stream = st::token_stream::from_glob((work / "shard_*.bin").string(), vocab, 5);
      long sum = 0;
      for (auto tok : stream.tokens()) {
        if (tok >= vocab) st::fail("fuzz: token ", tok, " past vocab ", vocab, " was accepted");
        sum += tok;
      }
      if (stream.size() > 8)
        for (int k = 0; k < 3; ++k)
          for (auto v : stream.next_batch(2, 8).targets) sum += v;
      return sum >= 0;
    });
  }
}

fz::bytes llmc(const std::vector<std::uint16_t>& tokens, std::int32_t count, std::int32_t magic = st::llmc_shard_magic,
               std::int32_t version = st::llmc_shard_version) {
  fz::bytes b(st::llmc_header_bytes + 2 * tokens.size(), 0);
  const std::int32_t header[3] = {magic, version, count};
  std::memcpy(b.data(), header, sizeof header);
  if (!tokens.empty()) std::memcpy(b.data() + st::llmc_header_bytes, tokens.data(), 2 * tokens.size());
  return b;
}

void write_corpus(const fz::fs::path& dir) {
  const auto text = st::byte_tokens(st::generate_corpus(64, 3));
  const std::vector<std::uint16_t> tokens(text.begin(), text.begin() + 64);
  const auto n = static_cast<std::int32_t>(tokens.size());
  std::vector<std::uint16_t> gpt2_ids;
  for (int i = 0; i < 40; ++i) gpt2_ids.push_back(static_cast<std::uint16_t>((i * 1237) % 50257));
  const auto save = [&](const std::string& name, const fz::bytes& b) { fz::write_bytes(dir / name, b); };
  save("ok-llmc-bytes.bin", llmc(tokens, n));
  save("ok-llmc-gpt2-ids.bin", llmc(gpt2_ids, 40));
  const auto* p = reinterpret_cast<const unsigned char*>(tokens.data());
  save("ok-headerless.bin", fz::bytes(p, p + 2 * tokens.size()));
  save("ok-one-token.bin", fz::bytes{'A', 0});
  save("bad-count-past-end.bin", llmc(tokens, n + 1));
  save("bad-count-negative.bin", llmc(tokens, -1));
  save("bad-count-huge.bin", llmc(tokens, 0x7fffffff));
  save("bad-count-zero.bin", llmc({}, 0));
  save("bad-version.bin", llmc(tokens, n, st::llmc_shard_magic, 2));
  save("bad-token-past-vocab.bin", llmc({1, 2, 65535, 4}, 4));
  save("bad-odd-length.bin", fz::bytes{'A', 0, 'B'});
  save("bad-empty.bin", {});
}

}  // namespace

int main(int argc, char** argv) {
  fz::target t;
  t.name = "token_shards";
  t.run = run;
  t.write_corpus = write_corpus;
  return fz::main(argc, argv, t, (strata_test::program_dir() / "corpus" / "token_shards").string());
}
