// strata/strata.hpp - everything a user needs, in one include.
#pragma once

#include "strata/core/config.hpp"
#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/core/extents.hpp"
#include "strata/core/init.hpp"
#include "strata/core/memory.hpp"
#include "strata/core/tensor.hpp"

#include "strata/policy/axes.hpp"
#include "strata/policy/device.hpp"
#include "strata/policy/layout.hpp"
#include "strata/policy/parallel.hpp"
#include "strata/policy/policy.hpp"
#include "strata/policy/precision.hpp"
#include "strata/policy/schedule.hpp"

#include "strata/comm/collectives.hpp"
#include "strata/comm/communicator.hpp"
#include "strata/comm/counters.hpp"
#include "strata/comm/launch.hpp"
#include "strata/comm/mesh.hpp"
#include "strata/comm/mesh_position.hpp"
#include "strata/comm/mpi_communicator.hpp"
#include "strata/comm/timeout.hpp"

#include "strata/kernels/host.hpp"

#include "strata/layers/attention.hpp"
#include "strata/layers/embedding.hpp"
#include "strata/layers/layer.hpp"
#include "strata/layers/layernorm.hpp"
#include "strata/layers/linear.hpp"
#include "strata/layers/lm_head.hpp"
#include "strata/layers/mlp.hpp"
#include "strata/layers/module.hpp"
#include "strata/layers/parameters.hpp"
#include "strata/layers/stack.hpp"
#include "strata/layers/transformer_block.hpp"

#include "strata/parallel/data_parallel.hpp"
#include "strata/parallel/dp_layout.hpp"

#include "strata/optim/adamw.hpp"
#include "strata/optim/grad_clip.hpp"
#include "strata/optim/loss_scaler.hpp"
#include "strata/optim/lr_schedule.hpp"

#include "strata/train/corpus.hpp"
#include "strata/train/metrics.hpp"
#include "strata/train/token_data.hpp"
#include "strata/train/trainer.hpp"
