#include "ir/inter/names.h"

#include <fmt/format.h>

namespace hectorgen::inter {

bool is_derived_name(std::string_view name) { return name.find(kSigil) != std::string_view::npos; }

std::string grad_name(std::string_view x) { return fmt::format("d{}{}", kSigil, x); }

std::optional<std::string> grad_target(std::string_view name) {
  if (name.size() > 2 && name[0] == 'd' && name[1] == kSigil) return std::string(name.substr(2));
  return std::nullopt;
}

std::string version_name(std::string_view field, int k) { return fmt::format("{}{}{}", field, kSigil, k); }

std::string derived_name(std::string_view prefix, std::string_view base) {
  return fmt::format("{}{}{}", prefix, kSigil, base);
}

std::string fresh_name(const std::string& base, const std::function<bool(const std::string&)>& taken) {
  // A derived base stays derived with any suffix; a user's name needs the sigil to leave the user's namespace.
  std::string sep = is_derived_name(base) ? "_" : std::string(1, kSigil);
  std::string name = base;
  for (int k = 2; taken(name); ++k) name = fmt::format("{}{}{}", base, sep, k);
  return name;
}

std::string plain_spelling(std::string_view name) {
  std::string out;
  for (size_t i = 0; i < name.size(); ++i) {
    if (name[i] != kSigil) {
      out += name[i];
      continue;
    }
    bool digit = i + 1 < name.size() && name[i + 1] >= '0' && name[i + 1] <= '9';
    out += digit ? "__" : "_";
  }
  return out;
}

std::string attribute_name_reason(std::string_view name) {
  if (name == "src" || name == "dst" || name == "etype" || name == "ntype")
    return "is an attribute of edges and nodes (e.src, e.dst, e.etype, n.ntype): a tensor of this name could not be read";
  return "";
}

std::string reserved_name_reason(std::string_view name) {
  if (is_derived_name(name))
    return fmt::format("is reserved ('{}' marks the names the compiler derives, such as gradients)", kSigil);
  if (name.rfind("__", 0) == 0) return "is reserved (names starting with '__' belong to the C++ and Python implementations)";
  return "";
}

}  // namespace hectorgen::inter
