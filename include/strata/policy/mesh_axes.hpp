// strata/policy/mesh_axes.hpp - the axes of the process mesh, described once.
//
// A layout's ranks form a grid with one dimension per axis. Everything that depends on which
// axes exist - the rank order, the process groups and their names, the degrees a launch may
// give, which groups reduce gradients, the text of a layout in errors, metrics and checkpoints -
// reads this table, so a new axis is one row here plus the layers that use it.
//
// Rank order follows Megatron-LM: tp varies fastest (its all-reduces are the most frequent, so
// its ranks are neighbours on one node), then cp (its ring exchanges every layer, twice), then
// dp (one gradient reduction per step), then pp (point to point between stages):
//
//   rank = ((pp_rank · dp + dp_rank) · cp + cp_rank) · tp + tp_rank
//
// An axis across which every rank holds the same parameters (dp, cp) reduces their gradients:
// the gradient group is the product of those axes, and ZeRO shards over it. An axis that splits
// the parameters (tp) or the layers (pp) does not.
#pragma once
#include <array>
#include <cstddef>
#include <initializer_list>
#include <string_view>

namespace strata {

enum class mesh_axis : int { tp, cp, dp, pp };

struct mesh_axis_description {
  mesh_axis axis;
  std::string_view name;       // the group's name, the launch flag (--tp), metrics and checkpoint keys
  std::string_view meaning;    // for help texts and docs
  bool replicates_parameters;  // every rank along it holds the same parameters: reduce their gradients over it
  bool fills_world;            // left open at launch, it takes the ranks the other axes leave (dp)
  int written_at;              // its place in a layout's text, "dp=2 x cp=2 x tp=2 x pp=1": data first
  bool written_at_one;         // written even at degree 1 (cp appears only where it splits)
};

// In rank order: the first varies fastest.
inline constexpr std::array<mesh_axis_description, 4> mesh_axes{{
    {mesh_axis::tp, "tp", "tensor parallel: each layer's matrices split by heads and features", false, false, 2, true},
    {mesh_axis::cp, "cp", "context parallel: every sequence split into chunks", true, false, 1, false},
    {mesh_axis::dp, "dp", "data parallel: the batch split, the model replicated", true, true, 0, true},
    {mesh_axis::pp, "pp", "pipeline parallel: the layers split into stages", false, false, 3, true},
}};
inline constexpr std::size_t mesh_axis_count = mesh_axes.size();

constexpr std::size_t index_of(mesh_axis a) { return static_cast<std::size_t>(a); }
constexpr const mesh_axis_description& describe(mesh_axis a) { return mesh_axes[index_of(a)]; }
static_assert([] {
  int filling = 0;
  for (std::size_t i = 0; i < mesh_axis_count; ++i) {
    if (index_of(mesh_axes[i].axis) != i) return false;
    filling += mesh_axes[i].fills_world ? 1 : 0;
    int same_place = 0;  // every axis its own place in the text
    for (const auto& other : mesh_axes) same_place += other.written_at == mesh_axes[i].written_at ? 1 : 0;
    if (same_place != 1 || mesh_axes[i].written_at < 0 || mesh_axes[i].written_at >= int(mesh_axis_count)) return false;
  }
  return filling == 1;  // one axis takes what the others leave
}());

// A set of axes (a group spans the product of their degrees), as bits by axis.
class mesh_axis_set {
 public:
  constexpr mesh_axis_set() = default;
  constexpr mesh_axis_set(std::initializer_list<mesh_axis> axes) {
    for (mesh_axis a : axes) bits_ |= 1u << index_of(a);
  }
  constexpr bool contains(mesh_axis a) const { return (bits_ >> index_of(a)) & 1u; }
  constexpr bool operator==(const mesh_axis_set&) const = default;

  // The axes across which parameters are replicated: where gradients are reduced.
  static constexpr mesh_axis_set replicating() {
    mesh_axis_set s;
    for (const auto& d : mesh_axes)
      if (d.replicates_parameters) s.bits_ |= 1u << index_of(d.axis);
    return s;
  }

 private:
  unsigned bits_ = 0;
};

}  // namespace strata
