// strata/layers/rmsnorm.hpp - RMSNorm over the last dimension, with a gain and no bias (Llama's
// norm): the uncentred form of layers/norm.hpp.
#pragma once
#include "strata/layers/norm.hpp"

namespace strata {

template <class P>
using rmsnorm = norm<P, norm_form::rms>;

}  // namespace strata
