// Hygienic names in the inter- and intra-operator IR.
//
// Every name the compiler derives (gradients, SSA versions, inlined-function locals, lowering's
// temporaries) contains the sigil '$', which no user name can contain: the DSL lexer rejects it in spec
// programs (names and field strings alike) and the spec loader in declared names, while the printed IR
// keeps it, so printed IR parses back byte-identically. A user field `d_att` and the gradient `d$att` of a
// field `att` are then simply different names. The emitters (emit/names.h) spell '$' in each target
// language and resolve any collision there.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace hectorgen::inter {

inline constexpr char kSigil = '$';

// True for a name the compiler made (it contains the sigil).
bool is_derived_name(std::string_view name);

// `d$x`: the gradient of x (a field, an input, a weight or an output).
std::string grad_name(std::string_view x);
// x for `d$x`, else nullopt.
std::optional<std::string> grad_target(std::string_view name);

// `f$k`: version k of a field that is set more than once (the last version keeps the field's name).
std::string version_name(std::string_view field, int k);

// `prefix$base`: a name derived from another one (e.g. t$hs, lowering's tensor of the local hs).
std::string derived_name(std::string_view prefix, std::string_view base);

// `base` when `taken(base)` is false, else the first free one of base$2, base$3, ... (base_2, base_3, ...
// when base is derived already: t$hs_2).
std::string fresh_name(const std::string& base, const std::function<bool(const std::string&)>& taken);

// The name as an identifier of C-like languages: '$' spelled '_' ('__' before a digit: att$0 is att__0). Not
// injective on its own (d$att and a user's d_att meet): the emitters' name scopes resolve what collides.
std::string plain_spelling(std::string_view name);

// Why a tensor (an input, output or field, a local) cannot be named `name`, or "": src, dst, etype and ntype
// are attributes of edges and nodes (e.src, n.ntype), and the backward program reads tensors as attributes.
std::string attribute_name_reason(std::string_view name);

// Why a name written by the user (in the spec or its program) is reserved, or "" if it is not:
// names with the sigil belong to the compiler, names starting with "__" to the C++ and Python implementations.
std::string reserved_name_reason(std::string_view name);

}  // namespace hectorgen::inter
