#include "core/call_check.hpp"

#include <cstdio>
#include <iterator>

namespace nexar::detail {

namespace {

constexpr unsigned kTypes = 10;  // DataType's values
constexpr unsigned kOps = 5;     // ReduceOp's values

}  // namespace

std::string describe_call(std::uint16_t check, int world) {
  const unsigned kind = check >> 10 & 0x1fu;
  const unsigned type = check >> 6 & 0xfu;
  const unsigned op = check >> 3 & 0x7u;
  if ((check & 0x8000u) == 0 || kind >= std::size(kCallNames) || type >= kTypes || op >= kOps) {
    char text[48];
    std::snprintf(text, sizeof text, "a call this build cannot read (check 0x%04x)", check);
    return text;
  }
  const CallName& c = kCallNames[kind];
  std::string s(c.name);
  s += '(';
  s += to_string(static_cast<DataType>(type));
  if (c.reduces) {
    s += ", ";
    s += to_string(static_cast<ReduceOp>(op));
  }
  if (call_rooted(kind)) {
    s += ", root ";
    s += std::to_string(check & 0x7u);
    if (world > kRootsExact) s += " mod 8";
  }
  s += ')';
  return s;
}

namespace {

// "ranks called different collectives as <which> of communicator 0x..: rank <r>", which
// every disagreement's words begin with.
std::string disagreement(std::string_view which, std::uint64_t comm, int r) {
  char id[24];
  std::snprintf(id, sizeof id, "0x%llx", static_cast<unsigned long long>(comm));
  return "ranks called different collectives as " + std::string(which) + " of communicator " + id + ": rank " +
         std::to_string(r);
}

}  // namespace

std::string calls_differ(std::string_view which, std::uint64_t comm, int me, std::uint16_t mine, int them,
                         std::uint16_t theirs, int world) {
  return disagreement(which, comm, me) + " called " + describe_call(mine, world) + " but rank " +
         std::to_string(them) + " called " + describe_call(theirs, world);
}

std::string sizes_differ(std::string_view which, std::uint64_t comm, int me, std::uint64_t expected, int them,
                         std::uint64_t sent) {
  return disagreement(which, comm, them) + " sent rank " + std::to_string(me) + " " + std::to_string(sent) +
         " bytes where rank " + std::to_string(me) + " expects " + std::to_string(expected) +
         " (they disagree on its count or element type)";
}

std::string call_unwanted(std::string_view which, std::uint64_t comm, int me, std::uint16_t mine, int them,
                          std::uint16_t theirs, int world) {
  if (mine != 0 && mine != theirs) return calls_differ(which, comm, me, mine, them, theirs, world);
  const std::string my_call = mine != 0 ? "'s " + describe_call(mine, world) : std::string("'s call");
  return disagreement(which, comm, them) + " sent rank " + std::to_string(me) + " a message of its " +
         describe_call(theirs, world) + " that rank " + std::to_string(me) + my_call +
         " completed without (they disagree on its root, counts or algorithm)";
}

}  // namespace nexar::detail
