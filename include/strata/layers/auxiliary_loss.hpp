// strata/layers/auxiliary_loss.hpp - what hidden layers add to the training objective beside the
// language-model loss (a router's load-balancing and z-losses), and the statistics they report.
//
// A step minimises lm_loss + Σ auxiliary terms. A layer with a term takes the term's gradient
// itself, in its backward, scaled by grad_scale() - the scale the output layer's loss gradient
// gets (the loss scale over the micro-batches) - so no tensor carries the term between layers or
// pipeline stages, and every layout sums the same gradients. The layer reports in backward, which
// runs once per micro-batch even where full recomputation runs forward twice:
//   add_objective(v)    the terms' value for the micro-batch, coefficients applied;
//   add_row(b, n, row, averaged)  block b's statistics (of n blocks): `width` numbers, the same
//                       for every block, the first `averaged` of them values (averaged over a
//                       step's micro-batches and ranks), the others counts (summed).
// The model hands the step's sums over (sequential_model::take_auxiliary: summed over pipeline
// stages); the trainer averages them over the data-parallel group.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "strata/core/error.hpp"

namespace strata {

// One step's sums on one rank (after take: over the pipeline stages too).
struct auxiliary_sums {
  double objective = 0;       // Σ over micro-batches of the terms, coefficients applied
  std::int64_t blocks = 0;    // rows: one per block of the model (zeros for blocks not here)
  std::int64_t width = 0;     // numbers per row
  std::int64_t averaged = 0;  // of them, the leading values (the rest are counts)
  std::vector<double> rows;   // [blocks, width], Σ over micro-batches
  bool empty() const { return width == 0; }
};

class auxiliary_losses {
 public:
  void set_grad_scale(double s) { grad_scale_ = s; }
  // What the objective's gradient is multiplied by in this micro-batch's backward.
  double grad_scale() const { return grad_scale_; }

  void add_objective(double v) { sums_.objective += v; }
  void add_row(std::int64_t block, std::int64_t blocks, std::span<const double> row, std::int64_t averaged) {
    const auto width = static_cast<std::int64_t>(row.size());
    if (sums_.width == 0) {
      sums_.blocks = blocks;
      sums_.width = width;
      sums_.averaged = averaged;
      sums_.rows.assign(std::size_t(blocks * width), 0.0);
    }
    STRATA_CHECK(
        blocks == sums_.blocks && width == sums_.width && averaged == sums_.averaged && block >= 0 && block < blocks,
        "auxiliary_losses: block ", block, " of ", blocks, " reports ", width, " numbers; the model's rows are ",
        sums_.blocks, " x ", sums_.width);
    for (std::int64_t i = 0; i < width; ++i) sums_.rows[std::size_t(block * width + i)] += row[std::size_t(i)];
  }
  // The sums so far, and a fresh start.
  auxiliary_sums take() {
    auxiliary_sums r = std::move(sums_);
    sums_ = {};
    return r;
  }

 private:
  double grad_scale_ = 1.0;
  auxiliary_sums sums_;
};

}  // namespace strata
