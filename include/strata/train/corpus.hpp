// strata/train/corpus.hpp - a small English-like corpus generated in code, so the example
// trains with nothing downloaded.
//
// Sentences come from a tiny grammar (article, adjectives, noun, verb, place) driven by a
// counter-based generator: the same seed gives the same text on every machine. It has the
// structure a byte-level model learns quickly (spelling, word order, punctuation) and enough
// variety that memorising it takes longer than a short run.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "strata/core/init.hpp"

namespace strata {

namespace detail {
inline constexpr std::array<std::string_view, 16> corpus_adjectives{
    "quiet", "small", "bright", "old",    "green", "patient", "curious", "tired",
    "brave", "slow",  "clever", "gentle", "heavy", "early",   "distant", "warm"};
inline constexpr std::array<std::string_view, 16> corpus_nouns{
    "fox",      "river", "teacher", "engine",  "garden",  "sailor", "window", "robot",
    "mountain", "baker", "letter",  "lantern", "student", "forest", "city",   "bird"};
inline constexpr std::array<std::string_view, 12> corpus_verbs{"watches", "follows",   "finds",  "carries",
                                                               "paints",  "remembers", "greets", "builds",
                                                               "visits",  "opens",     "hears",  "counts"};
inline constexpr std::array<std::string_view, 10> corpus_places{
    "near the bridge", "under the old tree", "by the sea",       "in the morning", "after the rain",
    "at the market",   "behind the hill",    "before the storm", "along the road", "inside the station"};
inline constexpr std::array<std::string_view, 6> corpus_openers{"", "", "", "then ", "later, ", "every day "};
}  // namespace detail

// Roughly `approx_bytes` of generated text.
inline std::string generate_corpus(std::size_t approx_bytes = 200000, std::uint64_t seed = 7) {
  using namespace detail;
  std::string text;
  text.reserve(approx_bytes + 128);
  std::uint64_t counter = 0;
  auto pick = [&](std::size_t n) { return static_cast<std::size_t>(counter_bits(seed, 0xc0de, counter++) % n); };
  auto noun_phrase = [&] {
    std::string s = pick(3) == 0 ? "a " : "the ";
    if (pick(2) == 0) {
      s += corpus_adjectives[pick(corpus_adjectives.size())];
      s += ' ';
    }
    s += corpus_nouns[pick(corpus_nouns.size())];
    return s;
  };
  // One append per statement: the order of the draws (and so the text) is fixed by the code,
  // not by the compiler's choice of evaluation order.
  while (text.size() < approx_bytes) {
    std::string sentence(corpus_openers[pick(corpus_openers.size())]);
    sentence += noun_phrase();
    sentence += ' ';
    sentence += corpus_verbs[pick(corpus_verbs.size())];
    sentence += ' ';
    sentence += noun_phrase();
    if (pick(2) == 0) {
      sentence += ' ';
      sentence += corpus_places[pick(corpus_places.size())];
    }
    sentence += pick(8) == 0 ? '!' : '.';
    sentence[0] = static_cast<char>(sentence[0] - 'a' + 'A');
    text += sentence;
    text += pick(6) == 0 ? '\n' : ' ';
  }
  return text;
}

// Byte-level tokens (vocab 256) of a text.
inline std::vector<std::uint16_t> byte_tokens(std::string_view text) {
  std::vector<std::uint16_t> t(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) t[i] = static_cast<unsigned char>(text[i]);
  return t;
}

}  // namespace strata
