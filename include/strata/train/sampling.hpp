// strata/train/sampling.hpp - the next token from a row of logits: greedy, or drawn at a
// temperature from the k most likely.
//
//   std::int32_t t = st::choose_token(logits, {.temperature = 0.8, .top_k = 40, .seed = 1}, draw);
//
// Greedy (temperature 0) takes the largest logit, the lowest id among equals. A draw keeps the k
// largest logits (every one when k = 0; equal logits ordered by id), weighs each by
// exp((logit - max) / temperature) in double, and walks the kept ids in increasing order,
// subtracting weights from u·sum with u = counter_uniform(seed, ·, draw). The token is a pure
// function of the logits, the seed and the draw's index: ranks holding the same logits draw the
// same token, and no generator state has to be kept in step between them.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/core/init.hpp"

namespace strata {

struct sampling {
  double temperature = 0;  // 0: greedy
  std::int64_t top_k = 0;  // 0: every token
  std::uint64_t seed = 0;
};

inline std::int32_t choose_token(std::span<const double> logits, const sampling& s, std::uint64_t draw) {
  STRATA_CHECK(!logits.empty(), "choose_token: no logits");
  STRATA_CHECK(std::isfinite(s.temperature) && s.temperature >= 0,
               "choose_token: the temperature must be finite "
               "and >= 0 (0: greedy), got ",
               s.temperature);
  STRATA_CHECK(s.top_k >= 0, "choose_token: top_k must be >= 0 (0: every token), got ", s.top_k);
  for (std::size_t i = 0; i < logits.size(); ++i)
    STRATA_CHECK(!std::isnan(logits[i]), "choose_token: the logit of token ", i, " is NaN");
  const auto higher = [&](std::int32_t a, std::int32_t b) {
    return logits[std::size_t(a)] > logits[std::size_t(b)] ||
           (logits[std::size_t(a)] == logits[std::size_t(b)] && a < b);
  };
  if (s.temperature == 0) {
    std::int32_t best = 0;
    for (std::int32_t i = 1; i < static_cast<std::int32_t>(logits.size()); ++i)
      if (higher(i, best)) best = i;
    return best;
  }
  std::vector<std::int32_t> kept(logits.size());
  std::iota(kept.begin(), kept.end(), 0);
  if (s.top_k > 0 && s.top_k < static_cast<std::int64_t>(kept.size())) {
    std::nth_element(kept.begin(), kept.begin() + (s.top_k - 1), kept.end(), higher);
    kept.resize(std::size_t(s.top_k));
    std::sort(kept.begin(), kept.end());
  }
  double max_logit = -INFINITY;
  for (const std::int32_t t : kept) max_logit = std::max(max_logit, logits[std::size_t(t)]);
  std::vector<double> weight(kept.size());
  double sum = 0;
  for (std::size_t i = 0; i < kept.size(); ++i)
    sum += weight[i] = std::exp((logits[std::size_t(kept[i])] - max_logit) / s.temperature);
  double u = counter_uniform(s.seed, 0x7e9a11e5, draw) * sum;
  for (std::size_t i = 0; i < kept.size(); ++i)
    if ((u -= weight[i]) <= 0) return kept[i];
  return kept.back();  // u·sum rounded past the last weight
}

}  // namespace strata
