// strata/kernels/moe.hpp - a mixture-of-experts layer's kernels: the router (moe_route_forward,
// moe_route_backward, moe_sequence_stats), the dispatch plan (moe_dispatch_plan), the token
// permutation (moe_permute_forward, moe_permute_backward), the weighted combine
// (moe_combine_forward, moe_combine_backward) and the experts' linear layers
// (grouped_linear_forward, grouped_linear_backward).
//
//   logits [N, E] -> top k experts per token -> rows sorted by expert [M, C] -> experts -> [N, C]
//
// What a layer includes to call these ops: the host overloads (kernels/host/moe.hpp). A call
// picks its overload by the device tag it passes.
#pragma once

#include "strata/kernels/host/moe.hpp"
