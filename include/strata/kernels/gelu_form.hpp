// strata/kernels/gelu_form.hpp - which GELU a layer applies: the tanh approximation (GPT-2,
// Hugging Face's "gelu_new") or the exact one, x·Φ(x) through the error function (GPT-NeoX and
// Pythia, BERT; Hugging Face's "gelu"). The two differ by up to ~5e-4 in value, enough to put a
// model's gradients visibly off its reference, so a layer names the one it was trained with.
#pragma once

namespace strata {

enum class gelu_form { tanh, exact };

}  // namespace strata
