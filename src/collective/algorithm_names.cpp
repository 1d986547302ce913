#include <nexar/collective.hpp>

namespace nexar {

const char* to_string(Algorithm a) noexcept {
  switch (a) {
    case Algorithm::automatic: return "automatic";
    case Algorithm::ring: return "ring";
    case Algorithm::halving_doubling: return "halving_doubling";
    case Algorithm::tree: return "tree";
    case Algorithm::linear: return "linear";
    case Algorithm::pairwise: return "pairwise";
    case Algorithm::dissemination: return "dissemination";
    case Algorithm::recursive_doubling: return "recursive_doubling";
    case Algorithm::hierarchical: return "hierarchical";
  }
  return "?";
}

}  // namespace nexar
