// strata/layers/layernorm.hpp - LayerNorm over the last dimension, with gain and bias (GPT-2's
// norm): the centred form of layers/norm.hpp.
#pragma once
#include "strata/layers/norm.hpp"

namespace strata {

template <class P>
using layernorm = norm<P, norm_form::layer>;

}  // namespace strata
