// strata_gpt2_train_cuda - the layer-integrated GPT-2 (examples/gpt2, the model gpt2_train
// --device cuda trains), or with --model llama the example Llama, trained on one GPU without MPI,
// built from the CUDA toolkit alone for scripts/gpu-check.
//
//   strata_gpt2_train_cuda [--model gpt2|llama] [--steps 10] [--batch 8] [--seq 1024] [--layers 12]
//                          [--d-model 768] [--heads 12] [--kv-heads 4] [--ffn 2048] [--vocab 50304]
//                          [--precision bf16] [--metrics FILE]
//
// Defaults: GPT-2 124M (vocabulary padded to 50304), seq 1024, bf16, on the generated corpus
// (byte tokens are valid ids of any vocabulary); --model llama takes the same width and depth
// with 4 key/value heads and a SwiGLU width of 2048 unless given. Metrics carry tokens/s and MFU
// against the H200's dense bf16 peak.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "gpt2/train_cuda.hpp"

int main(int argc, char** argv) {
  gpt2::cuda_run r;
  r.shape = {.vocab = 50304, .seq = 1024, .layers = 12, .heads = 12, .d_model = 768};
  r.steps = 10;
  r.batch = 8;
  r.warmup = 2;
  r.lr = 6e-4;
  r.precision = "bf16";
  r.progress = "lines";
  r.hw = "h200_141gb";
  std::string model = "gpt2";
  std::int64_t kv_heads = 4, ffn = 2048;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    const auto number = [&] { return std::atoll(value.c_str()); };
    if (flag == "--model") model = value;
    else if (flag == "--kv-heads") kv_heads = number();
    else if (flag == "--ffn") ffn = number();
    else if (flag == "--steps") r.steps = int(number());
    else if (flag == "--batch") r.batch = number();
    else if (flag == "--seq") r.shape.seq = number();
    else if (flag == "--layers") r.shape.layers = number();
    else if (flag == "--d-model") r.shape.d_model = number();
    else if (flag == "--heads") r.shape.heads = number();
    else if (flag == "--vocab") r.shape.vocab = number();
    else if (flag == "--precision") r.precision = value;
    else if (flag == "--metrics") r.metrics = value;
    else {
      std::fprintf(stderr, "strata_gpt2_train_cuda: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  if (model == "llama") {
    r.llama = strata::models::llama::dims{.vocab = r.shape.vocab,
                                          .seq = r.shape.seq,
                                          .layers = r.shape.layers,
                                          .heads = r.shape.heads,
                                          .d_model = r.shape.d_model,
                                          .kv_heads = kv_heads,
                                          .ffn = ffn};
  } else if (model != "gpt2") {
    std::fprintf(stderr, "strata_gpt2_train_cuda: --model %s is neither gpt2 nor llama\n", model.c_str());
    return 2;
  }
  try {
    return gpt2::train_on_cuda(r);  // the layers check the shape as they are built
  } catch (const std::exception& e) {
    std::fprintf(stderr, "strata_gpt2_train_cuda: error: %s\n", e.what());
    return 1;
  }
}
