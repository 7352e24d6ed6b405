// strata/train/hf_weights.hpp - a model's parameters as the tensors of a Hugging Face
// safetensors file, mapped by rules: import (file -> serial weights) and export (serial weights
// -> file) from the same rules.
//
// A model's parameters come in serial order with their whole shapes
// (sequential_model<M>::serial_parameter_shapes(config)); an hf_weight_map says which tensors of
// the file each one is made of:
//
//   st::hf_weight_map map("llama", "model.");  // names the messages; the prefix base-model files omit
//   map.rename("wte", "model.embed_tokens.weight")
//       .rename("h.{i}.attn.proj.weight", "model.layers.{i}.self_attn.o_proj.weight")
//       .stack("h.{i}.attn.qkv.weight", {{"model.layers.{i}.self_attn.q_proj.weight", q},
//                                        {"model.layers.{i}.self_attn.k_proj.weight", kv},
//                                        {"model.layers.{i}.self_attn.v_proj.weight", kv}})
//       .tie("lm_head.weight", "wte", "the model is tied");
//   std::vector<double> serial = st::read_hf_weights("model.safetensors", map, shapes, &notes);
//   st::write_hf_weights<float>("out.safetensors", map, shapes, serial);
//
// A pattern's {name} (any name in braces) stands for a whole number - a layer or an expert
// index - and carries it from the parameter's name to the file's: "h.{i}.attn.proj.weight"
// matches "h.3.attn.proj.weight" and names "model.layers.3.self_attn.o_proj.weight". The first
// rule whose pattern matches a parameter places it; a parameter no rule matches is an error, a
// rule that matches nothing is not (a head rule on a tied model). Each rule's transform:
//   rename     one tensor of the parameter's shape;
//   stack      several tensors stacked by rows (fused QKV = q | k | v, gate | up): each part
//              [rows, cols...] of the parameter's [R, cols...], with its rows given, or 0 for an
//              equal share of the rows the others leave;
//   transpose  one matrix stored [cols, rows] (GPT-2's Conv1D weights are [in, out], strata's
//              linear weights [out, in]);
//   add        an hf_rule, any of these with `crop_rows`: the file's tensor may have more rows
//              than the parameter (a longer position table), of which the first are used.
// A tie names a file tensor equal to a parameter (a head tied to the embedding): not written on
// export; on import, when the file holds it, it must equal the parameter, element for element.
//
// Importing checks what train/hf_file.hpp checks: every tensor there, under its full name or
// without the prefix (both is an error naming the two), with the shape the rule gives, a dtype
// strata converts and finite values; the file's other tensors are skipped and named in one note.
#pragma once
#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/core/tensor.hpp"
#include "strata/train/hf_file.hpp"
#include "strata/train/safetensors.hpp"

namespace strata {

// A model's parameters in serial order with their whole shapes, as
// sequential_model<M>::serial_parameter_shapes(config) gives them.
using hf_parameter_shapes = std::vector<std::pair<std::string, shape>>;

// One Hugging Face tensor of a rule: its name pattern and, when several are stacked, the rows it
// gives the parameter (0: an equal share of the rows the parts with a count leave).
struct hf_part {
  std::string name;
  std::int64_t rows = 0;
  // Implicit: a name alone is a part.
  hf_part(std::string n, std::int64_t r = 0) : name(std::move(n)), rows(r) {}
  hf_part(const char* n, std::int64_t r = 0) : name(n), rows(r) {}
};

// A parameter name pattern and the tensors that make it (see the header comment).
struct hf_rule {
  std::string param;           // "h.{i}.attn.qkv.weight"
  std::vector<hf_part> parts;  // stacked by rows, in order
  bool transposed = false;     // each part stored [cols, rows] (matrices only)
  bool crop_rows = false;      // one untransposed part, which may have more rows than the parameter
};

// A file tensor equal to a parameter: `why` ("GPT-2 ties them") ends the note and the error.
struct hf_tie {
  std::string tensor, param, why;
};

// One tensor of a placed parameter: its full name and its shape as the file stores it.
struct hf_tensor {
  std::string name;
  std::vector<std::int64_t> shape;
  std::int64_t rows = 0;  // the parameter's rows it holds
};

// One parameter, placed: its name and shape, and the file's tensors it is made of.
struct hf_parameter {
  std::string name;
  std::vector<std::int64_t> shape;  // strata's
  std::vector<hf_tensor> parts;     // stacked by rows
  bool transposed = false;
  bool crop_rows = false;
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (auto s : shape) n *= s;
    return n;
  }
};

namespace detail {

// Calls f(literal text) and g(placeholder name) along a pattern; an unclosed '{' is an error.
template <class Literal, class Placeholder>
void walk_hf_pattern(const std::string& model, const std::string& pattern, Literal&& f, Placeholder&& g) {
  std::size_t at = 0;
  while (at < pattern.size()) {
    const std::size_t open = pattern.find('{', at);
    if (open == std::string::npos) {
      f(pattern.substr(at));
      return;
    }
    if (open > at) f(pattern.substr(at, open - at));
    const std::size_t close = pattern.find('}', open);
    STRATA_CHECK(close != std::string::npos && close > open + 1, model, ": pattern '", pattern, "': the '{' at offset ",
                 open, " needs a name and a '}' after it");
    g(pattern.substr(open + 1, close - open - 1));
    at = close + 1;
  }
}

// Whether `name` matches `pattern`, each {x} a whole number (the same one wherever x recurs),
// bound into `values`.
inline bool match_hf_pattern(const std::string& model, const std::string& pattern, const std::string& name,
                             std::map<std::string, std::string>& values) {
  std::size_t at = 0;
  bool ok = true;
  walk_hf_pattern(
      model, pattern,
      [&](const std::string& text) {
        if (ok && name.compare(at, text.size(), text) == 0) at += text.size();
        else ok = false;
      },
      [&](const std::string& key) {
        if (!ok) return;
        std::size_t end = at;
        while (end < name.size() && name[end] >= '0' && name[end] <= '9') ++end;
        if (end == at) {
          ok = false;
          return;
        }
        const std::string number = name.substr(at, end - at);
        const auto [it, fresh] = values.emplace(key, number);
        ok = fresh || it->second == number;
        at = end;
      });
  return ok && at == name.size();
}

inline std::string fill_hf_pattern(const std::string& model, const std::string& pattern,
                                   const std::map<std::string, std::string>& values) {
  std::string out;
  walk_hf_pattern(
      model, pattern, [&](const std::string& text) { out += text; },
      [&](const std::string& key) { out += values.at(key); });
  return out;
}

inline std::vector<std::string> hf_pattern_keys(const std::string& model, const std::string& pattern) {
  std::vector<std::string> keys;
  walk_hf_pattern(
      model, pattern, [](const std::string&) {}, [&](const std::string& key) { keys.push_back(key); });
  return keys;
}

}  // namespace detail

// The rules from a model's parameter names to a Hugging Face file's tensors.
class hf_weight_map {
 public:
  // `model` ("llama") opens every message; `prefix` ("model.") is the part of the tensors' names
  // a base model's file leaves out (importing finds either form).
  explicit hf_weight_map(std::string model, std::string prefix = "")
      : model_(std::move(model)), prefix_(std::move(prefix)) {}

  const std::string& model() const { return model_; }
  const std::string& prefix() const { return prefix_; }
  const std::vector<hf_rule>& rules() const { return rules_; }
  const std::vector<hf_tie>& ties() const { return ties_; }

  // Parameter `param` is tensor `tensor`, of its shape.
  hf_weight_map& rename(std::string param, std::string tensor) {
    return add({std::move(param), {hf_part(std::move(tensor))}});
  }
  // Parameter `param` [R, C] is tensor `tensor` stored [C, R].
  hf_weight_map& transpose(std::string param, std::string tensor) {
    return add({std::move(param), {hf_part(std::move(tensor))}, true});
  }
  // Parameter `param` is `parts` stacked by rows.
  hf_weight_map& stack(std::string param, std::vector<hf_part> parts) {
    return add({std::move(param), std::move(parts)});
  }
  hf_weight_map& add(hf_rule rule) {
    STRATA_CHECK(!rule.parts.empty(), model_, ": the rule for '", rule.param, "' names no tensor");
    STRATA_CHECK(!rule.crop_rows || (rule.parts.size() == 1 && !rule.transposed), model_, ": the rule for '",
                 rule.param, "' crops rows; only one untransposed tensor can be cropped");
    const auto keys = detail::hf_pattern_keys(model_, rule.param);
    for (const auto& part : rule.parts) {
      STRATA_CHECK(part.rows >= 0, model_, ": the rule for '", rule.param, "' gives tensor '", part.name, "' ",
                   part.rows, " rows");
      for (const auto& key : detail::hf_pattern_keys(model_, part.name))
        STRATA_CHECK(std::find(keys.begin(), keys.end(), key) != keys.end(), model_, ": the rule for '", rule.param,
                     "' names tensor '", part.name, "', whose {", key, "} the parameter's pattern does not have");
    }
    rules_.push_back(std::move(rule));
    return *this;
  }
  // File tensor `tensor`, when there, equals parameter `param` (a tied head): checked on import,
  // not written on export.
  hf_weight_map& tie(std::string tensor, std::string param, std::string why) {
    ties_.push_back({std::move(tensor), std::move(param), std::move(why)});
    return *this;
  }

  // Every parameter placed by the first rule that matches it, in serial order; a parameter no rule
  // matches, a tensor two parameters claim, or parts whose rows do not make the parameter's are
  // errors naming them.
  std::vector<hf_parameter> place(const hf_parameter_shapes& params) const {
    std::vector<hf_parameter> out;
    std::map<std::string, std::string> owner;  // file tensor -> parameter
    for (const auto& [name, s] : params) {
      hf_parameter p{name, std::vector<std::int64_t>(s.dims.begin(), s.dims.begin() + s.rank), {}};
      const hf_rule* rule = nullptr;
      std::map<std::string, std::string> values;
      for (const auto& r : rules_) {
        values.clear();
        if (detail::match_hf_pattern(model_, r.param, name, values)) {
          rule = &r;
          break;
        }
      }
      STRATA_CHECK(rule != nullptr, model_, ": no rule maps parameter '", name, "' to a Hugging Face tensor");
      p.transposed = rule->transposed;
      p.crop_rows = rule->crop_rows;
      STRATA_CHECK(!p.transposed || p.shape.size() == 2, model_, ": parameter '", name, "' of shape ",
                   hf_shape_text(p.shape), " is not a matrix; its rule transposes it");
      STRATA_CHECK(!p.shape.empty() || rule->parts.size() == 1, model_, ": parameter '", name,
                   "' is a scalar; its rule stacks ", rule->parts.size(), " tensors");
      const std::int64_t rows = p.shape.empty() ? 1 : p.shape[0];
      std::int64_t given = 0, shares = 0;  // rows the parts give; parts that take an equal share
      for (const auto& part : rule->parts) {
        given += part.rows;
        shares += part.rows == 0 ? 1 : 0;
      }
      STRATA_CHECK(shares > 0 || given == rows, model_, ": parameter '", name, "' of shape ", hf_shape_text(p.shape),
                   " has ", rows, " rows; its rule's ", rule->parts.size(), " tensors give ", given);
      STRATA_CHECK(shares == 0 || (given < rows && (rows - given) % shares == 0), model_, ": parameter '", name,
                   "' of shape ", hf_shape_text(p.shape), " has ", rows, " rows; its rule's tensors give ", given,
                   ", and the ", rows - given, " left do not make ", shares, " equal shares");
      for (const auto& part : rule->parts) {
        hf_tensor t{detail::fill_hf_pattern(model_, part.name, values),
                    {},
                    part.rows == 0 ? (rows - given) / shares : part.rows};
        if (p.shape.empty()) {
          t.rows = 1;
        } else if (p.transposed) {
          t.shape = {p.shape[1], t.rows};
        } else {
          t.shape = p.shape;
          t.shape[0] = t.rows;
        }
        const auto [it, fresh] = owner.emplace(t.name, name);
        STRATA_CHECK(fresh, model_, ": parameters '", it->second, "' and '", name, "' both map to tensor '", t.name,
                     "'");
        p.parts.push_back(std::move(t));
      }
      out.push_back(std::move(p));
    }
    for (const auto& tie : ties_) {
      const auto it = owner.find(tie.tensor);
      STRATA_CHECK(it == owner.end(), model_, ": tensor '", tie.tensor, "' is tied to parameter '", tie.param,
                   "' and also makes parameter '", it == owner.end() ? "" : it->second, "'");
    }
    return out;
  }

 private:
  std::string model_, prefix_;
  std::vector<hf_rule> rules_;
  std::vector<hf_tie> ties_;
};

// The serial weights (serial_parameters() order, for training_options::initial_weights or
// scatter_model_weights) of `params` from an open file (its messages name file.model()). `notes`,
// if given, receives one line per tie found equal and, last, the skipped tensors.
inline std::vector<double> read_hf_weights(hf_file& file, const hf_weight_map& map, const hf_parameter_shapes& params,
                                           std::vector<std::string>* notes = nullptr) {
  const auto placed = map.place(params);
  std::int64_t total = 0;
  for (const auto& p : placed) total += p.numel();
  std::vector<double> serial;
  serial.reserve(std::size_t(total));
  std::map<std::string, std::pair<std::size_t, const hf_parameter*>> offsets;  // parameter -> where it lies
  for (const auto& p : placed) {
    offsets.emplace(p.name, std::make_pair(serial.size(), &p));
    for (const auto& part : p.parts) {
      const auto t = file.read(part.name, part.shape, p.crop_rows);
      const std::vector<double>& v = file.last_values();
      std::int64_t n = 1;
      for (auto s : part.shape) n *= s;
      if (p.crop_rows)
        STRATA_CHECK(t.shape[0] >= part.shape[0], map.model(), ": '", file.path(), "': tensor '", t.name, "' has ",
                     t.shape[0], " rows, fewer than the model's ", part.shape[0],
                     " (a tensor can be cropped, not extended)");
      if (!p.transposed) {
        serial.insert(serial.end(), v.begin(), v.begin() + std::ptrdiff_t(n));  // cropped: the first rows
        continue;
      }
      const std::int64_t rows = part.rows, cols = part.shape[0];  // the file holds [cols, rows]
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t c = 0; c < cols; ++c) serial.push_back(v[std::size_t(c * rows + r)]);
    }
  }
  for (const auto& tie : map.ties()) {
    const auto it = offsets.find(tie.param);
    STRATA_CHECK(it != offsets.end(), map.model(), ": tensor '", tie.tensor, "' is tied to parameter '", tie.param,
                 "', which the model does not have");
    if (file.find(tie.tensor) == nullptr) continue;
    const auto [at, p] = it->second;
    const auto t = file.read(tie.tensor, p->shape);
    const std::vector<double>& v = file.last_values();
    for (std::size_t i = 0; i < v.size(); ++i)
      STRATA_CHECK(v[i] == serial[at + i], map.model(), ": '", file.path(), "': tensor '", t.name, "' differs from ",
                   tie.param, " at element ", i, " (", v[i], " vs ", serial[at + i], "); ", tie.why,
                   ", so an untied one cannot be loaded");
    if (notes) notes->push_back(t.name + " equals " + tie.param + " (" + tie.why + "): read once");
  }
  if (notes && !file.skipped_note().empty()) notes->push_back(file.skipped_note());
  return serial;
}

// The same, opening `path` (as hf_file(map.model(), path, map.prefix())).
inline std::vector<double> read_hf_weights(const std::string& path, const hf_weight_map& map,
                                           const hf_parameter_shapes& params,
                                           std::vector<std::string>* notes = nullptr) {
  hf_file file(map.model(), path, map.prefix());
  return read_hf_weights(file, map, params, notes);
}

// The serial weights of `params` as a safetensors file of the rules' tensors, under their full
// names, in storage type T (F32, BF16, F16 or F64); ties are not written.
template <class T>
void write_hf_weights(const std::string& path, const hf_weight_map& map, const hf_parameter_shapes& params,
                      const std::vector<double>& serial) {
  const auto placed = map.place(params);
  std::size_t total = 0;
  for (const auto& p : placed) total += std::size_t(p.numel());
  STRATA_CHECK(total == serial.size(), map.model(), ": exporting ", serial.size(), " weights, the model has ", total);
  std::vector<named_tensor> tensors;
  std::size_t at = 0;
  for (const auto& p : placed) {
    for (const auto& part : p.parts) {
      std::int64_t n = 1;
      for (auto s : part.shape) n *= s;
      std::vector<double> values(serial.begin() + std::ptrdiff_t(at), serial.begin() + std::ptrdiff_t(at) + n);
      if (p.transposed) {
        const std::int64_t rows = part.rows, cols = part.shape[0];
        for (std::int64_t r = 0; r < rows; ++r)
          for (std::int64_t c = 0; c < cols; ++c)
            values[std::size_t(c * rows + r)] = serial[at + std::size_t(r * cols + c)];
      }
      tensors.push_back(make_tensor<T>(part.name, part.shape, values));
      at += std::size_t(n);
    }
  }
  write_safetensors(path, tensors, {{"format", "pt"}, {"written_by", "strata"}});
}

}  // namespace strata
