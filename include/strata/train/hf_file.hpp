// strata/train/hf_file.hpp - a Hugging Face safetensors file as an importer reads it: tensors
// found under their full names or without the model's prefix, every tensor used checked, the
// others skipped and named.
//
// An importer asks for each tensor under the name transformers' *ForCausalLM writes
// ("transformer.h.0.attn.c_attn.weight", "model.layers.0.self_attn.q_proj.weight"). The same
// tensor saved from the base model (GPT2Model, LlamaModel; the released hub `gpt2` file) carries
// no prefix ("h.0.attn.c_attn.weight"): hf_file finds either form, and refuses a file that holds
// both, naming them. Tensors nobody asks for - of any dtype: BOOL or F32 causal masks
// (h.N.attn.bias), h.N.attn.masked_bias, rotary inv_freq buffers - are skipped, and
// skipped_note() names them in one line ("skipped 24 tensors strata does not use:
// h.{0..11}.attn.bias, h.{0..11}.attn.masked_bias (BOOL)"). A tensor that is used keeps every
// check: it must be there, with the model's shape, a dtype strata converts and finite values
// (the first NaN or infinity is refused, naming the tensor and its flat index).
//
// train/hf_weights.hpp maps a model's parameters onto such a file by rules; this is its reader.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/train/safetensors.hpp"

namespace strata {

inline std::string hf_shape_text(const std::vector<std::int64_t>& s) {
  std::string r = "[";
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (i) r += ", ";
    r += std::to_string(s[i]);
  }
  return r + "]";
}

namespace detail {

// Names that differ only in their one number, with the numbers and dtypes met.
struct hf_name_group {
  std::string head, tail;  // the name around its number ("h.", ".attn.bias"), or the whole name in head
  std::set<long long> numbers;
  std::set<std::string> dtypes;
  bool numbered = false;
};

// Adds a name to its group, keyed by the name with its number as '#' (by the name itself when it
// has no number or several).
inline void hf_add_to_groups(std::map<std::string, hf_name_group>& groups, const std::string& name,
                             const std::string& dtype) {
  // The dot-separated parts that are whole numbers: exactly one makes the name groupable.
  std::size_t begin = 0, number_at = std::string::npos, number_len = 0, numbers = 0;
  while (begin <= name.size()) {
    std::size_t end = name.find('.', begin);
    if (end == std::string::npos) end = name.size();
    const bool digits = end > begin && end - begin < 12 && name.find_first_not_of("0123456789", begin) >= end;
    if (digits) {
      ++numbers;
      number_at = begin;
      number_len = end - begin;
    }
    begin = end + 1;
  }
  std::string key = name;
  hf_name_group g;
  if (numbers == 1) {
    key = name.substr(0, number_at) + "#" + name.substr(number_at + number_len);
    g = {name.substr(0, number_at), name.substr(number_at + number_len), {}, {}, true};
  } else {
    g = {name, "", {}, {}, false};
  }
  auto& into = groups.emplace(key, g).first->second;
  if (into.numbered) into.numbers.insert(std::stoll(name.substr(number_at, number_len)));
  into.dtypes.insert(dtype);
}

// A group's names as one: "h.3.x", "h.{0..11}.x" for a run of numbers, "h.{0,2,5}.x" otherwise.
inline std::string hf_group_name(const hf_name_group& g) {
  std::string name = g.head;
  if (g.numbered) {
    if (g.numbers.size() == 1) {
      name += std::to_string(*g.numbers.begin());
    } else if (*g.numbers.rbegin() - *g.numbers.begin() + 1 == static_cast<long long>(g.numbers.size())) {
      name += '{';
      name += std::to_string(*g.numbers.begin());
      name += "..";
      name += std::to_string(*g.numbers.rbegin());
      name += '}';
    } else {
      std::string list;
      for (auto n : g.numbers) {
        if (!list.empty()) list += ',';
        list += std::to_string(n);
      }
      name += '{';
      name += list;
      name += '}';
    }
    name += g.tail;
  }
  return name;
}

}  // namespace detail

// Names that differ only in one number (a layer index) as one: "h.{0..11}.attn.bias"; the rest
// as they are. Each group with its dtype unless every group has the same one, said once at the end.
inline std::string hf_name_groups(const std::vector<std::pair<std::string, std::string>>& names_and_dtypes) {
  std::map<std::string, detail::hf_name_group> groups;  // by the name with its number as '#'
  for (const auto& [name, dtype] : names_and_dtypes) detail::hf_add_to_groups(groups, name, dtype);
  std::set<std::string> all_dtypes;
  for (const auto& [key, g] : groups) all_dtypes.insert(g.dtypes.begin(), g.dtypes.end());
  const auto dtype_text = [](const std::set<std::string>& d) {
    std::string r;
    for (const auto& x : d) {
      if (!r.empty()) r += '/';
      r += x;
    }
    return r;
  };
  std::string out;
  for (const auto& [key, g] : groups) {
    const std::string name = detail::hf_group_name(g);
    if (!out.empty()) out += ", ";
    out += name;
    if (all_dtypes.size() > 1) {
      out += " (";
      out += dtype_text(g.dtypes);
      out += ')';
    }
  }
  if (all_dtypes.size() == 1) {
    out += " (";
    out += *all_dtypes.begin();
    out += ')';
  }
  return out;
}

// One Hugging Face safetensors file, read for a model's importer; `model` ("gpt2", "llama") opens
// every message, `prefix` ("transformer.", "model.") is the part of a name the base model's files
// leave out ("" when there is none).
class hf_file {
 public:
  hf_file(std::string model, const std::string& path, std::string prefix)
      : model_(std::move(model)), prefix_(std::move(prefix)), file_(path) {}

  const std::string& path() const { return file_.path(); }
  const safetensors_reader& reader() const { return file_; }

  // The entry of tensor `name` (its *ForCausalLM name): under that name, or without the prefix;
  // null when neither is there. Both is an error naming the two.
  const safetensors_entry* find(const std::string& name) const {
    const auto* full = file_.find(name);
    if (name.rfind(prefix_, 0) != 0 || prefix_.empty()) return full;
    const std::string bare = name.substr(prefix_.size());
    const auto* short_form = file_.find(bare);
    STRATA_CHECK(!(full && short_form), model_, ": '", path(), "' holds tensor '", bare, "' twice, as '", name,
                 "' and as '", bare, "'; keep one of them");
    return full ? full : short_form;
  }

  // The tensor `name`, which must be there with shape `want` (with rows_may_differ, only its
  // dimensions after the first must match) and a dtype strata converts. It counts as used.
  named_tensor read(const std::string& name, const std::vector<std::int64_t>& want, bool rows_may_differ = false) {
    const auto* e = find(name);
    STRATA_CHECK(e != nullptr, model_, ": '", path(), "' has no tensor '", name, "'",
                 name.rfind(prefix_, 0) == 0 && !prefix_.empty() ? " (nor '" + name.substr(prefix_.size()) + "')" : "");
    STRATA_CHECK(e->convertible(), "safetensors: '", path(), "': tensor '", e->name, "' has dtype ", e->dtype,
                 " (F32, F64, BF16 or F16 expected)");
    const bool fits = rows_may_differ ? e->shape.size() == want.size() && !want.empty() &&
                                            std::equal(want.begin() + 1, want.end(), e->shape.begin() + 1)
                                      : e->shape == want;
    STRATA_CHECK(fits, model_, ": '", path(), "': tensor '", e->name, "' has shape ", hf_shape_text(e->shape),
                 ", the model expects ", hf_shape_text(want));
    used_.insert(e->name);
    named_tensor t = file_.read(*e);
    values_ = t.values();
    // A NaN or an infinity would make every gradient non-finite: each step skipped, and the
    // poisoned weights checkpointed as if trained.
    for (std::size_t i = 0; i < values_.size(); ++i)
      STRATA_CHECK(std::isfinite(values_[i]), model_, ": '", path(), "': tensor '", e->name, "' holds ", values_[i],
                   " at flat index ", i, " of its ", values_.size(), " values; weights must be finite numbers");
    return t;
  }

  // The values of the tensor read() returned last, as double (read once, by the check).
  const std::vector<double>& last_values() const { return values_; }

  // Marks a tensor the importer looked at and need not load (e.g. a head equal to the embedding).
  void use(const safetensors_entry& e) { used_.insert(e.name); }

  // The file's tensors no read() or use() took, in the file's (name) order.
  std::vector<std::pair<std::string, std::string>> skipped() const {
    std::vector<std::pair<std::string, std::string>> out;
    for (const auto& e : file_.entries())
      if (!used_.count(e.name)) out.emplace_back(e.name, e.dtype);
    return out;
  }
  // "skipped 24 tensors strata does not use: h.{0..11}.attn.bias, ... (BOOL)", or "" when none.
  std::string skipped_note() const {
    const auto s = skipped();
    if (s.empty()) return "";
    return "skipped " + std::to_string(s.size()) + (s.size() == 1 ? " tensor" : " tensors") +
           " strata does not use: " + hf_name_groups(s);
  }

 private:
  std::string model_, prefix_;
  safetensors_reader file_;
  std::set<std::string> used_;
  std::vector<double> values_;
};

}  // namespace strata
