// strata/train/untrusted_json.hpp - JSON from files nobody vouches for (safetensors headers,
// checkpoint manifests and piece lists).
//
// nlohmann's parser is iterative, but copying, comparing, dumping and destroying the DOM recurse
// once per level: a header of 100000 '[' overflows the stack long after parsing succeeded. And
// a DOM keeps the last of two equal keys, so a file could say one thing to strata and another
// to a different reader. parse_untrusted_json therefore checks the text first, with SAX events
// (no DOM, no recursion): nesting at most max_depth levels, no key twice in one object. Only then
// is the DOM built. The json_* helpers read one field and check its type and range, naming it.
#pragma once
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "strata/core/error.hpp"

namespace strata {

// strata's own files nest 4 levels at most; hand-written model descriptions a few more.
inline constexpr int untrusted_json_max_depth = 16;

namespace detail {

// SAX handler that only checks: depth and duplicate keys. `what` names the text in messages.
class untrusted_json_checker {
 public:
  using json = nlohmann::json;
  untrusted_json_checker(const std::string& what, int max_depth) : what_(what), max_depth_(max_depth) {}

  bool null() { return value(); }
  bool boolean(bool) { return value(); }
  bool number_integer(json::number_integer_t) { return value(); }
  bool number_unsigned(json::number_unsigned_t) { return value(); }
  bool number_float(json::number_float_t, const json::string_t&) { return value(); }
  bool string(json::string_t&) { return value(); }
  bool binary(json::binary_t&) { return value(); }
  bool start_object(std::size_t) { return open(true); }
  bool start_array(std::size_t) { return open(false); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool key(json::string_t& k) {
    auto& seen = levels_.back().keys;
    STRATA_CHECK(seen.insert(k).second, what_, " has the key '", k, "' twice in the object at ",
                 place(levels_.size() - 1), " (which one counts would depend on the reader)");
    levels_.back().key = k;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) {
    fail(what_, " is not valid JSON: ", e.what());
  }

 private:
  struct level {
    bool object = false;
    std::set<std::string> keys;
    std::string key;        // the latest key of an object
    std::size_t items = 0;  // of an array
  };
  bool value() {
    if (!levels_.empty() && !levels_.back().object) ++levels_.back().items;
    return true;
  }
  bool open(bool object) {
    value();
    STRATA_CHECK(int(levels_.size()) < max_depth_, what_, " nests deeper than ", max_depth_, " levels (at ",
                 place(levels_.size()), ")");
    levels_.push_back({object, {}, {}, 0});
    return true;
  }
  bool close() {
    levels_.pop_back();
    return true;
  }
  // Where the value now being read sits within the first `levels` levels, as a path of keys and
  // array indices: 'a' > [3] > 'b', or "the top level".
  std::string place(std::size_t levels) const {
    std::string out;
    for (std::size_t i = 0; i < levels; ++i) {
      const auto& l = levels_[i];
      if (!out.empty()) out += " > ";
      if (l.object) {
        out += '\'';
        out += l.key;
        out += '\'';
      } else {
        out += '[';
        out += std::to_string(l.items == 0 ? 0 : l.items - 1);
        out += ']';
      }
    }
    return out.empty() ? "the top level" : out;
  }

  const std::string& what_;
  int max_depth_;
  std::vector<level> levels_;
};

}  // namespace detail

// The JSON in [first, last), after checking it nests at most max_depth levels and repeats no key
// within an object; otherwise a strata::error starting with `what` ("safetensors: 'f': the
// header", ...).
template <class It>
nlohmann::json parse_untrusted_json(It first, It last, const std::string& what,
                                    int max_depth = untrusted_json_max_depth) {
  detail::untrusted_json_checker check(what, max_depth);
  try {
    nlohmann::json::sax_parse(first, last, &check);
    return nlohmann::json::parse(first, last);
  } catch (const nlohmann::json::exception& e) { fail(what, " is not valid JSON: ", e.what()); }
}
inline nlohmann::json parse_untrusted_json(const std::string& text, const std::string& what,
                                           int max_depth = untrusted_json_max_depth) {
  return parse_untrusted_json(text.begin(), text.end(), what, max_depth);
}

// A JSON value shown in a message: short, whatever it is (it nests max_depth levels at most).
inline std::string json_shown(const nlohmann::json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

// The integer `v`, which must be a JSON integer (not 2.5, not 1e3, not "2") in [lo, hi];
// otherwise an error naming `where` and `field`.
inline std::int64_t json_integer(const nlohmann::json& v, std::int64_t lo, std::int64_t hi, const std::string& where,
                                 const std::string& field) {
  bool ok = false;
  std::int64_t x = 0;
  if (v.is_number_unsigned()) {
    const auto u = v.get<std::uint64_t>();
    ok = u <= std::uint64_t(INT64_MAX);
    x = ok ? std::int64_t(u) : 0;
  } else if (v.is_number_integer()) {
    x = v.get<std::int64_t>();
    ok = true;
  }
  STRATA_CHECK(ok && x >= lo && x <= hi, where, ": field '", field, "' is ", json_shown(v),
               ", expected an integer in [", lo, ", ", hi, "]");
  return x;
}

// The member `field` of object `o`, which must be there.
inline const nlohmann::json& json_member(const nlohmann::json& o, const std::string& field, const std::string& where) {
  STRATA_CHECK(o.is_object(), where, " is ", json_shown(o), ", expected a JSON object");
  const auto it = o.find(field);
  STRATA_CHECK(it != o.end(), where, " has no field '", field, "'");
  return *it;
}

inline std::int64_t json_integer_field(const nlohmann::json& o, const std::string& field, std::int64_t lo,
                                       std::int64_t hi, const std::string& where) {
  return json_integer(json_member(o, field, where), lo, hi, where, field);
}

inline std::string json_string_field(const nlohmann::json& o, const std::string& field, const std::string& where) {
  const auto& v = json_member(o, field, where);
  STRATA_CHECK(v.is_string(), where, ": field '", field, "' is ", json_shown(v), ", expected a string");
  return v.get<std::string>();
}

// An array of integers in [lo, hi], at most max_size of them.
inline std::vector<std::int64_t> json_integer_array_field(const nlohmann::json& o, const std::string& field,
                                                          std::int64_t lo, std::int64_t hi, std::size_t max_size,
                                                          const std::string& where) {
  const auto& v = json_member(o, field, where);
  STRATA_CHECK(v.is_array() && v.size() <= max_size, where, ": field '", field, "' is ", json_shown(v),
               ", expected an array of at most ", max_size, " integers");
  std::vector<std::int64_t> out;
  for (std::size_t i = 0; i < v.size(); ++i)
    out.push_back(json_integer(v[i], lo, hi, where, field + "[" + std::to_string(i) + "]"));
  return out;
}

}  // namespace strata
